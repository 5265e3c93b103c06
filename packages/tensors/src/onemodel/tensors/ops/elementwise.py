"""Elementwise ops: arithmetic, math functions, activations, comparisons, logic, Where and Cast."""

from __future__ import annotations

import math

import numpy as np

from .. import symbolic as sym
from ..dtype import FLOATING, NUMERIC, DType
from ..errors import DTypeError, ShapeError
from . import _special
from ._grad import call, unbroadcast
from .adapters import ImportNode, onnx_adapter
from .base import TensorSpec, broadcast_shapes, defop, first_value, same_dtype

# shape rules ---------------------------------------------------------------------------------

def _arithmetic(fn):
    """``symbolic_value`` of Add/Sub/Mul/Div on 1-D values (one side may hold one element)."""

    def value(in_specs, values, attrs):
        a, b = values
        if len(a) != len(b):
            if len(a) == 1:
                a = a * len(b)
            elif len(b) == 1:
                b = b * len(a)
            else:
                return None
        return tuple(fn(x, y) for x, y in zip(a, b))

    return value


def _binary(specs, allowed=NUMERIC):
    a, b = specs
    return TensorSpec(broadcast_shapes(a.shape, b.shape), same_dtype(specs, allowed))


def _binary_float(specs):
    return _binary(specs, FLOATING)


def _compare(specs):
    same_dtype(specs)
    return TensorSpec(broadcast_shapes(specs[0].shape, specs[1].shape), DType.BOOL)


def _logic(specs):
    same_dtype(specs, {DType.BOOL})
    return TensorSpec(broadcast_shapes(*[s.shape for s in specs]), DType.BOOL)


def _unary(specs, **_):
    return TensorSpec(specs[0].shape, same_dtype(specs[:1], NUMERIC))


def _unary_float(specs, **_):
    return TensorSpec(specs[0].shape, same_dtype(specs[:1], FLOATING))


# arithmetic ----------------------------------------------------------------------------------

def _add_grad(ctx, g):
    a, b = ctx.inputs
    return unbroadcast(g, a.shape), unbroadcast(g, b.shape)


@defop("Add", chain_operands=2, symbolic_value=_arithmetic(sym.add), shape=_binary, grad=_add_grad)
def add(A, B):
    return np.add(A, B)


def _sum_shape(specs):
    return TensorSpec(broadcast_shapes(*[s.shape for s in specs]), same_dtype(specs, NUMERIC))


@defop("Sum", shape=_sum_shape,
       grad=lambda ctx, g: tuple(unbroadcast(g, t.shape) for t in ctx.inputs))
def sum_(*data):
    """Elementwise sum of any number of inputs, with broadcasting."""
    out = data[0]
    for d in data[1:]:
        out = np.add(out, d)
    return out if len(data) > 1 else out.copy()


def _sub_grad(ctx, g):
    a, b = ctx.inputs
    return unbroadcast(g, a.shape), unbroadcast(-g, b.shape)


@defop("Sub", chain_operands=2,
       symbolic_value=_arithmetic(lambda x, y: sym.add(x, sym.mul(y, -1))), shape=_binary, grad=_sub_grad)
def sub(A, B):
    return np.subtract(A, B)


def _mul_grad(ctx, g):
    a, b = ctx.inputs
    return unbroadcast(g * b, a.shape), unbroadcast(g * a, b.shape)


@defop("Mul", chain_operands=2, symbolic_value=_arithmetic(sym.mul), shape=_binary, grad=_mul_grad)
def mul(A, B):
    return np.multiply(A, B)


def _div_grad(ctx, g):
    a, b = ctx.inputs
    ga = g / b
    return unbroadcast(ga, a.shape), unbroadcast(-ga * ctx.outputs[0], b.shape)


@defop("Div", chain_operands=2, symbolic_value=_arithmetic(sym.floordiv), shape=_binary, grad=_div_grad)
def div(A, B):
    """Integer division truncates toward zero, as in ONNX."""
    if A.dtype.kind in "iu":
        q = np.trunc(np.true_divide(A, B))
        return q.astype(np.result_type(A, B))
    return np.true_divide(A, B)


def _pow_grad(ctx, g):
    x, y = ctx.inputs
    z = ctx.outputs[0]
    gx = g * y * x ** (y - 1)
    # d/dy x**y = x**y * log(x); defined as 0 where x == 0 (PyTorch's convention)
    safe = x.where(x > 0, 1.0)
    gy = (g * z * safe.log()).where(x > 0, 0.0)
    return unbroadcast(gx, x.shape), unbroadcast(gy, y.shape)


def _pow_shape(specs):
    x, y = specs
    if x.dtype not in NUMERIC or y.dtype not in NUMERIC:
        raise DTypeError("Pow needs numeric inputs")
    return TensorSpec(broadcast_shapes(x.shape, y.shape), x.dtype)


