"""Symbolic values of small integer tensors: how a Reshape target computed from ``Shape(x)``
stays known (as ``(batch, -1)``) while a graph is validated, before any size is bound.
A value is kept flat, in row-major order, whatever the tensor's rank: the pads that Swin
exports compute as a (4, 2) table, sliced backwards and transposed, stay known that way.

Values built from constants are computed with the op's kernel; values holding symbols follow the
ops that declare how (``OpDef.symbolic_value``: the shape arithmetic of Shape, Gather, Slice,
Concat, the reshapes, Cast and Add/Sub/Mul/Div).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from onemodel.tensors import DimExpr, DType, OneModelError
from onemodel.tensors.errors import ShapeError
from onemodel.tensors.ops import OPS

_INT = (DType.I64, DType.I32, DType.BOOL)  # BOOL: Equal's mask that a Where then reads
_MAX = 64


def propagate(op: str, in_specs, attrs, out_specs):
    """``out_specs`` with ``value`` filled in where it can be derived."""
    if len(out_specs) != 1 or out_specs[0].dtype not in _INT or out_specs[0].value is not None:
        return out_specs
    out = out_specs[0]
    if not all(isinstance(d, int) for d in out.shape) or _size(out.shape) > _MAX:
        return out_specs
    vals = [None if s is None else s.value for s in in_specs]
    present = [v for s, v in zip(in_specs, vals) if s is not None]
    if not present or any(v is None for v in present):
        return out_specs
    if _has_symbols(present):
        # the ops' rules follow 1-D shape arithmetic; a value of more axes (a pad table
        # reshaped to (4, 2) and transposed) is followed only when it holds no symbol
        if len(out.shape) > 1 or any(s is not None and len(s.shape) > 1 for s in in_specs):
            return out_specs
        try:
            value = _symbolic(op, in_specs, vals, attrs)
        except (ArithmeticError, IndexError, KeyError, TypeError, ValueError):
            value = None  # a form this shortcut does not follow: the value stays unknown
    else:
        try:
            value = _concrete(op, in_specs, vals, attrs)
        except OneModelError:
            raise
        except Exception as exc:  # the kernel refuses these constants: so would the run
            raise ShapeError(f"{op} cannot compute its value from constant inputs "
                             f"{[list(v) for v in present]}: {type(exc).__name__}: {exc}") from None
    if value is None or len(value) > _MAX:
        return out_specs
    return [replace(out, value=tuple(value))]


def _size(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _has_symbols(values) -> bool:
    return any(isinstance(d, DimExpr) for v in values for d in v)


def _concrete(op, in_specs, vals, attrs):
    args = [None if s is None else np.asarray(v, s.dtype.numpy).reshape(s.shape)
            for s, v in zip(in_specs, vals)]
    out = OPS[op].kernel(*args, **(attrs or {}))
    if isinstance(out, tuple):
        return None
    return tuple(int(x) for x in np.asarray(out).reshape(-1))


def _symbolic(op, in_specs, vals, attrs):
    rule = OPS[op].symbolic_value
    return None if rule is None else rule(in_specs, vals, attrs or {})
