"""Ops added for ONNX coverage (Size, Tile, CumProd, Det, norms, pools, signal ops...) against
PyTorch where it has them, and their shape rules on symbolic dims. The ONNX backend node tests
(integration-tests/onnx) check each against ONNX's expected outputs as well."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.tensors import DimExpr, DType, Tensor
from onemodel.tensors.dispatch import dispatch
from onemodel.tensors.errors import ShapeError
from onemodel.tensors.ops import OPS, TensorSpec

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
N, L = DimExpr.symbol("n"), DimExpr.symbol("l")


def run(op, *inputs, **attrs):
    """Call op eagerly; numpy arrays become Tensors, None stays an omitted input."""
    ts = [None if x is None else x if isinstance(x, Tensor) else Tensor.from_numpy(np.asarray(x))
          for x in inputs]
    out = dispatch(op, ts, attrs)
    return out


def ints(values):
    return np.asarray(values, np.int64)


# Size, Tile -------------------------------------------------------------------------------------

def test_size_value_is_known_from_a_symbolic_shape():
    (spec,) = OPS["Size"].infer([TensorSpec((N, 3, L), DType.F32)])
    assert spec.shape == () and spec.dtype is DType.I64
    assert spec.value == (N * 3 * L,)
    assert run("Size", np.zeros((2, 3, 4), np.float32)).numpy().item() == 24


def test_tile_matches_torch_and_its_gradient():
    x = RNG.standard_normal((2, 3))
    t = Tensor.from_numpy(x).requires_grad_()
    y = run("Tile", t, ints([2, 3]))
    tx = torch.tensor(x, requires_grad=True)
    ref = tx.tile((2, 3))
    np.testing.assert_array_equal(y.numpy(), ref.detach().numpy())
    up = RNG.standard_normal(ref.shape)
    y.backward(Tensor.from_numpy(up))
    ref.backward(torch.tensor(up))
    np.testing.assert_allclose(t.grad.numpy(), tx.grad.numpy(), rtol=1e-12)


def test_tile_shape_rule_on_symbolic_dims_and_values():
    reps = TensorSpec((2,), DType.I64, (3, 2))
    (spec,) = OPS["Tile"].infer([TensorSpec((N, 4), DType.F32), reps])
    assert spec.shape == (N * 3, 8)
    # a shape tensor tiled keeps its (symbolic) value
    (spec,) = OPS["Tile"].infer([TensorSpec((2,), DType.I64, (N, 5)),
                                 TensorSpec((1,), DType.I64, (2,))])
    assert spec.value == (N, 5, N, 5)
    with pytest.raises(ShapeError, match="one entry per axis"):
        OPS["Tile"].infer([TensorSpec((N, 4), DType.F32), TensorSpec((1,), DType.I64, (2,))])


# CumProd, Det -----------------------------------------------------------------------------------

@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumprod_forward_and_gradient_match_torch(exclusive, reverse):
    x = RNG.standard_normal((3, 5))
    x[1, 2] = 0.0  # the gradient must not divide by x
    x[2, 1] = x[2, 3] = 0.0
    t = Tensor.from_numpy(x).requires_grad_()
    y = run("CumProd", t, ints(1), exclusive=exclusive, reverse=reverse)
    tx = torch.tensor(x, requires_grad=True)
    v = tx.flip(1) if reverse else tx
    if exclusive:
        v = torch.cat([torch.ones_like(v[:, :1]), v[:, :-1]], dim=1)
    ref = torch.cumprod(v, dim=1)
    ref = ref.flip(1) if reverse else ref
    np.testing.assert_allclose(y.numpy(), ref.detach().numpy(), rtol=1e-12)
    up = RNG.standard_normal(ref.shape)
    y.backward(Tensor.from_numpy(up))
    ref.backward(torch.tensor(up))
    np.testing.assert_allclose(t.grad.numpy(), tx.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_det_matches_torch():
    x = RNG.standard_normal((2, 3, 4, 4))
    np.testing.assert_allclose(run("Det", x).numpy(), torch.linalg.det(torch.tensor(x)).numpy(),
                               rtol=1e-10)
    (spec,) = OPS["Det"].infer([TensorSpec((N, 3, 3), DType.F32)])
    assert spec.shape == (N,)
    with pytest.raises(ShapeError, match="square"):
        OPS["Det"].infer([TensorSpec((2, 3), DType.F32)])