# in an elementwise chain the exponent is a constant (a literal of the program)
@defop("Pow", chain_operands=1, shape=_pow_shape, grad=_pow_grad)
def pow_(X, Y):
    return np.power(X, Y.astype(X.dtype) if X.dtype.kind == "f" else Y).astype(X.dtype, copy=False)


@defop("Neg", chain_operands=1, shape=_unary, grad=lambda ctx, g: -g)
def neg(X):
    return np.negative(X)


@defop("Abs", chain_operands=1, shape=_unary, grad=lambda ctx, g: g * ctx.inputs[0].sign())
def abs_(X):
    return np.abs(X)


@defop("Sign", shape=_unary)
def sign(X):
    return np.sign(X)


@defop("Reciprocal", shape=_unary_float, grad=lambda ctx, g: -g * ctx.outputs[0] * ctx.outputs[0])
def reciprocal(X):
    return np.reciprocal(X)


# math functions ------------------------------------------------------------------------------

@defop("Exp", chain_operands=1, shape=_unary_float, grad=lambda ctx, g: g * ctx.outputs[0])
def exp(X):
    return np.exp(X)


@defop("Log", shape=_unary_float, grad=lambda ctx, g: g / ctx.inputs[0])
def log(X):
    return np.log(X)


@defop("Sqrt", chain_operands=1, shape=_unary_float, grad=lambda ctx, g: g / (ctx.outputs[0] * 2))
def sqrt(X):
    return np.sqrt(X)


@defop("Tanh", chain_operands=1, shape=_unary_float,
       grad=lambda ctx, g: g * (1 - ctx.outputs[0] * ctx.outputs[0]))
def tanh(X):
    return np.tanh(X)


@defop("Erf", chain_operands=1, shape=_unary_float,
       grad=lambda ctx, g: g * (ctx.inputs[0] * ctx.inputs[0] * -1).exp() * (2 / math.sqrt(math.pi)))
def erf(X):
    return _special.erf(X)


# activations ---------------------------------------------------------------------------------

@defop("Sigmoid", chain_operands=1, shape=_unary_float,
       grad=lambda ctx, g: g * ctx.outputs[0] * (1 - ctx.outputs[0]))
def sigmoid(X):
    # exp of a non-positive number only: no overflow warnings for large |x|
    e = np.exp(-np.abs(X))
    return np.where(X >= 0, 1 / (1 + e), e / (1 + e)).astype(X.dtype, copy=False)


def _relu_grad(ctx, g):
    # one op, as PyTorch's threshold_backward: a kernel plugin does it in one pass, where the
    # mask, its cast and the multiply were three passes and two temporaries
    return call("ReluGrad", ctx.outputs[0], g)


@defop("Relu", chain_operands=1, shape=_unary, grad=_relu_grad)
def relu(X):
    return np.maximum(X, 0)


def _relu_grad_shape(specs, **_):
    if tuple(specs[0].shape) != tuple(specs[1].shape):
        raise ShapeError(f"ReluGrad: Y {specs[0].shape} and dY {specs[1].shape} differ in shape")
    return TensorSpec(specs[1].shape, same_dtype(specs[:2], NUMERIC))


def _relu_grad_grad(ctx, g):
    # linear in dY under the same mask; the mask (Y > 0) is piecewise constant: no gradient
    return None, call("ReluGrad", ctx.inputs[0], g)


@defop("ReluGrad", traceable=False, shape=_relu_grad_shape, grad=_relu_grad_grad,
       domain="onemodel")
def relu_grad(Y, dY):
    """Gradient of Relu from its output: dY times the 0/1 mask of Y > 0 (a multiply, so a NaN
    or infinite dY still gives NaN where Y <= 0, and a negative one -0.0)."""
    return dY * (Y > 0).astype(dY.dtype)


def _gelu_grad(ctx, g):
    x = ctx.inputs[0]
    if ctx.attrs["approximate"] == "tanh":
        k = math.sqrt(2 / math.pi)
        inner = (x + x * x * x * 0.044715) * k
        t = inner.tanh()
        dinner = (x * x * (3 * 0.044715) + 1) * k
        return g * ((t + 1) * 0.5 + x * 0.5 * (1 - t * t) * dinner)
    cdf = ((x * (1 / math.sqrt(2))).erf() + 1) * 0.5
    pdf = (x * x * -0.5).exp() * (1 / math.sqrt(2 * math.pi))
    return g * (cdf + x * pdf)


