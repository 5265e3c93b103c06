"""DType <-> ONNX TensorProto element types."""

from __future__ import annotations

from onemodel.tensors import DType, OneModelError

# TensorProto.DataType numbers (stable across onnx releases)
TO_ONNX = {DType.F32: 1, DType.U8: 2, DType.I8: 3, DType.U16: 4, DType.I16: 5, DType.I32: 6,
           DType.I64: 7, DType.BOOL: 9, DType.F16: 10, DType.F64: 11, DType.U32: 12, DType.U64: 13}
FROM_ONNX = {v: k for k, v in TO_ONNX.items()}


def from_onnx(code: int, what: str = "tensor") -> DType:
    try:
        return FROM_ONNX[int(code)]
    except KeyError:
        raise OneModelError(f"{what} has ONNX element type {code}, which OneModel does not "
                            f"support (supported: {', '.join(d.name for d in TO_ONNX)})") from None
