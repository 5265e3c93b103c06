"""More elementwise ops with ONNX semantics: trigonometry, rounding, parameterized activations,
variadic Max/Min/Mean, Mod, bitwise and logical ops, IsInf/IsNaN and CastLike. Inference ops:
the training API does not use them, so they carry no gradient rule."""

from __future__ import annotations

import numpy as np

from .. import symbolic as sym
from ..dtype import FLOATING, INTEGER, NUMERIC, DType
from ..errors import DTypeError, ShapeError
from ._grad import call
from .base import TensorSpec, broadcast_shapes, defop, same_dtype
from .elementwise import _arithmetic


def _float_unary(specs, **_):
    return TensorSpec(specs[0].shape, same_dtype(specs[:1], FLOATING))


def _num_unary(specs, **_):
    return TensorSpec(specs[0].shape, same_dtype(specs[:1], NUMERIC))


def _unary(name, fn, rule=_float_unary):
    def kernel(X):
        return fn(X).astype(X.dtype, copy=False)

    kernel.__name__ = name.lower()
    kernel.__doc__ = f"ONNX {name}."
    return defop(name, shape=rule)(kernel)


for _name, _fn in {"Sin": np.sin, "Cos": np.cos, "Tan": np.tan, "Asin": np.arcsin,
                   "Acos": np.arccos, "Atan": np.arctan, "Sinh": np.sinh, "Cosh": np.cosh,
                   "Asinh": np.arcsinh, "Acosh": np.arccosh, "Atanh": np.arctanh,
                   "Floor": np.floor, "Ceil": np.ceil, "Round": np.round,
                   "Softsign": lambda x: x / (1 + np.abs(x))}.items():
    _unary(_name, _fn)


def _act_shape(specs, **_):
    return TensorSpec(specs[0].shape, same_dtype(specs[:1], FLOATING))


@defop("LeakyRelu", chain_operands=1, shape=_act_shape)
def leaky_relu(X, *, alpha=0.01):
    return np.where(X >= 0, X, X * X.dtype.type(alpha))


@defop("Elu", shape=_act_shape)
def elu(X, *, alpha=1.0):
    return np.where(X > 0, X, X.dtype.type(alpha) * np.expm1(np.minimum(X, 0)))


def _celu_shape(specs, **_):
    return TensorSpec(specs[0].shape, same_dtype(specs[:1], FLOATING | {DType.BF16}))


@defop("Celu", shape=_celu_shape)
def celu(X, *, alpha=1.0):
    """BF16 is computed in float32 and rounded once."""
    if X.dtype == DType.BF16.numpy:
        return celu.kernel(X.astype(np.float32), alpha=alpha).astype(X.dtype)
    a = X.dtype.type(alpha)
    return (np.maximum(X, 0) + np.minimum(0, a * np.expm1(np.minimum(X, 0) / a))).astype(X.dtype)


@defop("Selu", shape=_act_shape)
def selu(X, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    a, g = X.dtype.type(alpha), X.dtype.type(gamma)
    return np.where(X > 0, g * X, g * (a * np.expm1(np.minimum(X, 0)))).astype(X.dtype)


@defop("ThresholdedRelu", shape=_act_shape)
def thresholded_relu(X, *, alpha=1.0):
    return np.where(alpha < X, X, 0).astype(X.dtype)


@defop("HardSigmoid", chain_operands=1, shape=_act_shape)
def hard_sigmoid(X, *, alpha=0.2, beta=0.5):
    return np.clip(X * X.dtype.type(alpha) + X.dtype.type(beta), 0, 1).astype(X.dtype)


@defop("HardSwish", chain_operands=1, shape=_act_shape)
def hard_swish(X):
    return (X * np.clip(X / X.dtype.type(6) + X.dtype.type(0.5), 0, 1)).astype(X.dtype)


@defop("Softplus", shape=_act_shape)
def softplus(X):
    return np.logaddexp(0, X).astype(X.dtype)


@defop("Mish", shape=_act_shape)
def mish(X):
    return (X * np.tanh(np.logaddexp(0, X))).astype(X.dtype)


def _prelu_shape(specs):
    x, slope = specs
    same_dtype(specs, NUMERIC)
    return TensorSpec(broadcast_shapes(x.shape, slope.shape), x.dtype)


@defop("PRelu", shape=_prelu_shape)
def prelu(X, slope):
    return np.where(X < 0, X * slope, X).astype(X.dtype)


@defop("Shrink", shape=_num_unary)
def shrink(input, *, bias=0.0, lambd=0.5):
    x = input
    out = np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))
    return out.astype(x.dtype)


