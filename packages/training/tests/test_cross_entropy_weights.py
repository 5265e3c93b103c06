"""cross_entropy and nll against PyTorch, forward and backward, in the cases where summing
``log_probs * W`` (one weight per class and sample) could differ from picking each sample's
log-probability: masked classes (a ``-inf`` logit), every sample ignored (0 / 0), spatial
targets with ignore_index, weights and label smoothing together, float64."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.tensors import Tensor
from onemodel.training import losses

torch = pytest.importorskip("torch")
TF = torch.nn.functional


def _both(x, ours, theirs, rtol=1e-5, atol=1e-6):
    a = Tensor.from_numpy(x.copy())
    a.requires_grad = True
    got = ours(a)
    got.sum().backward() if got.ndim else got.backward()
    b = torch.tensor(x, requires_grad=True)
    want = theirs(b)
    want.sum().backward()
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=rtol, atol=atol)
    np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=rtol, atol=atol)


def test_masked_classes_stay_out_of_the_loss():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    y = np.array([0, 1, 2, 3, 4, 1])
    x[np.arange(6), (y + 2) % 5] = -np.inf  # a class each sample may not take
    for red in ("mean", "sum", "none"):
        _both(x, lambda a, r=red: losses.cross_entropy(a, Tensor.from_numpy(y), reduction=r),
              lambda b, r=red: TF.cross_entropy(b, torch.tensor(y), reduction=r))


def test_every_sample_ignored_gives_nan_as_torch():
    x = np.ones((3, 4), np.float32)
    y = np.full(3, -100)
    got = losses.cross_entropy(Tensor.from_numpy(x), Tensor.from_numpy(y)).item()
    want = TF.cross_entropy(torch.tensor(x), torch.tensor(y)).item()
    assert np.isnan(got) and np.isnan(want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_spatial_weighted_smoothed_with_ignored(dtype, reduction):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 5, 2)).astype(dtype)
    y = rng.integers(0, 4, (3, 5, 2))
    y[0, 1, 1] = y[2, 4, 0] = 7  # ignore_index
    w = rng.uniform(0.5, 2.0, 4).astype(dtype)
    kw = dict(ignore_index=7, reduction=reduction, label_smoothing=0.15)
    _both(x, lambda a: losses.cross_entropy(a, Tensor.from_numpy(y), Tensor.from_numpy(w), **kw),
          lambda b: TF.cross_entropy(b, torch.tensor(y), torch.tensor(w), **kw))
    _both(x, lambda a: losses.nll(a.log_softmax(1), Tensor.from_numpy(y), Tensor.from_numpy(w),
                                  ignore_index=7, reduction=reduction),
          lambda b: TF.nll_loss(b.log_softmax(1), torch.tensor(y), torch.tensor(w),
                                ignore_index=7, reduction=reduction))


def test_class_out_of_range_is_refused():
    from onemodel.tensors import OneModelError

    with pytest.raises(OneModelError, match=r"class indices in \[0, 3\).*got 3"):
        losses.cross_entropy(Tensor.from_numpy(np.zeros((2, 3), np.float32)),
                             Tensor.from_numpy(np.array([0, 3])))
