"""1-D pooling, ConvTranspose1d, Conv padding_mode, Embedding(padding_idx), Identity: forward
and backward (input and parameter gradients) against torch.nn, traced with a symbolic batch and
run in the Session matching eager at several batch sizes."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.tensors import OneModelError, Tensor
from onemodel.training import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    Conv1d,
    Conv2d,
    ConvTranspose1d,
    Embedding,
    Identity,
)

torch = pytest.importorskip("torch")
tnn = torch.nn


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _copy_weights(ours, theirs):
    if list(theirs.state_dict()):
        ours.load_state_dict(theirs.state_dict())


def check(ours, theirs, shape, *, trace=True, rtol=1e-5, atol=1e-5):
    """Same state-dict names; forward, input gradient and parameter gradients equal torch's;
    the traced graph (symbolic batch) equals eager at batch 1 and 5."""
    assert list(ours.state_dict()) == list(theirs.state_dict())
    _copy_weights(ours, theirs)
    a = f32(*shape)
    x, tx = Tensor(a.copy(), requires_grad=True), torch.tensor(a.copy(), requires_grad=True)
    y, ty = ours(x), theirs(tx)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=rtol, atol=atol)
    w = f32(*ty.shape, seed=7)
    (y * Tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=rtol, atol=atol)
    for (name, p), tp in zip(ours.named_parameters(), theirs.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=rtol, atol=atol,
                                   err_msg=name)
    if trace:
        traced = ours.eval().trace(Tensor(a), "batch", *([None] * (len(shape) - 1)))
        for n in (1, 5):
            b = f32(n, *shape[1:], seed=n)
            np.testing.assert_allclose(traced.run({"input": b})["output"].numpy(),
                                       ours(Tensor(b)).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make", [
    lambda m: m.MaxPool1d(3),
    lambda m: m.MaxPool1d(3, stride=2, padding=1),
    lambda m: m.MaxPool1d(2, stride=2, dilation=2, ceil_mode=True),
    lambda m: m.AvgPool1d(3),
    lambda m: m.AvgPool1d(4, stride=3, padding=2, ceil_mode=True, count_include_pad=False),
    lambda m: m.AdaptiveAvgPool1d(4),
    lambda m: m.AdaptiveAvgPool1d(5),  # windows of unequal length over 11
    lambda m: m.AdaptiveAvgPool1d(1),
], ids=["max", "max-pad", "max-dil-ceil", "avg", "avg-ceil-nopad", "adaptive-4", "adaptive-5",
        "adaptive-1"])
def test_pool1d(make):
    import onemodel.training as ot

    check(make(ot), make(tnn), (2, 3, 11))


@pytest.mark.parametrize("size", [(3, 4), 1, (5, 2), (None, 3)])
def test_adaptive_avg_pool2d(size):
    check(AdaptiveAvgPool2d(size), tnn.AdaptiveAvgPool2d(size), (2, 3, 9, 7))


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1, output_padding=1),
                                dict(stride=3, dilation=2, groups=2, bias=False)])
def test_conv_transpose1d(kw):
    check(ConvTranspose1d(4, 6, 3, **kw), tnn.ConvTranspose1d(4, 6, 3, **kw), (2, 4, 9))


@pytest.mark.parametrize("mode", ["zeros", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("kw", [dict(padding=2), dict(padding="same", dilation=2),
                                dict(padding=1, stride=2, groups=2)])
def test_conv1d_padding_mode(mode, kw):
    check(Conv1d(4, 6, 3, padding_mode=mode, **kw), tnn.Conv1d(4, 6, 3, padding_mode=mode, **kw),
          (2, 4, 10))


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("kw", [dict(padding=(1, 2)), dict(padding="same", kernel_size=(3, 4))])
def test_conv2d_padding_mode(mode, kw):
    kw = dict(kernel_size=3) | kw
    check(Conv2d(3, 5, padding_mode=mode, **kw), tnn.Conv2d(3, 5, padding_mode=mode, **kw),
          (2, 3, 7, 8))


def test_padding_mode_refusals():
    with pytest.raises(OneModelError, match="padding_mode"):
        Conv2d(3, 5, 3, padding_mode="mirror")
    with pytest.raises(OneModelError, match="zeros"):
        ConvTranspose1d(3, 5, 3, padding_mode="reflect")
    with pytest.raises(OneModelError, match="divisible by groups"):
        Conv1d(3, 4, 3, groups=2)


@pytest.mark.parametrize("padding_idx", [0, 3, -1])
def test_embedding_padding_idx(padding_idx):
    ours, theirs = Embedding(6, 4, padding_idx=padding_idx), tnn.Embedding(6, 4, padding_idx=padding_idx)
    assert not np.any(ours.weight.numpy()[padding_idx])
    assert ours.padding_idx == theirs.padding_idx
    ours.load_state_dict(theirs.state_dict())
    ids = np.array([[0, 3, 5, 5], [3, 1, 0, 2]])
    y, ty = ours(Tensor(ids)), theirs(torch.tensor(ids))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy())
    w = f32(2, 4, 4, seed=3)
    (y * Tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(ours.weight.grad.numpy(), theirs.weight.grad.numpy(), atol=1e-6)
    with pytest.raises(OneModelError, match="padding_idx"):
        Embedding(6, 4, padding_idx=6)


def test_identity_takes_and_ignores_arguments():
    m = Identity(54, unused_argument1=0.1)
    check(m, tnn.Identity(54, unused_argument1=0.1), (3, 4), trace=False)


def test_adaptive_pooling_over_symbolic_spatial_axes_is_refused_not_frozen():
    """Adaptive windows depend on the input size: a symbolic size would freeze the example's
    windows into the graph, so tracing refuses (output size 1 and fixed sizes trace)."""
    from onemodel.tracing import TraceError

    with pytest.raises(TraceError, match="symbolic height or width"):
        AdaptiveAvgPool2d((4, 5)).trace(Tensor(f32(2, 2, 6, 9)), "batch", None, "h", "w")
    with pytest.raises(TraceError, match="symbolic length"):
        AdaptiveAvgPool1d(3).trace(Tensor(f32(2, 2, 7)), "batch", None, "length")
    traced = AdaptiveAvgPool2d(1).trace(Tensor(f32(2, 2, 6, 9)), "batch", None, "h", "w")
    b = f32(3, 2, 11, 5, seed=4)
    np.testing.assert_allclose(traced.run({"input": b})["output"].numpy(),
                               AdaptiveAvgPool2d(1)(Tensor(b)).numpy(), rtol=1e-6)