def _variadic_shape(specs):
    return TensorSpec(broadcast_shapes(*[s.shape for s in specs]), same_dtype(specs, NUMERIC))


def _fold(ufunc, arrays):
    out = arrays[0]
    for d in arrays[1:]:
        out = ufunc(out, d)
    return np.array(out, copy=True)


@defop("Max", shape=_variadic_shape)
def max_(*data_0):
    return _fold(np.maximum, data_0)


@defop("Min", shape=_variadic_shape)
def min_(*data_0):
    return _fold(np.minimum, data_0)


@defop("Mean", shape=_variadic_shape)
def mean_(*data_0):
    out = data_0[0].astype(np.float64)
    for d in data_0[1:]:
        out = out + d
    return (out / len(data_0)).astype(data_0[0].dtype)


def _binary_shape(specs, **_):
    a, b = specs
    return TensorSpec(broadcast_shapes(a.shape, b.shape), same_dtype(specs, NUMERIC))


def _mod_value(in_specs, values, attrs):
    """Python's % on symbolic sizes (``fmod=0``), so ``n - n % k`` stays a known value."""
    if attrs.get("fmod", 0):
        return None
    return _arithmetic(sym.mod)(in_specs, values, attrs)


@defop("Mod", shape=_binary_shape, symbolic_value=_mod_value)
def mod(A, B, *, fmod=0):
    """``fmod=0``: the sign of the divisor (integers only, as Python's %); 1: C's fmod."""
    if fmod:
        return np.fmod(A, B)
    return np.mod(A, B)


def _int_binary_shape(specs, **_):
    a, b = specs
    return TensorSpec(broadcast_shapes(a.shape, b.shape), same_dtype(specs, INTEGER))


@defop("BitShift", shape=_int_binary_shape)
def bit_shift(X, Y, *, direction="LEFT"):
    return np.left_shift(X, Y) if direction == "LEFT" else np.right_shift(X, Y)


@defop("BitwiseAnd", shape=_int_binary_shape)
def bitwise_and(A, B):
    return np.bitwise_and(A, B)


@defop("BitwiseOr", shape=_int_binary_shape)
def bitwise_or(A, B):
    return np.bitwise_or(A, B)


@defop("BitwiseXor", shape=_int_binary_shape)
def bitwise_xor(A, B):
    return np.bitwise_xor(A, B)


@defop("BitwiseNot", shape=lambda specs: TensorSpec(specs[0].shape, same_dtype(specs, INTEGER)))
def bitwise_not(X):
    return np.invert(X)


def _xor_shape(specs):
    same_dtype(specs, {DType.BOOL})
    return TensorSpec(broadcast_shapes(specs[0].shape, specs[1].shape), DType.BOOL)


@defop("Xor", shape=_xor_shape)
def xor(A, B):
    return np.logical_xor(A, B)


def _is_shape(specs, **_):
    same_dtype(specs, FLOATING)
    return TensorSpec(specs[0].shape, DType.BOOL)


@defop("IsNaN", shape=_is_shape)
def is_nan(X):
    return np.isnan(X)


@defop("IsInf", shape=_is_shape)
def is_inf(X, *, detect_negative=1, detect_positive=1):
    out = np.zeros(X.shape, bool)
    if detect_negative:
        out |= np.isneginf(X)
    if detect_positive:
        out |= np.isposinf(X)
    return out


def _cast_like_shape(specs, *, saturate=1, round_mode="up"):
    if specs[1] is None:
        raise DTypeError("CastLike needs target_type")
    return TensorSpec(specs[0].shape, specs[1].dtype)


def _cast_like_opset(attrs) -> int:
    return 24 if "round_mode" in attrs else 19 if "saturate" in attrs else 15


@defop("CastLike", shape=_cast_like_shape, onnx_opset=_cast_like_opset)
def cast_like(input, target_type, *, saturate=1, round_mode="up"):
    """Cast ``input`` to the element type of ``target_type`` (Cast's rules)."""
    return DType.from_numpy(target_type.dtype).convert(input, bool(saturate), round_mode)


# CumProd, Det -------------------------------------------------------------------------------

