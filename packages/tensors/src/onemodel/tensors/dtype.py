"""Element types and their numpy equivalents.

Besides numpy's own types, OneModel has the low-precision types of ONNX and of current
accelerators: bfloat16, the 8-bit floats (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, the MX scale type
E8M0FNU), the 4-bit float E2M1FN and 4- and 2-bit integers. Their numpy dtypes come from the
``ml_dtypes`` package (the one JAX and ONNX use), so values are represented and rounded by it,
not by hand-written bit tricks. One element takes one byte in memory (two for bfloat16); ONNX
files pack 4- and 2-bit types (the onnx plugin does that). ml_dtypes is imported on the first use
of such a type, not with this module: its extension takes most of a second to load on some
machines, which every ``import onemodel.runtime`` would pay for float32 models.

BF16 is a floating type ops compute on (in float32, rounded once per op, as PyTorch does on the
CPU). The other low-precision types are *storage* types: Cast, data movement and the
quantization ops take them, arithmetic ops refuse them with a ``DTypeError``.
"""

from __future__ import annotations

import enum
import sys

import numpy as np

from .errors import DTypeError


class DType(enum.Enum):
    """An element type. ``DType.F32.numpy`` is the numpy dtype."""

    F16 = "float16"
    F32 = "float32"
    F64 = "float64"
    I8 = "int8"
    I16 = "int16"
    I32 = "int32"
    I64 = "int64"
    U8 = "uint8"
    U16 = "uint16"
    U32 = "uint32"
    U64 = "uint64"
    BOOL = "bool"
    BF16 = "bfloat16"
    F8E4M3FN = "float8_e4m3fn"
    F8E4M3FNUZ = "float8_e4m3fnuz"
    F8E5M2 = "float8_e5m2"
    F8E5M2FNUZ = "float8_e5m2fnuz"
    F8E8M0FNU = "float8_e8m0fnu"
    F4E2M1FN = "float4_e2m1fn"
    I4 = "int4"
    U4 = "uint4"
    I2 = "int2"
    U2 = "uint2"

    @property
    def numpy(self) -> np.dtype:
        return _TO_NUMPY[self]

    @property
    def is_floating(self) -> bool:
        """A floating type ops compute on: F16, F32, F64 and BF16 (the 8- and 4-bit floats are
        storage types, see :attr:`is_storage`)."""
        return self in _COMPUTE_FLOATING

    @property
    def is_storage(self) -> bool:
        """A type values are stored, moved, cast and (de)quantized in, but not computed on: the
        8- and 4-bit floats and the 4- and 2-bit integers."""
        return self in STORAGE

    @property
    def itemsize(self) -> int:
        """Bytes per element in memory (1 for the 4- and 2-bit types)."""
        return _TO_NUMPY[self].itemsize

    @property
    def bits(self) -> int:
        """Bits per element in a packed file (4 for I4, 16 for BF16, 8 for BOOL)."""
        return _BITS.get(self, 8 * _TO_NUMPY[self].itemsize)

    @classmethod
    def from_numpy(cls, dtype) -> DType:
        """The DType of a numpy dtype (or anything ``np.dtype`` accepts)."""
        try:
            if isinstance(dtype, str) and dtype in _NARROW:
                _load_narrow_types()  # numpy knows 'bfloat16' only once ml_dtypes is imported
            return _FROM_NUMPY[np.dtype(dtype)]
        except (KeyError, TypeError):
            raise DTypeError(
                f"numpy dtype {dtype!r} has no OneModel DType; "
                f"use one of {', '.join(d.value for d in DType)}"
            ) from None

    @classmethod
    def lookup(cls, dtype) -> DType | None:
        """The DType of a numpy dtype, or None where OneModel has none (no error raised)."""
        try:
            return _FROM_NUMPY[dtype]  # a hit is a plain dict lookup; a miss may load the rest
        except (KeyError, TypeError):
            return None

    @classmethod
    def of(cls, value) -> DType:
        """Accept a DType, a numpy dtype or its name ('float32', 'F32', 'bfloat16', 'BF16')."""
        if isinstance(value, DType):
            return value
        if isinstance(value, str):
            if value.upper() in cls.__members__:
                return cls[value.upper()]
            if value in cls._value2member_map_:
                return cls(value)
        return cls.from_numpy(value)

    def convert(self, x: np.ndarray, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
        """Array ``x`` converted to this dtype with ONNX Cast's rules (:func:`cast_array`)."""
        return cast_array(x, self, saturate, round_mode)

    def __repr__(self) -> str:
        return f"DType.{self.name}"


class _NumpyOf(dict):
    """DType -> numpy dtype. numpy's own types are here from the start; the narrow ones join on
    the first lookup of one, which imports ml_dtypes."""

    def __missing__(self, key):
        if isinstance(key, DType) and _load_narrow_types():
            return self[key]
        raise KeyError(key)


class _DTypeOf(dict):
    """numpy dtype -> DType. A narrow type's dtype can only exist once ml_dtypes is imported
    (by us or by the caller), so a miss then loads the narrow types and looks again."""

    def __missing__(self, key):
        if "ml_dtypes" in sys.modules and _load_narrow_types():
            return self[key]
        raise KeyError(key)


_NARROW = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
           "float8_e8m0fnu", "float4_e2m1fn", "int4", "uint4", "int2", "uint2")
_TO_NUMPY = _NumpyOf((d, np.dtype(d.value)) for d in DType if d.value not in _NARROW)
_FROM_NUMPY = _DTypeOf((v, k) for k, v in _TO_NUMPY.items())


