"""The seam between eager code and the tracer (onemodel.tracing), kept in this package so that
tensors and training never import tracing.

While a trace runs, ``active`` is the tracer: eager dispatch hands it every op (it returns
``NotImplemented`` for ops on constants only, which then run eagerly), shape arguments become
graph values through :func:`shape_operand`, and code that has no graph form calls :func:`refuse`.
"""

from __future__ import annotations

import numpy as np

active = None  # the recording tracer, or None


def shape_operand(dims, of=None, *, sizes: bool = True):
    """An I64 tensor holding ``dims`` (ints, SymInts): a constant unless a trace needs a graph
    computation for symbolic dims. ``of`` is the tensor the shape applies to: plain ints are
    matched to symbolic axes (the spec's rule) only for traced tensors, and only when ``dims``
    are sizes (a Reshape target), not positions (Slice bounds)."""
    from .symbolic import SymInt
    from .tensor import Tensor

    if active is not None and (of is None or getattr(of, "_traced", False)
                               or any(isinstance(d, SymInt) for d in dims)):
        return active.shape_operand(dims, match=sizes)
    return Tensor._wrap(np.asarray([int(d) for d in dims], dtype=np.int64))


def refuse(operation: str, reason: str, hint: str = "") -> None:
    """Raise the tracer's TraceError when tracing is active; do nothing otherwise."""
    if active is not None:
        active.refuse(operation, reason, hint)


def is_traced(value) -> bool:
    return getattr(value, "_traced", False)
