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


# normalization and pooling ----------------------------------------------------------------------

def _grad_check(ours_fn, theirs_fn, arrays, rtol=1e-9, atol=1e-10):
    """Forward and backward of ours against torch for float64 inputs (all differentiable)."""
    ts = [Tensor.from_numpy(a).requires_grad_() for a in arrays]
    tt = [torch.tensor(a, requires_grad=True) for a in arrays]
    y, ref = ours_fn(*ts), theirs_fn(*tt)
    np.testing.assert_allclose(y.numpy(), ref.detach().numpy(), rtol=rtol, atol=atol)
    up = RNG.standard_normal(ref.shape)
    y.backward(Tensor.from_numpy(up))
    ref.backward(torch.tensor(up))
    for t, r in zip(ts, tt):
        np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=1e-7, atol=1e-9)


def test_group_and_instance_normalization_match_torch():
    x, s, b = RNG.standard_normal((2, 6, 3, 4)), RNG.standard_normal(6), RNG.standard_normal(6)
    _grad_check(lambda x, s, b: run("GroupNormalization", x, s, b, num_groups=3, epsilon=1e-3),
                lambda x, s, b: torch.nn.functional.group_norm(x, 3, s, b, eps=1e-3), [x, s, b])
    _grad_check(lambda x, s, b: run("InstanceNormalization", x, s, b),
                lambda x, s, b: torch.nn.functional.instance_norm(x, weight=s, bias=b, eps=1e-5),
                [x, s, b])
    with pytest.raises(ShapeError, match="groups"):
        OPS["GroupNormalization"].infer([TensorSpec((N, 6, 4), DType.F32),
                                         TensorSpec((6,), DType.F32),
                                         TensorSpec((6,), DType.F32)], {"num_groups": 4})


@pytest.mark.parametrize("p", [1, 2])
def test_lp_normalization_matches_torch(p):
    x = RNG.standard_normal((3, 4, 5))
    x[1, :, 2] = 0.0  # a zero norm gives 0, not nan
    ours = run("LpNormalization", x, axis=1, p=p).numpy()
    ref = x / np.maximum(np.linalg.norm(x, ord=p, axis=1, keepdims=True), 1e-300)
    np.testing.assert_allclose(ours, ref, rtol=1e-12)
    x[1, :, 2] = RNG.standard_normal(4)
    _grad_check(lambda t: run("LpNormalization", t, axis=1, p=p),
                lambda t: torch.nn.functional.normalize(t, p=p, dim=1, eps=0.0), [x])


def test_mean_variance_normalization_and_its_gradient():
    x = RNG.standard_normal((2, 3, 4, 5))

    def theirs(t):
        c = t - t.mean(dim=(0, 2, 3), keepdim=True)
        return c / ((c * c).mean(dim=(0, 2, 3), keepdim=True).sqrt() + 1e-9)

    _grad_check(lambda t: run("MeanVarianceNormalization", t), theirs, [x])


def test_lp_pool_matches_torch():
    x = RNG.standard_normal((2, 3, 7, 6))
    for p in (1, 2, 3):
        ours = run("LpPool", x, kernel_shape=(3, 2), strides=(2, 2), p=p).numpy()
        ref = torch.nn.functional.lp_pool2d(torch.tensor(np.abs(x)), p, (3, 2), stride=(2, 2))
        np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-10)
    (spec,) = OPS["LpPool"].infer([TensorSpec((N, 3, L, 8), DType.F32)],
                                  {"kernel_shape": (2, 2), "strides": (2, 2)})
    assert spec.shape[:2] == (N, 3) and spec.shape[3] == 4


def test_max_unpool_inverts_torch_max_pool():
    x = torch.tensor(RNG.standard_normal((2, 3, 6, 8)))
    y, idx = torch.nn.functional.max_pool2d(x, 2, 2, return_indices=True)
    ref = torch.nn.functional.max_unpool2d(y, idx, 2, 2)
    # torch's indices are per (N, C) plane, ONNX's over the whole tensor
    plane = 6 * 8
    flat = idx.numpy() + (np.arange(6) * plane).reshape(2, 3, 1, 1)
    ours = run("MaxUnpool", y.numpy(), flat, kernel_shape=(2, 2), strides=(2, 2))
    np.testing.assert_array_equal(ours.numpy(), ref.numpy())


def test_eye_like_and_reverse_sequence():
    np.testing.assert_array_equal(run("EyeLike", np.zeros((3, 5), np.float32), k=1,
                                      dtype=DType.I32).numpy(),
                                  torch.eye(3, 5, dtype=torch.int32).roll(1, 1).numpy()
                                  * (np.arange(5) > 0))
    x = RNG.standard_normal((4, 3, 2))  # (time, batch, feature)
    lens = ints([4, 1, 2])
    got = run("ReverseSequence", x, lens).numpy()
    for b, n in enumerate(lens):
        np.testing.assert_array_equal(got[:n, b], x[:n, b][::-1])
        np.testing.assert_array_equal(got[n:, b], x[n:, b])
    with pytest.raises(ShapeError, match="lengths"):
        run("ReverseSequence", x, ints([5, 1, 1]))
