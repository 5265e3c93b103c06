"""Element types and their numpy equivalents."""

from __future__ import annotations

import enum

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

    @property
    def numpy(self) -> np.dtype:
        return _TO_NUMPY[self]

    @property
    def is_floating(self) -> bool:
        return self in (DType.F16, DType.F32, DType.F64)

    @property
    def itemsize(self) -> int:
        return _TO_NUMPY[self].itemsize

    @classmethod
    def from_numpy(cls, dtype) -> DType:
        """The DType of a numpy dtype (or anything ``np.dtype`` accepts)."""
        try:
            return _FROM_NUMPY[np.dtype(dtype)]
        except (KeyError, TypeError):
            raise DTypeError(
                f"numpy dtype {dtype!r} has no OneModel DType; "
                f"use one of {', '.join(d.value for d in DType)}"
            ) from None

    @classmethod
    def of(cls, value) -> DType:
        """Accept a DType, a numpy dtype or its name ('float32', 'F32')."""
        if isinstance(value, DType):
            return value
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        return cls.from_numpy(value)

    def __repr__(self) -> str:
        return f"DType.{self.name}"


_TO_NUMPY = {d: np.dtype(d.value) for d in DType}
_FROM_NUMPY = {v: k for k, v in _TO_NUMPY.items()}

FLOATING = frozenset({DType.F16, DType.F32, DType.F64})
INTEGER = frozenset({DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U16, DType.U32,
                     DType.U64})
NUMERIC = FLOATING | INTEGER


def result_dtype(*dtypes: DType) -> DType:
    """The dtype two tensor operands promote to (numpy's rule on the listed dtypes)."""
    out = dtypes[0]
    for d in dtypes[1:]:
        if d is not out:
            out = _FROM_NUMPY[np.promote_types(out.numpy, d.numpy)]
    return out
