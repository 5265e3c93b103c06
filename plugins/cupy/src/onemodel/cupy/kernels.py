"""Elementwise, reduction, shape and matrix kernels, written once against the array namespace
of their inputs (``cupy`` on the ``"cuda"`` device, ``numpy`` in the CPU tests).

Each follows the ONNX semantics of the reference kernel of the same op
(``onemodel.tensors.ops``) and reuses its pure-Python parts (Reshape's target rule, Slice's
index clamping). Inputs an op reads as sizes (``OpDef.static_inputs``: axes, shapes, Slice
bounds) arrive as host numpy arrays; data inputs as device arrays.
"""

from __future__ import annotations

import math

import numpy as np

from onemodel.tensors.dtype import DType
from onemodel.tensors.ops.base import OPS
from onemodel.tensors.ops.shape import _slice_index, reshape_target

from ._xp import check_device_dtype, is_device_array, namespace, scalar

# arithmetic -------------------------------------------------------------------------------------


def add(A, B):
    return namespace(A, B).add(A, B)


def sub(A, B):
    return namespace(A, B).subtract(A, B)


def mul(A, B):
    return namespace(A, B).multiply(A, B)


def div(A, B):
    """Integer division truncates toward zero, as in ONNX."""
    xp = namespace(A, B)
    if A.dtype.kind in "iu":
        return xp.trunc(xp.true_divide(A, B)).astype(np.result_type(A.dtype, B.dtype))
    return xp.true_divide(A, B)


def pow_(X, Y):
    xp = namespace(X, Y)
    return xp.power(X, Y.astype(X.dtype) if X.dtype.kind == "f" else Y).astype(X.dtype,
                                                                                copy=False)


def sum_(*data):
    xp = namespace(*data)
    out = data[0]
    for d in data[1:]:
        out = xp.add(out, d)
    return out if len(data) > 1 else out.copy()


def max_(*data_0):
    xp = namespace(*data_0)
    out = data_0[0]
    for d in data_0[1:]:
        out = xp.maximum(out, d)
    return out.copy() if len(data_0) == 1 else out


def min_(*data_0):
    xp = namespace(*data_0)
    out = data_0[0]
    for d in data_0[1:]:
        out = xp.minimum(out, d)
    return out.copy() if len(data_0) == 1 else out


def neg(X):
    return namespace(X).negative(X)


def abs_(X):
    return namespace(X).abs(X)


def sign(X):
    return namespace(X).sign(X)


def reciprocal(X):
    return namespace(X).reciprocal(X)


def identity(input):
    return input.copy()


# math functions and activations -------------------------------------------------------------------

def exp(X):
    return namespace(X).exp(X)


def log(X):
    return namespace(X).log(X)


def sqrt(X):
    return namespace(X).sqrt(X)


def tanh(X):
    return namespace(X).tanh(X)


def erf(X):
    """cupyx.scipy.special.erf on the GPU; the reference's fdlibm erf on the host."""
    if is_device_array(X):
        from cupyx.scipy.special import erf as cupy_erf

        return cupy_erf(X).astype(X.dtype, copy=False)
    return OPS["Erf"].kernel(X)


def sigmoid(X):
    xp = namespace(X)
    e = xp.exp(-xp.abs(X))  # exp of a non-positive number only: no overflow
    one = scalar(1, X.dtype)
    return xp.where(X >= 0, one / (one + e), e / (one + e)).astype(X.dtype, copy=False)


def relu(X):
    return namespace(X).maximum(X, scalar(0, X.dtype))


def relu_grad(Y, dY):
    """Relu's gradient from its output: dY times the 0/1 mask of Y > 0, as the reference."""
    xp = namespace(Y, dY)
    positive = Y > scalar(0, Y.dtype)  # noqa: SIM300 (a comparison of arrays, not a Yoda)
    return xp.multiply(dY, positive.astype(dY.dtype))


def leaky_relu(X, *, alpha=0.01):
    xp = namespace(X)
    return xp.where(X >= 0, X, X * scalar(alpha, X.dtype))


