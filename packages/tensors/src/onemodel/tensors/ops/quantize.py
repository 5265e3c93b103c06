"""Quantization ops: linear quantize/dequantize, integer and QLinear products, and BitCast.

ONNX semantics (QuantizeLinear/DequantizeLinear opset 25, QLinearMatMul 21, the others 10/11,
BitCast 26). Scales and zero points are per tensor (a scalar), per axis (1-D along ``axis``) or
blocked (the input's shape with ``ceil(D/block_size)`` along ``axis``). Quantized types are
8- and 16-bit integers, the 4- and 2-bit integers, the 8-bit floats and FLOAT4E2M1; their values
come from ml_dtypes (see ``dtype.py``). Integer products are exact: int8 values are summed in
float64 (exact below 2**53) and wrapped to int32 as ONNX allows (accumulation overflows only
in 32 bits). No gradients: these are inference ops.
"""

from __future__ import annotations

import numpy as np

from ..dtype import FLOAT8, SUB_BYTE_INT, DType
from ..errors import DTypeError, ShapeError
from ..symbolic import format_shape
from .adapters import ImportNode, onnx_adapter
from .base import OPS, TensorSpec, defop, norm_axis

_F32 = DType.F32
_SCALE_FLOATS = frozenset({DType.F32, DType.F16, DType.BF16})
_INT_RANGES = {DType.U8: (0, 255), DType.I8: (-128, 127), DType.U16: (0, 65535),
               DType.I16: (-32768, 32767), DType.U4: (0, 15), DType.I4: (-8, 7),
               DType.U2: (0, 3), DType.I2: (-2, 1)}
QUANTIZED = frozenset(_INT_RANGES) | FLOAT8 | {DType.F4E2M1FN}
_INT8 = frozenset({DType.I8, DType.U8})


# shared checks and helpers ---------------------------------------------------------------------

def _known(d) -> bool:
    return isinstance(d, int)


def _differ(a: TensorSpec, b: TensorSpec) -> bool:
    """Known shapes that differ, other than two one-element (per tensor) shapes."""
    if not all(map(_known, a.shape + b.shape)) or tuple(a.shape) == tuple(b.shape):
        return False
    return not (int(np.prod(a.shape)) == 1 and int(np.prod(b.shape)) == 1)


