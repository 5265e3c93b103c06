"""Eager dispatch: run an op on Tensors with the best registered kernel and record its gradient.

Kernels are chosen once per (op, input dtypes) and kept in a plain dict; the registry's pluggy
machinery is never called here. The cache drops itself when plugins change.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from . import registry, trace_state
from .autograd import Node, grad_mode
from .dtype import DType
from .errors import OneModelError, ShapeError
from .ops.base import OPS, OpDef, TensorSpec
from .tensor import Tensor

DEVICE = "cpu"
# (op, dtype of each input) -> (OpDef, kernel)
_cache: dict[tuple, tuple[OpDef, Any]] = {}
registry.on_change(_cache.clear)
# Called with every result while a TensorScope is open (see scope.py); None otherwise.
_observer = None


def set_observer(callback) -> None:
    global _observer
    _observer = callback


def dispatch(op: str, inputs: Sequence[Tensor | None], attrs: dict[str, Any] | None = None):
    """Run ``op`` on ``inputs`` (``None`` for an omitted optional input) and return a Tensor, or a
    tuple of Tensors for an op with several outputs."""
    if trace_state.active is not None:
        traced = trace_state.active.record(op, inputs, attrs)
        if traced is not NotImplemented:
            return traced
    arrays = [None if t is None else t._data for t in inputs]
    key = (op, *[None if a is None else a.dtype for a in arrays])
    entry = _cache.get(key)
    if entry is None:
        entry = _select(op, inputs, attrs)
    opdef, kernel = entry
    if kernel.__class__ is _Chooser:
        kernel = kernel.choose(arrays, attrs)
    try:
        out = kernel(*arrays, **attrs) if attrs else kernel(*arrays)
    except (ValueError, IndexError, TypeError) as exc:
        raise _explain(opdef, inputs, attrs, exc) from None
    if out.__class__ is tuple or out.__class__ is list:
        result = tuple(Tensor._wrap(o) for o in out)
    else:
        result = Tensor._wrap(out)
    if grad_mode.enabled and opdef.grad is not None:
        for t in inputs:
            if t is not None and t.requires_grad:
                _record(opdef, tuple(inputs), attrs, result)
                break
    if _observer is not None:
        _observer(result)
    return result


def dispatch_binary(op: str, a: Tensor, b: Tensor):
    """:func:`dispatch` for the common two-input, no-attribute call (Python operators)."""
    if trace_state.active is not None:
        traced = trace_state.active.record(op, (a, b), None)
        if traced is not NotImplemented:
            return traced
    da, db = a._data, b._data
    entry = _cache.get((op, da.dtype, db.dtype))
    if entry is None:
        entry = _select(op, (a, b), None)
    opdef, kernel = entry
    if kernel.__class__ is _Chooser:
        kernel = kernel.choose((da, db), None)
    try:
        out = kernel(da, db)
    except (ValueError, IndexError, TypeError) as exc:
        raise _explain(opdef, (a, b), None, exc) from None
    t = Tensor._wrap(out)
    if (a.requires_grad or b.requires_grad) and grad_mode.enabled and opdef.grad is not None:
        _record(opdef, (a, b), None, t)
    if _observer is not None:
        _observer(t)
    return t


def _record(opdef: OpDef, inputs: tuple, attrs, result) -> None:
    outs = result if isinstance(result, tuple) else (result,)
    node = Node(opdef, inputs, opdef.full_attrs(attrs), outs)
    for i, o in enumerate(outs):
        o.requires_grad = True
        o._node = node
        o._index = i


def _select(op: str, inputs, attrs):
    opdef = OPS.get(op)
    if opdef is None:
        raise OneModelError(f"unknown op {op!r}")
    specs = [None if t is None else TensorSpec(tuple(t.shape), t.dtype) for t in inputs]
    # Checks dtypes (and these shapes) once per dtype signature; later shape errors are explained
    # when the kernel fails. Constant-valued inputs are not known here, so only dtype errors count.
    with contextlib.suppress(ShapeError):
        opdef.infer(specs, attrs)
    first = next((t for t in inputs if t is not None), None)
    dtype = first.dtype if first is not None else None
    recs = registry.get_registry().candidates(op, DEVICE, dtype)
    # a kernel without a supports check takes every call: choose once. Otherwise each call asks
    # registry.choose_kernel, the same function the planner uses.
    kernel = recs[0].function() if recs[0].supports is None else _Chooser(op, recs)
    entry = (opdef, kernel)
    _cache[(op, *[None if t is None else t._data.dtype for t in inputs])] = entry
    return entry


class _Chooser:
    """Kernels of which some may refuse a call: ask each in priority order."""

    def __init__(self, op: str, recs):
        self.op = op
        self.recs = recs

    def choose(self, arrays, attrs):
        return registry.choose_kernel(self.op, DEVICE, arrays, attrs, self.recs)


def _explain(opdef: OpDef, inputs, attrs, exc: Exception) -> Exception:
    specs = [None if t is None else TensorSpec(tuple(t.shape), t.dtype, _small_value(t))
             for t in inputs]
    try:
        opdef.infer(specs, attrs)
    except OneModelError as err:
        return err
    shapes = ", ".join("None" if s is None else str(s) for s in specs)
    return ShapeError(f"{opdef.name} failed on inputs {shapes}: {exc}")


def _small_value(t: Tensor):
    if t.dtype is DType.I64 and t.ndim <= 1 and t.numel() <= 16:
        return tuple(int(v) for v in t._data.reshape(-1))
    return None
