"""Each loss, forward and backward, against torch.nn.functional (float64)."""

import numpy as np
import pytest

from onemodel.tensors import Tensor
from onemodel.training import losses

torch = pytest.importorskip("torch")
TF = torch.nn.functional
rng = np.random.default_rng(0)
X = rng.standard_normal((6, 5))
Y = rng.standard_normal((6, 5))
P = rng.uniform(0.05, 0.95, (6, 5))
B = (rng.random((6, 5)) > 0.5).astype(np.float64)
IDX = np.array([0, 3, 4, 1, -100, 2])
SOFT = np.abs(rng.standard_normal((6, 5)))
SOFT /= SOFT.sum(1, keepdims=True)
W = rng.uniform(0.5, 2.0, 5)
X4 = rng.standard_normal((2, 5, 3, 2))
IDX4 = rng.integers(0, 5, (2, 3, 2))

CASES = {
    "mse": (lambda x: losses.mse(x, Tensor.from_numpy(Y)), lambda x: TF.mse_loss(x, torch.tensor(Y)), X),
    "mse_sum": (lambda x: losses.mse(x, Tensor.from_numpy(Y), "sum"),
                lambda x: TF.mse_loss(x, torch.tensor(Y), reduction="sum"), X),
    "l1": (lambda x: losses.l1(x, Tensor.from_numpy(Y)), lambda x: TF.l1_loss(x, torch.tensor(Y)), X),
    "smooth_l1": (lambda x: losses.smooth_l1(x, Tensor.from_numpy(Y), beta=0.7),
                  lambda x: TF.smooth_l1_loss(x, torch.tensor(Y), beta=0.7), X),
    "cross_entropy": (lambda x: losses.cross_entropy(x, Tensor.from_numpy(IDX)),
                      lambda x: TF.cross_entropy(x, torch.tensor(IDX)), X),
    "cross_entropy_weight_smooth": (
        lambda x: losses.cross_entropy(x, Tensor.from_numpy(IDX), Tensor.from_numpy(W),
                                       label_smoothing=0.2),
        lambda x: TF.cross_entropy(x, torch.tensor(IDX), torch.tensor(W), label_smoothing=0.2), X),
    "cross_entropy_none_ignore": (
        lambda x: losses.cross_entropy(x, Tensor.from_numpy(IDX), reduction="none"),
        lambda x: TF.cross_entropy(x, torch.tensor(IDX), reduction="none"), X),
    "cross_entropy_probs_smooth": (
        lambda x: losses.cross_entropy(x, Tensor.from_numpy(SOFT), label_smoothing=0.1),
        lambda x: TF.cross_entropy(x, torch.tensor(SOFT), label_smoothing=0.1), X),
    "cross_entropy_spatial": (lambda x: losses.cross_entropy(x, Tensor.from_numpy(IDX4)),
                              lambda x: TF.cross_entropy(x, torch.tensor(IDX4)), X4),
    "nll": (lambda x: losses.nll(x.log_softmax(1), Tensor.from_numpy(IDX), Tensor.from_numpy(W)),
            lambda x: TF.nll_loss(x.log_softmax(1), torch.tensor(IDX), torch.tensor(W)), X),
    "bce": (lambda x: losses.binary_cross_entropy(x.sigmoid(), Tensor.from_numpy(B)),
            lambda x: TF.binary_cross_entropy(x.sigmoid(), torch.tensor(B)), X),
    "bce_with_logits": (
        lambda x: losses.binary_cross_entropy_with_logits(x * 8, Tensor.from_numpy(B)),
        lambda x: TF.binary_cross_entropy_with_logits(x * 8, torch.tensor(B)), X),
    "bce_with_logits_pos_weight": (
        lambda x: losses.binary_cross_entropy_with_logits(x, Tensor.from_numpy(P),
                                                          pos_weight=Tensor.from_numpy(W)),
        lambda x: TF.binary_cross_entropy_with_logits(x, torch.tensor(P), pos_weight=torch.tensor(W)),
        X),
}


@pytest.mark.parametrize("name", list(CASES))
def test_loss_matches_torch(name):
    ours_fn, theirs_fn, x = CASES[name]
    ox = Tensor.from_numpy(x.copy()).requires_grad_()
    tx = torch.tensor(x, requires_grad=True)
    o, t = ours_fn(ox), theirs_fn(tx)
    np.testing.assert_allclose(o.numpy(), t.detach().numpy(), rtol=1e-10, atol=1e-12)
    g = np.random.default_rng(1).standard_normal(t.shape)
    o.backward(Tensor.from_numpy(g))
    t.backward(torch.tensor(g))
    np.testing.assert_allclose(ox.grad.numpy(), tx.grad.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("padded", [True, False])
def test_ctc_matches_torch(reduction, padded):
    r = np.random.default_rng(4)
    steps, n, c = 15, 3, 6
    logits = r.standard_normal((steps, n, c))
    target_lengths = np.array([5, 2, 4])
    input_lengths = np.array([15, 9, 12])
    targets = r.integers(1, c, (n, 5))
    targets[0, :2] = 3  # a repeated label needs a blank between
    if not padded:
        targets = np.concatenate([targets[i, :target_lengths[i]] for i in range(n)])
    ox = Tensor.from_numpy(logits.copy()).requires_grad_()
    tx = torch.tensor(logits, requires_grad=True)
    o = losses.ctc(ox.log_softmax(-1), Tensor.from_numpy(targets), input_lengths, target_lengths,
                   reduction=reduction)
    t = TF.ctc_loss(tx.log_softmax(-1), torch.tensor(targets), torch.tensor(input_lengths),
                    torch.tensor(target_lengths), reduction=reduction)
    np.testing.assert_allclose(o.numpy(), t.detach().numpy(), rtol=1e-10)
    g = np.ones(t.shape)
    o.backward(Tensor.from_numpy(g))
    t.backward(torch.tensor(g))
    np.testing.assert_allclose(ox.grad.numpy(), tx.grad.numpy(), rtol=1e-8, atol=1e-12)


def test_ctc_gradient_through_log_softmax_matches_finite_differences():
    r = np.random.default_rng(5)
    logits = r.standard_normal((6, 1, 4))
    tgt = np.array([[1, 2]])

    def f(v):
        return losses.ctc(Tensor.from_numpy(v).log_softmax(-1), Tensor.from_numpy(tgt), [6], [2]).item()

    x = Tensor.from_numpy(logits.copy()).requires_grad_()
    losses.ctc(x.log_softmax(-1), Tensor.from_numpy(tgt), [6], [2]).backward()
    num = np.zeros_like(logits)
    for j in np.ndindex(logits.shape):
        p, m = logits.copy(), logits.copy()
        p[j] += 1e-6
        m[j] -= 1e-6
        num[j] = (f(p) - f(m)) / 2e-6
    np.testing.assert_allclose(x.grad.numpy(), num, rtol=1e-5, atol=1e-7)


def test_loss_shape_mismatch_is_a_clear_error():
    from onemodel.tensors import ShapeError

    with pytest.raises(ShapeError, match=r"mse: input shape \[4, 1\] and target shape \[4\] differ"):
        losses.mse(Tensor.zeros(4, 1), Tensor.zeros(4))
