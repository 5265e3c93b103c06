"""More elementwise ops with ONNX semantics: trigonometry, rounding, parameterized activations,
variadic Max/Min/Mean, Mod, bitwise and logical ops, IsInf/IsNaN and CastLike. Inference ops:
the training API does not use them, so they carry no gradient rule."""

from __future__ import annotations

import numpy as np

from ..dtype import FLOATING, INTEGER, NUMERIC, DType
from ..errors import DTypeError
from .base import TensorSpec, broadcast_shapes, defop, same_dtype


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


@defop("LeakyRelu", shape=_act_shape)
def leaky_relu(X, *, alpha=0.01):
    return np.where(X >= 0, X, X * X.dtype.type(alpha))


@defop("Elu", shape=_act_shape)
def elu(X, *, alpha=1.0):
    return np.where(X > 0, X, X.dtype.type(alpha) * np.expm1(np.minimum(X, 0)))


@defop("Celu", shape=_act_shape)
def celu(X, *, alpha=1.0):
    a = X.dtype.type(alpha)
    return (np.maximum(X, 0) + np.minimum(0, a * np.expm1(np.minimum(X, 0) / a))).astype(X.dtype)


@defop("Selu", shape=_act_shape)
def selu(X, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    a, g = X.dtype.type(alpha), X.dtype.type(gamma)
    return np.where(X > 0, g * X, g * (a * np.expm1(np.minimum(X, 0)))).astype(X.dtype)


@defop("ThresholdedRelu", shape=_act_shape)
def thresholded_relu(X, *, alpha=1.0):
    return np.where(alpha < X, X, 0).astype(X.dtype)


@defop("HardSigmoid", shape=_act_shape)
def hard_sigmoid(X, *, alpha=0.2, beta=0.5):
    return np.clip(X * X.dtype.type(alpha) + X.dtype.type(beta), 0, 1).astype(X.dtype)


@defop("HardSwish", shape=_act_shape)
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


@defop("Mod", shape=_binary_shape)
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


def _cast_like_shape(specs, *, saturate=1):
    if specs[1] is None:
        raise DTypeError("CastLike needs target_type")
    return TensorSpec(specs[0].shape, specs[1].dtype)


@defop("CastLike", shape=_cast_like_shape)
def cast_like(input, target_type, *, saturate=1):
    """Cast ``input`` to the element type of ``target_type``."""
    return input.astype(target_type.dtype)
