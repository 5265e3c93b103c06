"""Reductions over axes (ONNX opset 18 form: ``axes`` is an optional input) and ArgMax/ArgMin."""

from __future__ import annotations

import math

import numpy as np

from ..dtype import NUMERIC, DType
from ..errors import ShapeError
from .adapters import ImportNode, attribute_to_input, onnx_adapter
from .base import TensorSpec, const_ints, defop, norm_axis, same_dtype
from .specialize import CallSite, specializer


def _axes(data: np.ndarray, axes, noop_with_empty_axes: int):
    if axes is None or len(axes) == 0:
        return () if noop_with_empty_axes else None
    nd = data.ndim
    return tuple(a % nd for a in axes.tolist())


def _reduce_shape(specs, *, keepdims=1, noop_with_empty_axes=0):
    x = specs[0]
    same_dtype(specs[:1], NUMERIC | {DType.BOOL})
    axes = const_ints(specs[1] if len(specs) > 1 else None, "reduction axes")
    nd = len(x.shape)
    if not axes:
        if noop_with_empty_axes:
            return TensorSpec(x.shape, x.dtype)
        red = set(range(nd))
    else:
        red = {norm_axis(int(a), nd) for a in axes}
    if keepdims:
        shape = tuple(1 if i in red else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in red)
    return TensorSpec(shape, x.dtype)


def _reduced_axes(ctx):
    x = ctx.inputs[0]
    axes = ctx.inputs[1] if len(ctx.inputs) > 1 else None
    if axes is None or axes.size == 0:
        return () if ctx.attrs["noop_with_empty_axes"] else tuple(range(x.ndim))
    return tuple(sorted(int(a) % x.ndim for a in axes.numpy().reshape(-1)))


def _expand_back(ctx, g):
    """The output gradient reshaped with the reduced axes kept, broadcastable to the input."""
    axes = _reduced_axes(ctx)
    if not ctx.attrs["keepdims"] and axes:
        g = g.reshape(*[1 if i in axes else d for i, d in enumerate(ctx.inputs[0].shape)])
    return g, axes


def _sum_grad(ctx, g):
    g, _ = _expand_back(ctx, g)
    return g.expand(*ctx.inputs[0].shape), None


def _axes_attribute(node: ImportNode) -> None:
    """Before opset 18 (13 for ReduceSum) ``axes`` was an attribute; registered for every
    Reduce* op of this module."""
    attribute_to_input(node, "axes", 1)


onnx_adapter("ReduceSum", before=13)(_axes_attribute)
onnx_adapter("ReduceMean", "ReduceMax", "ReduceMin", before=18)(_axes_attribute)


