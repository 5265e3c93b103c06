"""Autograd behaviour users rely on, checked against PyTorch where it has an answer."""

import numpy as np
import pytest

from onemodel.tensors import AutogradError, Tensor, enable_grad, is_grad_enabled, no_grad

torch = pytest.importorskip("torch")


def test_gradients_accumulate_until_cleared():
    w = Tensor.from_data([1.0, 2.0]).requires_grad_()
    (w * 3).sum().backward()
    (w * w).sum().backward()
    assert w.grad.tolist() == [5.0, 7.0]


def test_shared_subexpressions_get_the_sum_of_their_gradients():
    x = np.array([0.3, -1.2, 2.0])
    ours = Tensor.from_numpy(x.copy()).requires_grad_()
    theirs = torch.tensor(x, requires_grad=True)
    for t, lib in ((ours, "ours"), (theirs, "torch")):
        a = t * 2
        b = a.exp() if lib == "ours" else torch.exp(a)
        c = (a * b + a).sum()
        c.backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy())


def test_no_grad_and_detach_stop_the_tape():
    w = Tensor.ones(2).requires_grad_()
    with no_grad():
        assert not is_grad_enabled()
        y = w * 2
        with enable_grad():
            assert (w * 2).requires_grad
    assert is_grad_enabled()
    assert not y.requires_grad
    assert not (w.detach() * 2).requires_grad

    @no_grad()
    def f(t):
        return t * 2

    assert not f(w).requires_grad


def test_backward_needs_a_scalar_or_a_gradient():
    w = Tensor.ones(2).requires_grad_()
    with pytest.raises(AutogradError, match="one-element output"):
        (w * 2).backward()
    (w * 2).backward(Tensor.from_data([1.0, 0.5]))
    assert w.grad.tolist() == [2.0, 1.0]
    with pytest.raises(AutogradError, match="does not require grad"):
        Tensor.ones(2).sum().backward()


def test_second_backward_needs_retain_graph():
    w = Tensor.ones(2).requires_grad_()
    y = (w * w).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert w.grad.tolist() == [4.0, 4.0]
    with pytest.raises(AutogradError, match="retain_graph=True"):
        y.backward()


def test_create_graph_gives_second_derivatives_like_torch():
    x = np.array([0.5, -0.3, 1.2])
    ours = Tensor.from_numpy(x.copy()).requires_grad_()
    theirs = torch.tensor(x, requires_grad=True)
    y = (ours.tanh() * ours).sum()
    y.backward(create_graph=True)
    g = ours.grad
    ours.grad = None
    g.sum().backward()
    ty = (torch.tanh(theirs) * theirs).sum()
    (tg,) = torch.autograd.grad(ty, theirs, create_graph=True)
    tg.sum().backward()
    np.testing.assert_allclose(g.numpy(), tg.detach().numpy())
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy())


def test_second_derivatives_through_relu_like_torch():
    """Relu's gradient (the ReluGrad op) is itself differentiable in the incoming gradient,
    as a gradient penalty needs: d/dx of sum(dL/dx) for L = sum(relu(x)^2 * w)."""
    x = np.array([-1.5, -0.2, 0.0, 0.4, 2.0])
    w = np.array([0.3, -2.0, 1.0, 0.7, -1.1])
    ours = Tensor.from_numpy(x.copy()).requires_grad_()
    theirs = torch.tensor(x, requires_grad=True)
    r = ours.relu()
    (r * r * Tensor.from_numpy(w)).sum().backward(create_graph=True)
    g = ours.grad
    ours.grad = None
    (g * g).sum().backward()
    tr = torch.relu(theirs)
    (tg,) = torch.autograd.grad((tr * tr * torch.tensor(w)).sum(), theirs, create_graph=True)
    (tg * tg).sum().backward()
    np.testing.assert_allclose(g.numpy(), tg.detach().numpy())
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy())


def test_integer_tensors_cannot_require_grad():
    with pytest.raises(AutogradError, match="floating"):
        Tensor.zeros(2, dtype="I64").requires_grad_()