def _check_param(x: TensorSpec, p: TensorSpec | None, axis: int, block_size: int,
                 what: str) -> None:
    """A scale or zero point must be per tensor, per axis or blocked for ``x`` (checked on the
    sizes that are known; symbolic ones are checked when the graph is planned)."""
    if p is None or len(p.shape) == 0:
        return
    xs = x.shape
    if block_size < 0:
        raise ShapeError(f"block_size must be >= 0, got {block_size}")
    if not block_size:
        if len(p.shape) != 1:
            raise ShapeError(f"{what} {format_shape(p.shape)} must be a scalar or 1-D (per "
                             "axis) without block_size")
        n = p.shape[0]
        if not xs:
            if _known(n) and n != 1:
                raise ShapeError(f"{what} {format_shape(p.shape)} needs an input of rank >= 1")
            return
        a = norm_axis(axis, len(xs))
        if _known(n) and _known(xs[a]) and n not in (1, xs[a]):
            raise ShapeError(f"{what} {format_shape(p.shape)} must hold one value per element "
                             f"of axis {a} of the input {format_shape(xs)}")
        return
    if len(p.shape) != len(xs):
        raise ShapeError(f"blocked {what} {format_shape(p.shape)} must have the input's rank "
                         f"({format_shape(xs)})")
    a = norm_axis(axis, len(xs))
    for i, (pd, xd) in enumerate(zip(p.shape, xs)):
        if not (_known(pd) and _known(xd)):
            continue
        want = -(-xd // block_size) if i == a else xd
        if pd != want:
            raise ShapeError(f"blocked {what} {format_shape(p.shape)} does not fit the input "
                             f"{format_shape(xs)} with block_size {block_size} on axis {a}")


def _expand(p: np.ndarray, shape: tuple, axis: int, block_size: int, what: str) -> np.ndarray:
    """``p`` (scale or zero point) made broadcastable to ``shape``."""
    if p.ndim == 0 or (p.size == 1 and not block_size):
        return p.reshape(())
    a = norm_axis(axis, len(shape))
    if not block_size:
        if p.ndim != 1 or p.shape[0] != shape[a]:
            raise ShapeError(f"{what} has shape {list(p.shape)}; per-axis quantization of "
                             f"{list(shape)} on axis {a} needs [{shape[a]}]")
        dims = [1] * len(shape)
        dims[a] = p.shape[0]
        return p.reshape(dims)
    want = list(shape)
    want[a] = -(-shape[a] // block_size)
    if list(p.shape) != want:
        raise ShapeError(f"blocked {what} has shape {list(p.shape)}; {list(shape)} with "
                         f"block_size {block_size} on axis {a} needs {want}")
    return np.repeat(p, block_size, axis=a)[tuple(slice(0, n) for n in shape)]


def _widen(a: np.ndarray) -> np.ndarray:
    """Exact float values of a quantized or scale array (float64 for 32-bit integers)."""
    dt = DType.from_numpy(a.dtype)
    if dt in (DType.I32, DType.U32, DType.I64, DType.F64):
        return a.astype(np.float64)
    if dt in SUB_BYTE_INT:
        return a.astype(np.int8).astype(np.float32)
    return a.astype(np.float32)


def _as_scalar_or_1d(name: str, spec: TensorSpec | None) -> None:
    if spec is not None and len(spec.shape) > 1:
        raise ShapeError(f"{name} must be a scalar or 1-D, got {format_shape(spec.shape)}")


def _dtype_attr(node: ImportNode, *names: str) -> None:
    """ONNX element-type numbers in attributes become DTypes; 0 means "not given"."""
    for name in names:
        if name in node.attrs:
            code = int(node.attrs[name])
            if code:
                node.attrs[name] = node.dtype(code)
            else:
                del node.attrs[name]


# QuantizeLinear --------------------------------------------------------------------------------

def _quantize_shape(specs, *, axis=1, saturate=1, block_size=0, output_dtype=None,
                    precision=None):
    x, scale, zp = (list(specs) + [None])[:3]
    if x.dtype not in (_SCALE_FLOATS | {DType.I32}):
        raise DTypeError(f"x must be F32, F16, BF16 or I32, got {x.dtype.name}")
    if scale.dtype not in (_SCALE_FLOATS | {DType.I32, DType.F8E8M0FNU}):
        raise DTypeError(f"y_scale must be F32, F16, BF16, I32 or F8E8M0FNU, got "
                         f"{scale.dtype.name}")
    out = DType.of(output_dtype) if output_dtype is not None else None
    if zp is not None:
        if out is not None and out is not zp.dtype:
            raise DTypeError(f"output_dtype {out.name} differs from y_zero_point's dtype "
                             f"{zp.dtype.name}")
        out = zp.dtype
        if _differ(zp, scale):
            raise ShapeError(f"y_zero_point {format_shape(zp.shape)} and y_scale "
                             f"{format_shape(scale.shape)} must have one shape")
    out = out or DType.U8
    if out not in QUANTIZED:
        raise DTypeError(f"cannot quantize to {out.name}; quantized types are "
                         f"{', '.join(sorted(d.name for d in QUANTIZED))}")
    if precision is not None and DType.of(precision) not in _SCALE_FLOATS:
        raise DTypeError(f"precision must be F32, F16 or BF16, got {DType.of(precision).name}")
    _check_param(x, scale, axis, block_size, "y_scale")
    return TensorSpec(x.shape, out)


def _quantize_opset(attrs) -> int:
    need = 10
    out = attrs.get("output_dtype")
    if attrs.get("saturate", 1) != 1 or attrs.get("axis", 1) != 1:
        need = 19 if "saturate" in attrs else 13
    if attrs.get("block_size") or out is not None:
        need = max(need, 21)
    if attrs.get("precision") is not None:
        need = max(need, 23)
    return need


@onnx_adapter("QuantizeLinear")
def _quantize_dtypes(node: ImportNode) -> None:
    _dtype_attr(node, "output_dtype", "precision")


@defop("QuantizeLinear", shape=_quantize_shape, onnx_opset=_quantize_opset)
def quantize_linear(x, y_scale, y_zero_point=None, *, axis=1, saturate=1, block_size=0,
                    output_dtype=None, precision=None):
    """``saturate(round_half_even(x / y_scale) + y_zero_point)``; the division is done in
    ``precision`` or else in y_scale's type (BF16 through float32, rounded). Integer targets
    clip to their range (NaN gives the zero point); float8 targets saturate unless
    ``saturate=0`` (then NaN/Inf out of range, as Cast)."""
    out = (DType.from_numpy(y_zero_point.dtype) if y_zero_point is not None
           else DType.of(output_dtype) if output_dtype is not None else DType.U8)
    scale = _expand(y_scale, x.shape, axis, block_size, "y_scale")
    sdt = DType.from_numpy(scale.dtype)
    p = DType.of(precision) if precision is not None else (
        sdt if sdt in _SCALE_FLOATS else DType.from_numpy(x.dtype)
        if DType.from_numpy(x.dtype) in _SCALE_FLOATS else _F32)
    q = (_widen(x) / _widen(scale)).astype(np.float32)
    if p is not _F32:  # the division's result in the precision type (F16/BF16 round)
        q = q.astype(p.numpy).astype(np.float32)
    zero = None if y_zero_point is None else _widen(
        _expand(y_zero_point, x.shape, axis, block_size, "y_zero_point"))
    if out in _INT_RANGES:
        lo, hi = _INT_RANGES[out]
        v = np.rint(np.nan_to_num(q.astype(np.float64), nan=0.0))
        if zero is not None:
            v = v + zero
        return np.clip(v, lo, hi).astype(np.int32).astype(out.numpy)
    if zero is not None:
        q = q + zero
    return out.convert(q, bool(saturate))


# DequantizeLinear ------------------------------------------------------------------------------

_DEQUANT_IN = frozenset(_INT_RANGES) | FLOAT8 | {DType.F4E2M1FN, DType.I32}


def _dequantize_shape(specs, *, axis=1, block_size=0, output_dtype=None):
    x, scale, zp = (list(specs) + [None])[:3]
    if x.dtype not in _DEQUANT_IN:
        raise DTypeError(f"x must be a quantized type or I32, got {x.dtype.name}")
    if scale.dtype not in (_SCALE_FLOATS | {DType.F8E8M0FNU}):
        raise DTypeError(f"x_scale must be F32, F16, BF16 or F8E8M0FNU, got {scale.dtype.name}")
    if zp is not None:
        if zp.dtype is not x.dtype:
            raise DTypeError(f"x_zero_point ({zp.dtype.name}) must have x's dtype "
                             f"({x.dtype.name})")
        if _differ(zp, scale):
            raise ShapeError(f"x_zero_point {format_shape(zp.shape)} and x_scale "
                             f"{format_shape(scale.shape)} must have one shape")
    out = DType.of(output_dtype) if output_dtype is not None else scale.dtype
    if out not in _SCALE_FLOATS:
        raise DTypeError(f"the output must be F32, F16 or BF16, got {out.name}"
                         + (" (give output_dtype with an E8M0 scale)"
                            if scale.dtype is DType.F8E8M0FNU else ""))
    _check_param(x, scale, axis, block_size, "x_scale")
    return TensorSpec(x.shape, out)


def _dequantize_opset(attrs) -> int:
    need = 13 if attrs.get("axis", 1) != 1 else 10
    if attrs.get("block_size") or attrs.get("output_dtype") is not None:
        need = max(need, 21 if not attrs.get("output_dtype") else 23)
    return need


@onnx_adapter("DequantizeLinear")
def _dequantize_dtypes(node: ImportNode) -> None:
    _dtype_attr(node, "output_dtype")


@defop("DequantizeLinear", shape=_dequantize_shape, onnx_opset=_dequantize_opset)
def dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0,
                      output_dtype=None):
    """``(x - x_zero_point) * x_scale`` in float32 (float64 for I32 input), rounded once to
    the output type (``output_dtype``, else x_scale's type)."""
    out = DType.of(output_dtype) if output_dtype is not None else DType.from_numpy(x_scale.dtype)
    v = _widen(x)
    if x_zero_point is not None:
        v = v - _widen(_expand(x_zero_point, x.shape, axis, block_size, "x_zero_point"))
    y = v * _widen(_expand(x_scale, x.shape, axis, block_size, "x_scale"))
    return out.convert(y)


# DynamicQuantizeLinear -------------------------------------------------------------------------

def _dynamic_shape(specs):
    x = specs[0]
    if x.dtype is not _F32:
        raise DTypeError(f"x must be F32, got {x.dtype.name}")
    return [TensorSpec(x.shape, DType.U8), TensorSpec((), _F32), TensorSpec((), DType.U8)]


@defop("DynamicQuantizeLinear", shape=_dynamic_shape, onnx_opset=11,
       outputs=("y", "y_scale", "y_zero_point"))
def dynamic_quantize_linear(x):
    """UINT8 quantization over x's range widened to hold 0: scale ``(max - min) / 255`` (1 when
    the range is empty, as onnxruntime), zero point ``round(-min / scale)`` clipped to
    [0, 255], ``y = clip(round(x / scale) + zero point)``; float32 arithmetic, ties to even."""
    hi = np.float32(max(0.0, float(np.max(x)))) if x.size else np.float32(0)
    lo = np.float32(min(0.0, float(np.min(x)))) if x.size else np.float32(0)
    scale = np.float32(1.0) if hi == lo else np.float32((hi - lo) / np.float32(255))
    zp = np.rint(np.clip(np.float32(0) - lo / scale, 0, 255))
    y = np.clip(np.rint(x / scale) + zp, 0, 255)
    return y.astype(np.uint8), np.array(scale, np.float32), np.array(zp, np.uint8)


# MatMulInteger, QLinearMatMul ------------------------------------------------------------------

def _matmul_shape_of(a: TensorSpec, b: TensorSpec) -> tuple:
    return OPS["MatMul"].infer([TensorSpec(a.shape, _F32), TensorSpec(b.shape, _F32)])[0].shape


def _int8_inputs(pairs) -> None:
    for name, spec in pairs:
        if spec is not None and spec.dtype not in _INT8:
            raise DTypeError(f"{name} must be I8 or U8, got {spec.dtype.name}")


def _zero_point_matches(pairs) -> None:
    for (vn, v), (zn, z) in pairs:
        if z is not None and z.dtype is not v.dtype:
            raise DTypeError(f"{zn} ({z.dtype.name}) must have {vn}'s dtype ({v.dtype.name})")


def _matmul_integer_shape(specs):
    a, b, az, bz = (list(specs) + [None, None])[:4]
    _int8_inputs([("A", a), ("B", b)])
    _zero_point_matches([(("A", a), ("a_zero_point", az)), (("B", b), ("b_zero_point", bz))])
    return TensorSpec(_matmul_shape_of(a, b), DType.I32)


def _rows(p: np.ndarray, a: np.ndarray) -> np.ndarray:
    """A per-row parameter of ``a`` (1-D of a's row count) as a column, so it broadcasts."""
    if p.ndim == 1 and p.size > 1 and a.ndim >= 2 and p.shape[0] == a.shape[-2]:
        return p.reshape(-1, 1)
    return p


def _int_matmul(a, b, az, bz) -> np.ndarray:
    fa = a.astype(np.float64)
    if az is not None:
        fa = fa - _rows(az, a).astype(np.float64)
    fb = b.astype(np.float64)
    if bz is not None:
        fb = fb - bz.astype(np.float64)
    return np.matmul(fa, fb)


def _to_int32(c: np.ndarray) -> np.ndarray:
    """Exact integer sums wrapped to int32 (two's complement), as 32-bit accumulators do."""
    return np.rint(c).astype(np.int64).astype(np.int32)


@defop("MatMulInteger", shape=_matmul_integer_shape, onnx_opset=10)
def matmul_integer(A, B, a_zero_point=None, b_zero_point=None):
    """``(A - a_zero_point) @ (B - b_zero_point)`` in int32; zero points per tensor, per row of
    A ([M]) or per column of B ([N])."""
    return _to_int32(_int_matmul(A, B, a_zero_point, b_zero_point))


def _qlinear_matmul_shape(specs):
    a, a_s, a_z, b, b_s, b_z, y_s, y_z = specs
    _int8_inputs([("a", a), ("b", b), ("y_zero_point", y_z)])
    _zero_point_matches([(("a", a), ("a_zero_point", a_z)), (("b", b), ("b_zero_point", b_z))])
    for name, s in (("a_scale", a_s), ("b_scale", b_s), ("y_scale", y_s)):
        if s.dtype not in _SCALE_FLOATS:
            raise DTypeError(f"{name} must be F32, F16 or BF16, got {s.dtype.name}")
    return TensorSpec(_matmul_shape_of(a, b), y_z.dtype)


def _requantize(acc: np.ndarray, multiplier: np.ndarray, y_zero_point: np.ndarray) -> np.ndarray:
    """``saturate(round_half_even(acc * multiplier) + y_zero_point)`` in y_zero_point's type."""
    lo, hi = _INT_RANGES[DType.from_numpy(y_zero_point.dtype)]
    v = np.rint(acc * _widen(multiplier).astype(np.float64)) + y_zero_point.astype(np.float64)
    return np.clip(v, lo, hi).astype(y_zero_point.dtype)


def _scale_product(*scales: np.ndarray, divide: np.ndarray) -> np.ndarray:
    """``s1 * s2 / y_scale`` in the scales' type (F16 and BF16 round after each step)."""
    dt = np.result_type(*[s.dtype for s in scales], divide.dtype)
    out = scales[0].astype(np.float32)
    for s in scales[1:]:
        out = (out * s.astype(np.float32)).astype(dt).astype(np.float32)
    return (out / divide.astype(np.float32)).astype(dt)


@defop("QLinearMatMul", shape=_qlinear_matmul_shape, onnx_opset=10)
def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    """Quantized matmul: the exact integer product of the zero-point-shifted inputs, times
    ``a_scale * b_scale / y_scale`` (per tensor, per row of a, per column of b), rounded half to
    even and saturated into y_zero_point's type (I8 or U8)."""
    acc = _int_matmul(a, b, a_zero_point, b_zero_point)
    mult = _scale_product(_rows(a_scale, a), b_scale, divide=y_scale)
    return _requantize(acc, mult, y_zero_point)


# ConvInteger, QLinearConv ----------------------------------------------------------------------

_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _conv_shape_of(x: TensorSpec, w: TensorSpec, attrs: dict) -> tuple:
    return OPS["Conv"].infer([TensorSpec(x.shape, _F32), TensorSpec(w.shape, _F32)],
                             attrs)[0].shape


def _int_conv(x, w, xz, wz, attrs) -> np.ndarray:
    fx = x.astype(np.float64)
    if xz is not None:
        fx = fx - xz.astype(np.float64)
    fw = w.astype(np.float64)
    if wz is not None:
        wz = wz.astype(np.float64)
        if wz.ndim == 1 and wz.size > 1:  # per output channel
            wz = wz.reshape((-1,) + (1,) * (w.ndim - 1))
        fw = fw - wz
    return OPS["Conv"].kernel(fx, fw, None, **attrs)


def _conv_integer_shape(specs, *, auto_pad="NOTSET", dilations=None, group=1,
                        kernel_shape=None, pads=None, strides=None):
    x, w, xz, wz = (list(specs) + [None, None])[:4]
    _int8_inputs([("x", x), ("w", w)])
    _zero_point_matches([(("x", x), ("x_zero_point", xz)), (("w", w), ("w_zero_point", wz))])
    attrs = dict(auto_pad=auto_pad, dilations=dilations, group=group,
                 kernel_shape=kernel_shape, pads=pads, strides=strides)
    return TensorSpec(_conv_shape_of(x, w, attrs), DType.I32)


@defop("ConvInteger", shape=_conv_integer_shape, onnx_opset=10)
def conv_integer(x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET",
                 dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv of ``x - x_zero_point`` and ``w - w_zero_point`` (per tensor or per output channel)
    in int32, with Conv's geometry attributes."""
    attrs = dict(auto_pad=auto_pad, dilations=dilations, group=group,
                 kernel_shape=kernel_shape, pads=pads, strides=strides)
    return _to_int32(_int_conv(x, w, x_zero_point, w_zero_point, attrs))


def _qlinear_conv_shape(specs, *, auto_pad="NOTSET", dilations=None, group=1,
                        kernel_shape=None, pads=None, strides=None):
    x, x_s, x_z, w, w_s, w_z, y_s, y_z, b = (list(specs) + [None])[:9]
    _int8_inputs([("x", x), ("w", w), ("y_zero_point", y_z)])
    _zero_point_matches([(("x", x), ("x_zero_point", x_z)), (("w", w), ("w_zero_point", w_z))])
    for name, s in (("x_scale", x_s), ("w_scale", w_s), ("y_scale", y_s)):
        if s.dtype not in _SCALE_FLOATS:
            raise DTypeError(f"{name} must be F32, F16 or BF16, got {s.dtype.name}")
    _as_scalar_or_1d("w_scale", w_s)
    if b is not None and b.dtype is not DType.I32:
        raise DTypeError(f"B must be I32, got {b.dtype.name}")
    attrs = dict(auto_pad=auto_pad, dilations=dilations, group=group,
                 kernel_shape=kernel_shape, pads=pads, strides=strides)
    return TensorSpec(_conv_shape_of(x, w, attrs), y_z.dtype)


@defop("QLinearConv", shape=_qlinear_conv_shape, onnx_opset=10)
def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
                 B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                 pads=None, strides=None):
    """Quantized Conv: the exact integer conv of the shifted inputs plus the int32 bias ``B``,
    times ``x_scale * w_scale / y_scale`` (w_scale per tensor or per output channel), rounded
    half to even and saturated into y_zero_point's type."""
    attrs = dict(auto_pad=auto_pad, dilations=dilations, group=group,
                 kernel_shape=kernel_shape, pads=pads, strides=strides)
    acc = _int_conv(x, w, x_zero_point, w_zero_point, attrs)
    if B is not None:
        acc = acc + B.astype(np.float64).reshape((1, -1) + (1,) * (acc.ndim - 2))
    ws = w_scale.reshape((1, -1) + (1,) * (acc.ndim - 2)) if w_scale.size > 1 else w_scale
    return _requantize(acc, _scale_product(x_scale, ws, divide=y_scale), y_zero_point)


# BitCast ---------------------------------------------------------------------------------------

def _bitcast_shape(specs, *, to=None):
    x = specs[0]
    if to is None:
        raise DTypeError("BitCast needs its 'to' attribute (the dtype to read the bits as)")
    target = DType.of(to)
    if x.dtype.bits != target.bits:
        raise DTypeError(f"cannot reinterpret {x.dtype.name} ({x.dtype.bits} bits) as "
                         f"{target.name} ({target.bits} bits): BitCast needs equal bit widths; "
                         "use Cast to convert values")
    return TensorSpec(x.shape, target)


@onnx_adapter("BitCast")
def _bitcast_to(node: ImportNode) -> None:
    if "to" not in node.attrs:
        raise node.error("a BitCast needs its 'to' attribute")
    node.attrs["to"] = node.dtype(node.attrs["to"])


_SIGNED_SUB = {DType.I4: 4, DType.I2: 2}


@defop("BitCast", shape=_bitcast_shape, onnx_opset=26)
def bitcast(input, *, to=None):
    """The same bits read as dtype ``to`` (little endian, equal widths). Booleans read any
    non-zero byte as true; 4- and 2-bit types keep their low bits."""
    target = DType.of(to)
    x = input if input.flags.c_contiguous else input.copy()  # (ascontiguousarray makes 0-d 1-d)
    if target.bits < 8:  # one element per byte in memory: move the code, not the byte
        code = x.view(np.uint8) & np.uint8((1 << target.bits) - 1)
        if target in _SIGNED_SUB:
            half = 1 << (target.bits - 1)
            return (code.astype(np.int8) - ((code >= half) * (2 * half)).astype(np.int8)) \
                .astype(target.numpy)
        if target is DType.F4E2M1FN:
            return code.view(target.numpy)
        return code.astype(target.numpy)
    if target is DType.BOOL:
        return x.view(np.uint8) != 0
    return x.view(target.numpy).copy()