def _load_narrow_types() -> bool:
    """Import ml_dtypes and add its types to the tables; False if they are there already."""
    if len(_TO_NUMPY) == len(DType):
        return False
    import ml_dtypes

    for name in _NARROW:
        d, dt = DType(name), np.dtype(getattr(ml_dtypes, name))
        dict.__setitem__(_TO_NUMPY, d, dt)
        dict.__setitem__(_FROM_NUMPY, dt, d)
    return True


def _ml_dtypes():
    import ml_dtypes

    return ml_dtypes

_BITS = {DType.BOOL: 8, DType.F4E2M1FN: 4, DType.I4: 4, DType.U4: 4, DType.I2: 2, DType.U2: 2}

FLOATING = frozenset({DType.F16, DType.F32, DType.F64})
_COMPUTE_FLOATING = FLOATING | {DType.BF16}
INTEGER = frozenset({DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U16, DType.U32,
                     DType.U64})
NUMERIC = FLOATING | INTEGER
FLOAT8 = frozenset({DType.F8E4M3FN, DType.F8E4M3FNUZ, DType.F8E5M2, DType.F8E5M2FNUZ})
SUB_BYTE_INT = frozenset({DType.I4, DType.U4, DType.I2, DType.U2})
STORAGE = FLOAT8 | SUB_BYTE_INT | {DType.F8E8M0FNU, DType.F4E2M1FN}
# every floating type, storage ones included (what Cast's float rules apply to)
ALL_FLOATING = _COMPUTE_FLOATING | FLOAT8 | {DType.F8E8M0FNU, DType.F4E2M1FN}
# the first ONNX opset whose operators take each newer element type (ONNX export picks an opset
# at least this high for a graph holding the type)
ONNX_MIN_OPSET = {DType.BF16: 13, **dict.fromkeys(FLOAT8, 19), DType.I4: 21, DType.U4: 21,
                  DType.F4E2M1FN: 23, DType.F8E8M0FNU: 24, DType.I2: 25, DType.U2: 25}


def result_dtype(*dtypes: DType) -> DType:
    """The dtype two tensor operands promote to (numpy's rule on the listed dtypes; BF16 with
    F16 gives F32, as in PyTorch). Storage types do not promote: cast them first."""
    out = dtypes[0]
    for d in dtypes[1:]:
        if d is not out:
            if out in STORAGE or d in STORAGE:
                raise DTypeError(f"{out.name} and {d.name} do not promote to a common dtype "
                                 "(storage types take part in no arithmetic); cast first")
            out = _FROM_NUMPY[np.promote_types(out.numpy, d.numpy)]
    return out


# casting ---------------------------------------------------------------------------------------

def cast_array(x: np.ndarray, to: DType, saturate: bool = True,
               round_mode: str = "up") -> np.ndarray:
    """``x`` converted to ``to`` with ONNX Cast semantics (opset 25).

    Rounding is to nearest even (ml_dtypes). With ``saturate`` (the default) values beyond an
    8-bit float's range, infinities included, become its largest finite value of that sign;
    without it they become NaN (Inf for E5M2), as the ONNX tables say. E8M0 (a power-of-two
    scale) rounds by ``round_mode`` ("up", "down", "nearest"). Integer -> integer conversion out
    of range keeps the low bits (two's complement); float -> integer out of range is undefined
    in ONNX and gives what ml_dtypes/numpy give."""
    target = to.numpy
    src = x.dtype
    if src == target:
        return x.copy()
    sdt = DType.lookup(src)
    if sdt in STORAGE:
        # widen exactly first: every value of these types is a float32 (int8 for the integers)
        x = x.astype(np.int8 if sdt in SUB_BYTE_INT else np.float32)
        if x.dtype == target:
            return x
    if to is DType.F8E8M0FNU:
        return _to_e8m0(x, saturate, round_mode)
    if to in FLOAT8:
        if x.dtype.kind not in "f" and x.dtype not in (_TO_NUMPY[DType.BF16],):
            x = x.astype(np.float32)
        if saturate:
            big = float(_ml_dtypes().finfo(target).max)
            x = np.clip(x, -big, big)  # NaN stays NaN, +-Inf become +-max
        with np.errstate(invalid="ignore", over="ignore"):
            return x.astype(target)
    if to in STORAGE:
        if x.dtype == np.bool_:
            x = x.astype(np.int8)
        with np.errstate(invalid="ignore", over="ignore"):
            return x.astype(target)
    if to is DType.BF16 and x.dtype == np.bool_:
        x = x.astype(np.float32)
    return x.astype(target)


def _to_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """Power-of-two scales: the float32 exponent is the E8M0 code (both have bias 127); the
    fraction decides the rounding. NaN -> NaN; Inf -> the largest scale when saturating (the
    ONNX table), NaN otherwise. Negative inputs are undefined in ONNX (their magnitude is used)."""
    if round_mode not in ("up", "down", "nearest"):
        raise DTypeError(f"Cast to F8E8M0FNU: round_mode must be 'up', 'down' or 'nearest', "
                         f"got {round_mode!r}")
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.uint16)
    frac = bits & 0x7FFFFF
    special = exp == 0xFF
    sub = exp == 0  # zero and float32 subnormals: frac * 2**-149, code 0 is 2**-127
    if round_mode == "up":
        up = np.where(sub, frac > 0x400000, frac > 0)
    elif round_mode == "nearest":
        up = np.where(sub, frac > 0x600000, (frac & 0x400000) > 0)
    else:
        up = np.zeros(exp.shape, bool)
    code = exp + (up & ~special)
    if saturate:
        code = np.minimum(code, 0xFE)
        code = np.where(special & (frac == 0), 0xFE, code)  # +-Inf
    code = np.where(special & (frac != 0), 0xFF, code)  # NaN
    return code.astype(np.uint8).view(DType.F8E8M0FNU.numpy)