def gelu(X, *, approximate="none"):
    """ONNX Gelu (opset 20): ``approximate`` is "none" (erf) or "tanh"."""
    xp = namespace(X)
    half, one = scalar(0.5, X.dtype), scalar(1, X.dtype)
    if approximate == "tanh":
        k = scalar(math.sqrt(2 / math.pi), X.dtype)
        c = scalar(0.044715, X.dtype)
        return (half * X * (one + xp.tanh(k * (X + c * X**3)))).astype(X.dtype, copy=False)
    if approximate != "none":
        raise ValueError(f"Gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    return (half * X * (one + erf(X / scalar(math.sqrt(2), X.dtype)))).astype(X.dtype)


def clip(input, min=None, max=None):
    xp = namespace(input)
    out = input
    if min is not None:
        out = xp.maximum(out, min)
    if max is not None:
        out = xp.minimum(out, max)
    return out if out is not input else input.copy()


# comparisons, logic, selection, conversion -----------------------------------------------------

def equal(A, B):
    return namespace(A, B).equal(A, B)


def less(A, B):
    return namespace(A, B).less(A, B)


def less_or_equal(A, B):
    return namespace(A, B).less_equal(A, B)


def greater(A, B):
    return namespace(A, B).greater(A, B)


def greater_or_equal(A, B):
    return namespace(A, B).greater_equal(A, B)


def not_(X):
    return namespace(X).logical_not(X)


def and_(A, B):
    return namespace(A, B).logical_and(A, B)


def or_(A, B):
    return namespace(A, B).logical_or(A, B)


def where(condition, X, Y):
    return namespace(condition, X, Y).where(condition, X, Y)


def cast(input, *, to=DType.F32, saturate=1, round_mode="up"):
    """ONNX Cast between the dtypes a CuPy array holds (an ``astype``: round to nearest even
    into floats, truncation toward zero into integers, as the reference). Other targets (the
    8-bit floats, bfloat16, the sub-byte integers) take the reference on the host."""
    target = DType.of(to)
    if not is_device_array(input):
        return OPS["Cast"].kernel(input, to=to, saturate=saturate, round_mode=round_mode)
    check_device_dtype(target.numpy, f"Cast to {target.name}")
    return input.astype(target.numpy)  # a copy even when the dtype is the same (as ONNX)


# reductions -------------------------------------------------------------------------------------

def _axes(data, axes, noop_with_empty_axes):
    if axes is None or len(axes) == 0:
        return () if noop_with_empty_axes else None
    nd = data.ndim
    return tuple(int(a) % nd for a in np.asarray(axes).reshape(-1).tolist())


def reduce_sum(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    ax = _axes(data, axes, noop_with_empty_axes)
    if ax == ():
        return data.copy()
    return namespace(data).sum(data, axis=ax, keepdims=bool(keepdims), dtype=data.dtype)


def reduce_mean(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    ax = _axes(data, axes, noop_with_empty_axes)
    if ax == ():
        return data.copy()
    return namespace(data).mean(data, axis=ax, keepdims=bool(keepdims)).astype(data.dtype,
                                                                               copy=False)


def _extreme(data, axes, keepdims, noop, fn, identity):
    xp = namespace(data)
    ax = _axes(data, axes, noop)
    if ax == ():
        return data.copy()
    red = range(data.ndim) if ax is None else ax
    if any(data.shape[a] == 0 for a in red):  # an empty reduction gives the identity (ONNX)
        if keepdims:
            shape = tuple(1 if i in red else d for i, d in enumerate(data.shape))
        else:
            shape = tuple(d for i, d in enumerate(data.shape) if i not in red)
        return xp.full(shape, identity(data.dtype), data.dtype)
    return getattr(xp, fn)(data, axis=ax, keepdims=bool(keepdims))


def _lowest(dtype):
    if dtype.kind == "f":
        return -np.inf
    return False if dtype.kind == "b" else np.iinfo(dtype).min


def _highest(dtype):
    if dtype.kind == "f":
        return np.inf
    return True if dtype.kind == "b" else np.iinfo(dtype).max


def reduce_max(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _extreme(data, axes, keepdims, noop_with_empty_axes, "max", _lowest)


def reduce_min(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _extreme(data, axes, keepdims, noop_with_empty_axes, "min", _highest)


def _arg(fn, data, axis, keepdims, select_last_index):
    xp = namespace(data)
    axis = axis % data.ndim
    if select_last_index:
        out = data.shape[axis] - 1 - getattr(xp, fn)(xp.flip(data, axis=axis), axis=axis)
    else:
        out = getattr(xp, fn)(data, axis=axis)
    out = out.astype(np.int64)
    return xp.expand_dims(out, axis) if keepdims else out


def arg_max(data, *, axis=0, keepdims=1, select_last_index=0):
    return _arg("argmax", data, axis, keepdims, select_last_index)


def arg_min(data, *, axis=0, keepdims=1, select_last_index=0):
    return _arg("argmin", data, axis, keepdims, select_last_index)


# shape ops --------------------------------------------------------------------------------------

def reshape(data, shape, *, allowzero=0):
    target = tuple(np.asarray(shape).reshape(-1).tolist())
    if allowzero or 0 not in target:
        return data.reshape(target)  # numpy's rule is ONNX's here (one -1 inferred)
    return data.reshape(tuple(reshape_target(data.shape, target, allowzero)))


def flatten(input, *, axis=1):
    a = axis % input.ndim if input.ndim and axis < 0 else axis
    return input.reshape(math.prod(input.shape[:a]), math.prod(input.shape[a:]))


def transpose(data, *, perm=None):
    p = tuple(reversed(range(data.ndim))) if perm is None else tuple(int(i) for i in perm)
    return namespace(data).transpose(data, p)


def squeeze(data, axes=None):
    if axes is None:
        return data.reshape(tuple(d for d in data.shape if d != 1))
    drop = {int(a) % data.ndim for a in np.asarray(axes).reshape(-1).tolist()}
    for a in drop:
        if data.shape[a] != 1:
            raise ValueError(f"cannot squeeze axis {a} of size {data.shape[a]}")
    return data.reshape(tuple(d for i, d in enumerate(data.shape) if i not in drop))


def unsqueeze(data, axes):
    axes = np.asarray(axes).reshape(-1).tolist()
    nd = data.ndim + len(axes)
    pos = sorted(int(a) % nd for a in axes)
    shape = list(data.shape)
    for a in pos:
        shape.insert(a, 1)
    return data.reshape(tuple(shape))


def expand(input, shape):
    out = np.broadcast_shapes(input.shape, tuple(int(s) for s in np.asarray(shape).reshape(-1)))
    return namespace(input).broadcast_to(input, out)


def concat(*inputs, axis=0):
    return namespace(*inputs).concatenate(inputs, axis=axis)


def slice_(data, starts, ends, axes=None, steps=None):
    return data[_slice_index(data.shape, np.asarray(starts).tolist(), np.asarray(ends).tolist(),
                             None if axes is None else np.asarray(axes).tolist(),
                             None if steps is None else np.asarray(steps).tolist())]


def gather(data, indices, *, axis=0):
    """ONNX Gather. CuPy's ``take`` wraps indices that are out of range instead of refusing
    them, so they are checked first (one reduction and a host read of its flag)."""
    xp = namespace(data, indices)
    a = axis % data.ndim
    dim = data.shape[a]
    if indices.size and bool(((indices < -dim) | (indices >= dim)).any()):
        raise IndexError(f"Gather indices out of range for axis {a} of size {dim}")
    idx = xp.where(indices < 0, indices + dim, indices)
    return xp.take(data, idx, axis=a)


def shape(data, *, start=0, end=None):
    """The shape as an I64 array on the data's device."""
    dims = np.asarray(data.shape[slice(start, end)], dtype=np.int64)
    return namespace(data).asarray(dims)


# matrix products (cuBLAS on the GPU) ---------------------------------------------------------

def matmul(A, B):
    return namespace(A, B).matmul(A, B)


def gemm(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    xp = namespace(A, B)
    a = A.T if transA else A
    b = B.T if transB else B
    y = xp.matmul(a, b)
    if alpha != 1.0:
        y *= scalar(alpha, y.dtype)
    if C is not None:
        y += C * scalar(beta, y.dtype) if beta != 1.0 else C
    return y