@defop("ReduceSum", shape=_reduce_shape, grad=_sum_grad, static=("axes",))
def reduce_sum(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    ax = _axes(data, axes, noop_with_empty_axes)
    if ax == ():
        return data.copy()
    return np.sum(data, axis=ax, keepdims=bool(keepdims), dtype=data.dtype)


def _mean_grad(ctx, g):
    g, axes = _expand_back(ctx, g)
    x = ctx.inputs[0]
    count = 1
    for a in axes:
        count *= x.shape[a]
    return g.expand(*x.shape) / count, None


# the largest count each dtype holds exactly
_EXACT_COUNT = {np.dtype(np.float32): 2**24, np.dtype(np.float64): 2**53}


@defop("ReduceMean", shape=_reduce_shape, grad=_mean_grad, static=("axes",))
def reduce_mean(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    ax = _axes(data, axes, noop_with_empty_axes)
    if ax == ():
        return data.copy()
    count = 1
    for a in range(data.ndim) if ax is None else ax:
        count *= data.shape[a]
    if count == 0:  # np.mean's NaN (and its warning)
        return np.mean(data, axis=ax, keepdims=bool(keepdims)).astype(data.dtype, copy=False)
    # np.mean's own steps (numpy/_core/_methods.py _mean), without its Python-level overhead:
    # integers and bool summed in float64, float16 in float32, then divided by the count
    half = data.dtype == np.float16
    dtype = np.float64 if issubclass(data.dtype.type, (np.integer, np.bool_)) else (
        np.float32 if half else None)
    total = np.add.reduce(data, axis=ax, dtype=dtype, keepdims=bool(keepdims))
    n = np.intp(count)
    if isinstance(total, np.ndarray):
        if count <= _EXACT_COUNT.get(total.dtype, 0):
            # the count exact in the sum's type: its own division (~1 us less than numpy's
            # float64 one), the same number (a float64 quotient rounded to float32 is the
            # correctly rounded float32 quotient: 53 >= 2 * 24 + 2 bits)
            mean = np.true_divide(total, total.dtype.type(count), out=total)
        else:
            mean = np.true_divide(total, n, out=total, casting="unsafe")
    else:
        mean = (data.dtype.type if half else total.dtype.type)(total / n)
    return mean.astype(data.dtype, copy=False)


@specializer(reduce_mean.kernel)
def _reduce_mean_at(site: CallSite):
    """float32/float64 over constant axes, the count exact in the dtype and the result an
    array: the sum and its in-place division, as the generic kernel does, axes and count
    worked out once."""
    src, dtype, generic = site.shapes[0], site.dtypes[0], site.generic
    axes = site.values[1] if len(site.values) > 1 else None
    if dtype not in _EXACT_COUNT or (len(site.shapes) > 1 and site.shapes[1] is not None
                                     and axes is None):
        return None
    empty_noop = site.attrs.get("noop_with_empty_axes", 0)
    if axes is None or axes.size == 0:
        if empty_noop:
            return None
        ax = tuple(range(len(src)))
    else:
        listed = [int(a) % len(src) for a in axes.reshape(-1).tolist()]
        ax = tuple(sorted(set(listed)))
        if len(ax) != len(listed):
            return None  # a repeated axis: the generic kernel's error names it
    count = math.prod(src[a] for a in ax)
    keep = bool(site.attrs.get("keepdims", 1))
    if not 0 < count <= _EXACT_COUNT[dtype] or (not keep and len(ax) == len(src)):
        return None
    divisor = dtype.type(count)

    def mean(data, *rest):
        if data.shape != src or data.dtype != dtype:
            return generic(data, *rest)
        total = np.add.reduce(data, axis=ax, keepdims=keep)
        return np.true_divide(total, divisor, out=total)
    return mean


def _extreme_grad(ctx, g):
    """The gradient goes to every element equal to the extreme, split evenly among ties."""
    x = ctx.inputs[0]
    y, axes = _expand_back(ctx, ctx.outputs[0])
    g, _ = _expand_back(ctx, g)
    hit = (x == y).cast(x.dtype)
    count = hit.sum(axis=axes, keepdims=True)
    return hit * (g / count), None


@defop("ReduceMax", shape=_reduce_shape, grad=_extreme_grad, static=("axes",))
def reduce_max(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    ax = _axes(data, axes, noop_with_empty_axes)
    if ax == ():
        return data.copy()
    return np.max(data, axis=ax, keepdims=bool(keepdims), initial=_lowest(data.dtype))


@defop("ReduceMin", shape=_reduce_shape, grad=_extreme_grad, static=("axes",))
def reduce_min(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    ax = _axes(data, axes, noop_with_empty_axes)
    if ax == ():
        return data.copy()
    return np.min(data, axis=ax, keepdims=bool(keepdims), initial=_highest(data.dtype))


def _lowest(dtype):
    """The identity of max: an empty reduction gives it (ONNX)."""
    if dtype.kind == "f":
        return -np.inf
    return False if dtype.kind == "b" else np.iinfo(dtype).min


def _highest(dtype):
    if dtype.kind == "f":
        return np.inf
    return True if dtype.kind == "b" else np.iinfo(dtype).max


def _arg_shape(specs, *, axis=0, keepdims=1, select_last_index=0):
    x = specs[0]
    a = norm_axis(axis, len(x.shape))
    if keepdims:
        shape = tuple(1 if i == a else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i != a)
    return TensorSpec(shape, DType.I64)


def _arg(fn, data, axis, keepdims, select_last_index):
    if data.shape[axis] == 0:  # no element to pick: only an empty result has an answer
        shape = list(data.shape)
        shape[axis] = 1
        if np.prod(shape) != 0:
            name = "ArgMax" if fn is np.argmax else "ArgMin"
            raise ShapeError(f"{name} over axis {axis} of size 0 has no index to give "
                             f"(input shape {list(data.shape)})")
        out = np.zeros(shape, np.int64)
        return out if keepdims else np.squeeze(out, axis)
    if select_last_index:
        flipped = np.flip(data, axis=axis)
        out = data.shape[axis] - 1 - fn(flipped, axis=axis)
    else:
        out = fn(data, axis=axis)
    out = out.astype(np.int64)
    return np.expand_dims(out, axis) if keepdims else out


@defop("ArgMax", shape=_arg_shape)
def arg_max(data, *, axis=0, keepdims=1, select_last_index=0):
    return _arg(np.argmax, data, axis, keepdims, select_last_index)


@defop("ArgMin", shape=_arg_shape)
def arg_min(data, *, axis=0, keepdims=1, select_last_index=0):
    return _arg(np.argmin, data, axis, keepdims, select_last_index)



def _reduction(name: str, fn, doc: str):
    """A Reduce* op of opset 18's form whose kernel is ``fn(data, axes, keepdims)``."""

    def kernel(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        ax = _axes(data, axes, noop_with_empty_axes)
        if ax == ():
            return fn(data, None, True, noop=True)
        return fn(data, ax, bool(keepdims), noop=False)

    kernel.__name__ = name.lower()
    kernel.__doc__ = doc
    onnx_adapter(name, before=18)(_axes_attribute)
    return defop(name, shape=_reduce_shape, static=("axes",))(kernel)


def _l1(d, ax, keep, noop):
    return np.abs(d) if noop else np.sum(np.abs(d), axis=ax, keepdims=keep).astype(d.dtype)


def _l2(d, ax, keep, noop):
    if noop:
        return np.abs(d)
    return np.sqrt(np.sum(np.square(d.astype(np.float64)), axis=ax, keepdims=keep)).astype(d.dtype)


def _log_sum(d, ax, keep, noop):
    return np.log(d) if noop else np.log(np.sum(d, axis=ax, keepdims=keep)).astype(d.dtype)


def _log_sum_exp(d, ax, keep, noop):
    if noop:
        return d.copy()
    x = d.astype(np.float64)
    top = np.max(x, axis=ax, keepdims=True, initial=-np.inf)
    top = np.where(np.isfinite(top), top, 0)
    out = np.log(np.sum(np.exp(x - top), axis=ax, keepdims=True)) + top
    return (out if keep else np.squeeze(out, axis=ax)).astype(d.dtype)


def _prod(d, ax, keep, noop):
    return d.copy() if noop else np.prod(d, axis=ax, keepdims=keep).astype(d.dtype)


def _sum_square(d, ax, keep, noop):
    return np.square(d) if noop else np.sum(np.square(d), axis=ax, keepdims=keep).astype(d.dtype)


_reduction("ReduceL1", _l1, "Sum of absolute values over axes.")
_reduction("ReduceL2", _l2, "Euclidean norm over axes.")
_reduction("ReduceLogSum", _log_sum, "log of the sum over axes.")
_reduction("ReduceLogSumExp", _log_sum_exp, "log of the sum of exponentials over axes, stably.")
_reduction("ReduceProd", _prod, "Product over axes.")
_reduction("ReduceSumSquare", _sum_square, "Sum of squares over axes.")
