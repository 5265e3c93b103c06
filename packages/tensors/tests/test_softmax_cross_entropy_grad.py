"""SoftmaxCrossEntropyLoss's gradient rule against PyTorch: the scores' gradient for each
reduction, with class weights and an ignored label, over (N, C) and (N, C, d) scores; the
log-probability output used on as well as the loss; a second derivative through the rule
(create_graph); and the reference SoftmaxCrossEntropyLossGrad kernel against the composite
form it replaces."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from onemodel.tensors import Tensor
from onemodel.tensors.dispatch import dispatch
from onemodel.tensors.ops import OPS


def _t(a, grad=False):
    t = Tensor.from_numpy(a)
    t.requires_grad = grad
    return t


def _sce(scores, labels, weights=None, **attrs):
    return dispatch("SoftmaxCrossEntropyLoss", (scores, _t(labels),
                                                None if weights is None else _t(weights)),
                    attrs)


def _torch_loss(x, y, w, ignore_index, reduction):
    return torch.nn.functional.nll_loss(
        torch.log_softmax(x, 1), torch.tensor(y), None if w is None else torch.tensor(w),
        ignore_index=-100 if ignore_index is None else ignore_index, reduction=reduction)


CASES = [((6, 5), "mean", False, None), ((6, 5), "sum", True, 2), ((6, 5), "none", True, 1),
         ((4, 3, 5), "mean", True, 0), ((4, 3, 5), "none", False, None), ((3, 1000), "mean",
                                                                          False, None)]


@pytest.mark.parametrize("shape, reduction, weighted, ignore", CASES)
def test_scores_gradient_matches_torch(shape, reduction, weighted, ignore):
    rng = np.random.default_rng(len(shape) * 10 + shape[1])
    x = rng.standard_normal(shape)
    y = rng.integers(0, shape[1], (shape[0], *shape[2:]))
    w = rng.uniform(0.2, 2.0, shape[1]) if weighted else None
    up = rng.standard_normal(y.shape) if reduction == "none" else np.asarray(1.3)
    attrs = dict(reduction=reduction) if ignore is None else dict(reduction=reduction,
                                                                   ignore_index=ignore)
    ours = _t(x, grad=True)
    loss, _ = _sce(ours, y, w, **attrs)
    (loss * _t(up)).sum().backward()
    theirs = torch.tensor(x, requires_grad=True)
    want = _torch_loss(theirs, y, w, ignore, reduction)
    (want * torch.tensor(up)).sum().backward()
    np.testing.assert_allclose(loss.numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_log_prob_output_used_on_gets_its_gradient_too():
    rng = np.random.default_rng(3)
    x, r = rng.standard_normal((5, 4)), rng.standard_normal((5, 4))
    y = rng.integers(0, 4, 5)
    ours = _t(x, grad=True)
    loss, log_prob = _sce(ours, y, reduction="sum")
    (loss + (log_prob * _t(r)).sum()).backward()
    theirs = torch.tensor(x, requires_grad=True)
    lp = torch.log_softmax(theirs, 1)
    (torch.nn.functional.nll_loss(lp, torch.tensor(y), reduction="sum") +
     (lp * torch.tensor(r)).sum()).backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_second_derivative_matches_torch(reduction):
    rng = np.random.default_rng(4)
    x, v = rng.standard_normal((5, 6)), rng.standard_normal((5, 6))
    y = np.array([0, 3, 2, 5, 3])
    w = rng.uniform(0.5, 1.5, 6)
    ours = _t(x, grad=True)
    loss, _ = _sce(ours, y, w, reduction=reduction, ignore_index=2)
    (loss * loss).sum().backward(create_graph=True)
    g = ours.grad
    ours.grad = None
    (g * _t(v)).sum().backward()
    theirs = torch.tensor(x, requires_grad=True)
    tl = _torch_loss(theirs, y, w, 2, reduction)
    (tg,) = torch.autograd.grad((tl * tl).sum(), theirs, create_graph=True)
    (tg * torch.tensor(v)).sum().backward()
    np.testing.assert_allclose(g.numpy(), tg.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_an_ignored_sample_costs_nothing_whatever_its_scores():
    x = np.array([[-np.inf, 0.0, 1.0], [0.5, 0.2, 0.1]])  # class 0 impossible in row 0
    y = np.array([-100, 1])
    loss, _ = OPS["SoftmaxCrossEntropyLoss"].kernel(x, y, ignore_index=-100, reduction="none")
    assert loss[0] == 0.0
    np.testing.assert_allclose(loss[1], -torch.log_softmax(torch.tensor(x[1]), 0)[1].item())


def test_every_sample_ignored_gives_a_nan_loss_and_a_zero_gradient_as_torch():
    x = np.random.default_rng(5).standard_normal((3, 4))
    y = np.full(3, 7)
    ours = _t(x, grad=True)
    loss, _ = _sce(ours, y, reduction="mean", ignore_index=7)
    loss.backward()
    theirs = torch.tensor(x, requires_grad=True)
    _torch_loss(theirs, y, None, 7, "mean").backward()
    assert np.isnan(loss.item())
    np.testing.assert_array_equal(ours.grad.numpy(), theirs.grad.numpy())
    assert not ours.grad.numpy().any()


def test_second_derivative_through_cross_entropy_that_drops_log_prob():
    """training's cross_entropy keeps only the loss: the rule must not take the node's
    log-probabilities for a constant under create_graph."""
    from onemodel.training import losses

    rng = np.random.default_rng(6)
    x, v = rng.standard_normal((4, 5)), rng.standard_normal((4, 5))
    y = np.array([1, 0, 4, 2])
    ours = _t(x, grad=True)
    loss = losses.cross_entropy(ours, _t(y))
    loss.backward(create_graph=True)
    g = ours.grad
    ours.grad = None
    (g * _t(v)).sum().backward()
    theirs = torch.tensor(x, requires_grad=True)
    (tg,) = torch.autograd.grad(torch.nn.functional.cross_entropy(theirs, torch.tensor(y)),
                                theirs, create_graph=True)
    (tg * torch.tensor(v)).sum().backward()
    np.testing.assert_allclose(g.numpy(), tg.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_a_kept_label_outside_the_classes_is_refused_by_the_gradient_too():
    from onemodel.tensors import OneModelError

    with pytest.raises(OneModelError, match=r"class indices in \[0, 3\).*got -1"):
        OPS["SoftmaxCrossEntropyLossGrad"].kernel(np.zeros((2, 3)), np.array([0, -1]),
                                                  np.asarray(1.0))
