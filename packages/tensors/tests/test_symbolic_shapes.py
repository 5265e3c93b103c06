"""Shape rules on symbolic dims: what tracing and the runtime's planner rely on."""

import pytest

from onemodel.tensors import OPS, DimExpr, DType, ShapeError, TensorSpec
from onemodel.tensors.symbolic import evaluate

B = DimExpr.symbol("batch")
T = DimExpr.symbol("time")


def spec(*shape, dtype=DType.F32, value=None):
    return TensorSpec(tuple(shape), dtype, value)


def test_dim_arithmetic_folds_and_compares():
    assert B * 2 == 2 * B and (B * 2) // 2 == B and B + 0 == B and B * 1 == B
    assert str(B * 2 + 1) == "(2 * batch) + 1"
    assert (B * 2 + 1) != (B * 2)
    assert evaluate((B * T) // 4 + 3, {"batch": 4, "time": 6}) == 9
    with pytest.raises(ShapeError, match="symbol 'time' is not bound"):
        evaluate(B + T, {"batch": 1})


def test_broadcast_and_matmul_keep_symbols():
    (out,) = OPS["Add"].infer([spec(B, 1, 4), spec(3, 1)])
    assert out.shape == (B, 3, 4)
    (out,) = OPS["MatMul"].infer([spec(B, T, 8), spec(8, 16)])
    assert out.shape == (B, T, 16)
    with pytest.raises(ShapeError, match=r"MatMul: inner dimensions 8 and 9"):
        OPS["MatMul"].infer([spec(B, 8), spec(9, 2)])
    with pytest.raises(ShapeError, match=r"cannot be broadcast"):
        OPS["Add"].infer([spec(B, 2), spec(T, 3)])


def test_broadcast_of_sizes_only_real_sizes_reconcile():
    # two symbols may be equal or either 1: an expression equal to neither, settled by the plan
    (out,) = OPS["Add"].infer([spec(B, 3), spec(T, 3)])
    assert str(out.shape[0]) == "broadcast(batch, time)" and out.shape[0] not in (B, T)
    assert [evaluate(out.shape[0], {"batch": b, "time": t})
            for b, t in ((1, 5), (5, 1), (5, 5), (0, 1))] == [5, 5, 5, 0]
    with pytest.raises(ShapeError, match=r"sizes 2, 3 of broadcast\(batch, time\)"):
        evaluate(out.shape[0], {"batch": 2, "time": 3})
    (again,) = OPS["Mul"].infer([out, spec(B, 1)])
    assert again.shape == out.shape  # broadcast(broadcast(batch, time), batch) folds
    # a symbol against a constant other than 1 is that constant (the symbol must be 1 or it)
    (out,) = OPS["Add"].infer([spec(B, 3), spec(2, 4, 1)])
    assert out.shape == (2, 4, 3)
    (out,) = OPS["Where"].infer([spec(B, 1, dtype=DType.BOOL), spec(T, 1), spec(1, 7)])
    assert str(out.shape[0]) == "broadcast(batch, time)" and out.shape[1] == 7


def test_reshape_infers_a_symbolic_minus_one():
    (out,) = OPS["Reshape"].infer([spec(B, 3, 4), spec(2, dtype=DType.I64, value=(0, -1))])
    assert out.shape == (B, 12)
    (out,) = OPS["Reshape"].infer([spec(B, 3, 4), spec(2, dtype=DType.I64, value=(B * 3, -1))])
    assert out.shape == (B * 3, 4)


def test_conv_and_pool_output_sizes_are_expressions():
    x = spec(B, 3, T, 32)
    (out,) = OPS["Conv"].infer([x, spec(8, 3, 3, 3)], {"pads": (1, 1, 1, 1), "strides": (2, 2)})
    assert out.shape[:2] == (B, 8) and out.shape[3] == 16
    assert evaluate(out.shape[2], {"time": 17}) == 9
    (out,) = OPS["MaxPool"].infer([x], {"kernel_shape": (2, 2), "strides": (2, 2)})
    assert evaluate(out.shape[2], {"time": 9}) == 4 and out.shape[3] == 16


def test_shape_op_carries_symbolic_values():
    (out,) = OPS["Shape"].infer([spec(B, 3)])
    assert out.shape == (2,) and out.value == (B, 3) and out.dtype is DType.I64


def test_concat_adds_symbolic_axes():
    (out,) = OPS["Concat"].infer([spec(B, 2), spec(T, 2)], {"axis": 0})
    assert out.shape == (B + T, 2)