def _cum_axis(x: np.ndarray, axis) -> int:
    a = np.asarray(axis)
    if a.size != 1 or a.dtype.kind not in "iu":
        raise ShapeError(f"the axis of a cumulative op must be one integer, got {a.dtype}"
                         f"{list(a.shape)}")
    a = int(a.reshape(-1)[0])
    if not -x.ndim <= a < x.ndim:
        raise ShapeError(f"axis {a} is out of range for rank {x.ndim}")
    return a % x.ndim


def _exclusive_shift(y: np.ndarray, a: int, fill) -> np.ndarray:
    """``y`` moved one step along axis ``a``, ``fill`` entering at the start."""
    out = np.empty_like(y)
    head = [slice(None)] * y.ndim
    head[a] = slice(0, 1)
    body, src = list(head), list(head)
    body[a], src[a] = slice(1, None), slice(0, -1)
    out[tuple(head)] = fill
    out[tuple(body)] = y[tuple(src)]
    return out


def _cum_shape(specs, *, exclusive=0, reverse=0):
    x, axis = specs
    same_dtype(specs[:1], NUMERIC)
    if axis.dtype not in (DType.I32, DType.I64) or len(axis.shape) > 1:
        raise DTypeError(f"axis must be an I32 or I64 scalar, got {axis}")
    return TensorSpec(x.shape, x.dtype)


def _cum_prod_grad(ctx, g):
    x, axis = ctx.inputs
    return call("CumProdGrad", x, axis, g, **ctx.attrs), None


@defop("CumProd", shape=_cum_shape, grad=_cum_prod_grad, onnx_opset=26)
def cum_prod(x, axis, *, exclusive=0, reverse=0):
    """ONNX CumProd (opset 26): running products along ``axis``; ``exclusive`` leaves each
    element out of its own product, ``reverse`` runs from the end."""
    a = _cum_axis(x, axis)
    y = np.flip(x, a) if reverse else x
    out = np.cumprod(y, axis=a, dtype=x.dtype)
    if exclusive and x.shape[a]:
        out = _exclusive_shift(out, a, 1)
    return np.flip(out, a) if reverse else out


@defop("CumProdGrad", traceable=False, shape=lambda specs, **a: TensorSpec(specs[0].shape, specs[0].dtype),
       domain="onemodel")
def cum_prod_grad(x, axis, dY, *, exclusive=0, reverse=0):
    """Gradient of CumProd without dividing by ``x`` (exact where it holds zeros): with
    e = the exclusive products, dx_i = e_i * R_i, where R_i = h_i + x_{i+1} R_{i+1} and h is dY
    (inclusive) or dY shifted one step back (exclusive)."""
    a = _cum_axis(x, axis)
    xs, gs = (np.flip(x, a), np.flip(dY, a)) if reverse else (x, dY)
    xs, gs = np.moveaxis(xs, a, 0), np.moveaxis(gs, a, 0)
    n = xs.shape[0]
    if n == 0:
        return np.zeros_like(x)
    before = _exclusive_shift(np.cumprod(xs, axis=0, dtype=x.dtype), 0, 1)
    h = np.zeros_like(gs)
    if exclusive:
        h[:-1] = gs[1:]
    else:
        h[:] = gs
    r = np.empty_like(gs)
    r[-1] = h[-1]
    for i in range(n - 2, -1, -1):
        r[i] = h[i] + xs[i + 1] * r[i + 1]
    out = np.moveaxis(before * r, 0, a)
    return np.ascontiguousarray(np.flip(out, a) if reverse else out)


def _det_shape(specs):
    x = specs[0]
    same_dtype(specs, FLOATING)
    if len(x.shape) < 2:
        raise ShapeError(f"Det needs square matrices [..., M, M], got rank {len(x.shape)}")
    m, n = x.shape[-2:]
    if isinstance(m, int) and isinstance(n, int) and m != n:
        raise ShapeError(f"Det needs square matrices, the last two axes are {m} and {n}")
    return TensorSpec(tuple(x.shape[:-2]), x.dtype)


@defop("Det", shape=_det_shape)
def det(X):
    """ONNX Det: the determinant of each square matrix in the last two axes."""
    if X.shape[-1] != X.shape[-2]:
        raise ShapeError(f"Det needs square matrices, got the last two axes {X.shape[-2:]}")
    work = X.astype(np.float64) if X.dtype == np.float16 else X
    return np.asarray(np.linalg.det(work), dtype=X.dtype)