@defop("Gelu", onnx_opset=20, shape=_unary_float, grad=_gelu_grad)
def gelu(X, *, approximate="none"):
    """ONNX Gelu (opset 20): ``approximate`` is "none" (erf) or "tanh"."""
    if approximate == "tanh":
        k = np.asarray(math.sqrt(2 / math.pi), X.dtype)
        return (0.5 * X * (1 + np.tanh(k * (X + 0.044715 * X**3)))).astype(X.dtype, copy=False)
    if approximate != "none":
        raise ValueError(f"Gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    return (0.5 * X * (1 + erf.kernel(X / np.asarray(math.sqrt(2), X.dtype)))).astype(X.dtype)


def _clip_grad(ctx, g):
    x, lo, hi = ctx.inputs
    keep = None
    if lo is not None:
        keep = x >= lo
    if hi is not None:
        keep = (x <= hi) if keep is None else keep & (x <= hi)
    return (g if keep is None else g.where(keep, 0.0)), None, None


def _clip_shape(specs):
    same_dtype(specs, NUMERIC)
    return TensorSpec(specs[0].shape, specs[0].dtype)


@onnx_adapter("Clip", before=11)
def _clip_attributes(node: ImportNode) -> None:
    """Opset < 11: the bounds were float attributes ``min`` and ``max``."""
    if "min" not in node.attrs and "max" not in node.attrs:
        return
    node.need(1)
    lo, hi = node.attrs.pop("min", None), node.attrs.pop("max", None)
    node.inputs = [node.inputs[0], "" if lo is None else node.const(lo, np.float32),
                   "" if hi is None else node.const(hi, np.float32)]


@defop("Clip", chain_operands=1, shape=_clip_shape, grad=_clip_grad)
def clip(input, min=None, max=None):
    out = input
    if min is not None:
        out = np.maximum(out, min)
    if max is not None:
        out = np.minimum(out, max)
    return out if out is not input else input.copy()


# comparisons and logic -----------------------------------------------------------------------

def _aligned(*values):
    """1-D values broadcast to one length (each of that length or one element), or None."""
    n = max(len(v) for v in values)
    if any(len(v) not in (1, n) for v in values):
        return None
    return [tuple(v) * n if len(v) == 1 else tuple(v) for v in values]


def _lower_bound(d) -> int | None:
    """A lower bound of a size expression, its symbols being sizes (>= 0), or None when this
    walk cannot tell. A convolution's output size ``((h - 1) // 2) + 1`` holds a -1 yet is at
    least 0: the bound follows floor division, which a check for negative constants did not."""
    if not isinstance(d, sym.DimExpr):
        return int(d)
    if d.kind == "sym":
        return 0
    bounds = [_lower_bound(a) for a in d.args]
    if any(b is None for b in bounds):
        return None
    if d.kind == "+":
        return sum(bounds)
    if d.kind == "*":
        if any(b < 0 for b in bounds):
            return None
        out = 1
        for b in bounds:
            out *= b
        return out
    divisor = d.args[1] if d.kind in ("//", "%") else None
    if d.kind == "//" and not isinstance(divisor, sym.DimExpr) and int(divisor) > 0:
        return bounds[0] // int(divisor)
    if d.kind == "%" and not isinstance(divisor, sym.DimExpr) and int(divisor) > 0:
        return 0
    if d.kind == "broadcast":
        return min(bounds)
    return None


def _nonnegative(d) -> bool:
    """Whether a size expression cannot be negative (see :func:`_lower_bound`)."""
    bound = _lower_bound(d)
    return bound is not None and bound >= 0


def _equal_value(in_specs, values, attrs):
    """``symbolic_value`` of Equal on shape values: equal expressions are equal, and a size
    differs from a negative constant (TorchScript's ``Where(Equal(shape, -1), 1, shape)``)."""
    aligned = _aligned(*values)
    if aligned is None:
        return None
    out = []
    for x, y in zip(*aligned):
        if not isinstance(x, sym.DimExpr) and not isinstance(y, sym.DimExpr):
            out.append(int(int(x) == int(y)))
        elif x == y:
            out.append(1)
        elif any(isinstance(u, sym.DimExpr) and _nonnegative(u) and not isinstance(v, sym.DimExpr)
                 and int(v) < 0 for u, v in ((x, y), (y, x))):
            out.append(0)
        else:
            return None
    return tuple(out)


@defop("Equal", symbolic_value=_equal_value, shape=_compare)
def equal(A, B):
    return np.equal(A, B)


@defop("Less", shape=_compare)
def less(A, B):
    return np.less(A, B)


@defop("LessOrEqual", shape=_compare)
def less_or_equal(A, B):
    return np.less_equal(A, B)


@defop("Greater", shape=_compare)
def greater(A, B):
    return np.greater(A, B)


@defop("GreaterOrEqual", shape=_compare)
def greater_or_equal(A, B):
    return np.greater_equal(A, B)


@defop("Not", shape=_logic)
def not_(X):
    return np.logical_not(X)


@defop("And", shape=_logic)
def and_(A, B):
    return np.logical_and(A, B)


@defop("Or", shape=_logic)
def or_(A, B):
    return np.logical_or(A, B)


# selection and conversion ----------------------------------------------------------------------

def _where_grad(ctx, g):
    cond, x, y = ctx.inputs
    from ..tensor import where

    return (None, unbroadcast(where(cond, g, 0.0), x.shape),
            unbroadcast(where(cond, 0.0, g), y.shape))


def _where_shape(specs):
    cond, x, y = specs
    if cond.dtype is not DType.BOOL:
        raise DTypeError(f"Where condition must be BOOL, got {cond.dtype.name}")
    return TensorSpec(broadcast_shapes(cond.shape, x.shape, y.shape), same_dtype([x, y]))


def _where_value(in_specs, values, attrs):
    """``symbolic_value`` of Where on 1-D values whose condition is known."""
    aligned = _aligned(*values)
    if aligned is None:
        return None
    return tuple(x if int(c) else y for c, x, y in zip(*aligned))


@defop("Where", symbolic_value=_where_value, shape=_where_shape, grad=_where_grad)
def where(condition, X, Y):
    return np.where(condition, X, Y)


def _cast_grad(ctx, g):
    src = ctx.inputs[0].dtype
    return g.cast(src) if src.is_floating else None


def _cast_shape(specs, *, to, saturate=1, round_mode="up"):
    return TensorSpec(specs[0].shape, DType.of(to))


@onnx_adapter("Cast")
def _cast_to(node: ImportNode) -> None:
    """``to`` is an ONNX element-type number in a file, a DType in the op set."""
    if "to" not in node.attrs:
        raise node.error("a Cast needs its 'to' attribute")
    node.attrs["to"] = node.dtype(node.attrs["to"])


def _cast_opset(attrs) -> int:
    """ONNX Cast takes float8 and ``saturate`` from opset 19, int4 from 21, float4 from 23,
    E8M0 and ``round_mode`` from 24, int2 from 25."""
    from ..dtype import ONNX_MIN_OPSET

    need = 24 if "round_mode" in attrs else 19 if "saturate" in attrs else 0
    to = attrs.get("to")
    return max(need, ONNX_MIN_OPSET.get(DType.of(to), 0) if to is not None else 0)


@defop("Cast", symbolic_value=first_value, shape=_cast_shape, grad=_cast_grad,
       onnx_opset=_cast_opset)
def cast(input, *, to=DType.F32, saturate=1, round_mode="up"):
    """``to`` is a DType (its ONNX number when exported). ONNX Cast-25 semantics for every
    DType: round to nearest even, ``saturate`` for the 8-bit floats, ``round_mode`` for E8M0
    (see ``dtype.cast_array``)."""
    target = _PLAIN_TARGETS.get(to) if isinstance(to, DType) else None
    if target is not None and input.dtype in _PLAIN_NUMPY:
        return input.astype(target)  # numpy's own types both: no rule of Cast's beyond astype
    return DType.of(to).convert(input, bool(saturate), round_mode)


# bool, the integers and float16/32/64 of numpy itself (not ml_dtypes' types, whose casts follow
# the ONNX rules in dtype.cast_array), and the DTypes that are they
_PLAIN_NUMPY = frozenset(np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64))
_PLAIN_TARGETS = {DType.from_numpy(t): t for t in _PLAIN_NUMPY}


def _dropout_shape(specs, *, seed=None):
    x = specs[0]
    return [TensorSpec(x.shape, x.dtype), TensorSpec(x.shape, DType.BOOL)]


@onnx_adapter("Dropout", before=12)
def _dropout_ratio(node: ImportNode) -> None:
    """Opset < 12: ``ratio`` was an attribute, meaningless at inference."""
    node.attrs.pop("ratio", None)


@defop("Dropout", foldable=False, shape=_dropout_shape, outputs=("output", "mask"))
def dropout(data, ratio=None, training_mode=None, *, seed=None):
    """ONNX Dropout: the identity unless ``training_mode`` is true (graphs run inference; the
    training package applies dropout with its own Generator)."""
    if training_mode is not None and bool(np.asarray(training_mode).reshape(-1)[0]):
        p = 0.5 if ratio is None else float(np.asarray(ratio).reshape(-1)[0])
        keep = np.random.default_rng(seed).random(data.shape) >= p
        return (data * keep / (1 - p)).astype(data.dtype), keep
    return data.copy(), np.ones(data.shape, bool)


@defop("Identity", symbolic_value=first_value, shape=lambda specs: specs[0], grad=lambda ctx, g: g)
def identity(input):
    return input.copy()
