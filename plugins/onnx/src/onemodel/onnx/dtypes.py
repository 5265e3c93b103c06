"""DType <-> ONNX TensorProto element types.

The low-precision types map one to one (their numpy dtypes are ml_dtypes', as in
``onnx.helper.tensor_dtype_to_np_dtype``). In a TensorProto's ``raw_data`` ONNX packs the 4-bit
types (INT4, UINT4, FLOAT4E2M1) two to a byte and the 2-bit ones four to a byte, low bits first;
``onnx.numpy_helper`` packs on ``from_array`` and unpacks on ``to_array``, and
:func:`raw_nbytes` gives the packed length a file must hold.
"""

from __future__ import annotations

from onemodel.tensors import DType, OneModelError
from onemodel.tensors.dtype import ONNX_MIN_OPSET

# TensorProto.DataType numbers (stable across onnx releases)
TO_ONNX = {DType.F32: 1, DType.U8: 2, DType.I8: 3, DType.U16: 4, DType.I16: 5, DType.I32: 6,
           DType.I64: 7, DType.BOOL: 9, DType.F16: 10, DType.F64: 11, DType.U32: 12, DType.U64: 13,
           DType.BF16: 16, DType.F8E4M3FN: 17, DType.F8E4M3FNUZ: 18, DType.F8E5M2: 19,
           DType.F8E5M2FNUZ: 20, DType.U4: 21, DType.I4: 22, DType.F4E2M1FN: 23,
           DType.F8E8M0FNU: 24, DType.U2: 25, DType.I2: 26}
FROM_ONNX = {v: k for k, v in TO_ONNX.items()}


def from_onnx(code: int, what: str = "tensor") -> DType:
    try:
        return FROM_ONNX[int(code)]
    except KeyError:
        raise OneModelError(f"{what} has ONNX element type {code}, which OneModel does not "
                            f"support (supported: {', '.join(d.name for d in TO_ONNX)})") from None


def raw_nbytes(dtype: DType, count: int) -> int:
    """Bytes ``count`` elements of ``dtype`` take in a TensorProto's ``raw_data`` (packed for
    the 4- and 2-bit types: ``ceil(count * bits / 8)``)."""
    return -(-count * dtype.bits // 8)


def min_opset(dtypes) -> int:
    """The lowest ONNX opset whose operators take all of ``dtypes`` (0 when any opset does):
    float8 needs 19, int4 21, float4 23, E8M0 24, int2 25. An exporter takes the highest of
    this (over the graph's inputs, outputs and initializers) and its nodes' opsets, and the IR
    version ``onnx.helper.find_min_ir_version_for`` gives for it."""
    return max((ONNX_MIN_OPSET.get(d, 0) for d in dtypes), default=0)
