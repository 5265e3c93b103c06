"""onemodel.tracing: trace a trained network's inference forward pass into a static graph."""

from __future__ import annotations

from onemodel.tensors import Tensor

from .errors import TraceError, TraceWarning
from .model import CheckReport, TracedModel
from .tracer import Tracer

__version__ = "0.1.0"


def trace_module(module, example: Tensor, *axis_names: str | None,
                 verify: bool = True) -> TracedModel:
    """``module.trace(example, "batch", None)``: one name or None per axis of ``example``; the
    graph's input is named ``input`` and its output ``output``. ``verify``: see
    :meth:`Tracer.trace` (the second trace that catches size-dependent control flow)."""
    if len(axis_names) == 1 and isinstance(axis_names[0], (tuple, list)):
        axis_names = tuple(axis_names[0])
    if not axis_names:
        axis_names = (None,) * example.ndim
    return Tracer(module).trace({"input": example}, axes={"input": axis_names},
                                output_names=["output"], verify=verify)


__all__ = ["CheckReport", "TraceError", "TraceWarning", "TracedModel", "Tracer", "trace_module"]
