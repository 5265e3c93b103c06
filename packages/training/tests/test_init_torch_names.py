"""torch.nn.init's names: the same distributions as torch (checked statistically against torch's
own samples, since the random streams differ), filled in place."""

import math

import numpy as np
import pytest

from onemodel.tensors import Generator, OneModelError, Tensor
from onemodel.training import Conv2d, Linear, Parameter, init

torch = pytest.importorskip("torch")

SHAPE = (256, 128, 3)  # fan_in 384, fan_out 768; ~98k samples


def _pair(name, *args, **kw):
    ours = Parameter(np.zeros(SHAPE, np.float32))
    out = getattr(init, name)(ours, *args, generator=Generator(0), **kw)
    assert out is ours
    theirs = torch.zeros(SHAPE)
    torch.manual_seed(0)
    getattr(torch.nn.init, name)(theirs, *args, **kw)
    return ours.numpy(), theirs.numpy()


@pytest.mark.parametrize("name,args,kw", [
    ("uniform_", (-0.5, 2.0), {}),
    ("normal_", (0.3, 2.0), {}),
    ("xavier_uniform_", (), dict(gain=2.0)),
    ("xavier_normal_", (), {}),
    ("kaiming_uniform_", (), dict(a=math.sqrt(5))),
    ("kaiming_uniform_", (), dict(mode="fan_out", nonlinearity="relu")),
    ("kaiming_normal_", (), {}),
    ("kaiming_normal_", (), dict(a=0.2, mode="fan_out")),
    ("trunc_normal_", (), dict(mean=0.5, std=1.0, a=-1.0, b=1.5)),
    ("trunc_normal_", (), dict(std=0.02)),
])
def test_distribution_matches_torch(name, args, kw):
    ours, theirs = _pair(name, *args, **kw)
    assert ours.dtype == np.float32
    t_std = float(theirs.std())
    assert abs(ours.mean() - theirs.mean()) < 0.02 * t_std + 1e-3 * abs(float(theirs.mean()))
    assert ours.std() == pytest.approx(t_std, rel=0.02)
    q = [0.01, 0.1, 0.5, 0.9, 0.99]  # same shape of distribution
    np.testing.assert_allclose(np.quantile(ours, q), np.quantile(theirs, q), atol=0.04 * t_std)
    if name == "trunc_normal_":  # torch's bounds are absolute values, not standard deviations
        assert kw.get("a", -2.0) <= ours.min() and ours.max() <= kw.get("b", 2.0)
    if "uniform" in name or ("a" in kw and name == "trunc_normal_"):  # same support
        span = t_std * 0.02
        assert theirs.min() - span <= ours.min() < theirs.min() + span
        assert theirs.max() - span < ours.max() <= theirs.max() + span


@pytest.mark.parametrize("shape", [(8, 20), (20, 8), (6, 3, 2, 2)])
@pytest.mark.parametrize("gain", [1.0, 0.5])
def test_orthogonal(shape, gain):
    w = Parameter(np.zeros(shape, np.float64))
    init.orthogonal_(w, gain=gain, generator=Generator(1))
    m = w.numpy().reshape(shape[0], -1)
    small = min(m.shape)
    gram = m @ m.T if m.shape[0] == small else m.T @ m
    np.testing.assert_allclose(gram, gain**2 * np.eye(small), atol=1e-12)
    t = torch.zeros(shape, dtype=torch.float64)
    torch.nn.init.orthogonal_(t, gain=gain)  # torch's result has the same property
    tm = t.numpy().reshape(shape[0], -1)
    tgram = tm @ tm.T if tm.shape[0] == small else tm.T @ tm
    np.testing.assert_allclose(tgram, gain**2 * np.eye(small), atol=1e-12)


def test_constant_zeros_ones_eye_and_gain():
    w = Parameter(np.full((3, 4), 7.0, np.float32))
    np.testing.assert_array_equal(init.zeros_(w).numpy(), np.zeros((3, 4)))
    np.testing.assert_array_equal(init.ones_(w).numpy(), np.ones((3, 4)))
    np.testing.assert_array_equal(init.constant_(w, 0.25).numpy(), np.full((3, 4), 0.25))
    np.testing.assert_array_equal(init.eye_(w).numpy(), torch.nn.init.eye_(torch.empty(3, 4)))
    for nl, p in [("relu", None), ("tanh", None), ("leaky_relu", 0.2), ("leaky_relu", None),
                  ("selu", None), ("conv2d", None), ("sigmoid", None)]:
        assert init.calculate_gain(nl, p) == pytest.approx(torch.nn.init.calculate_gain(nl, p))


def test_fills_layer_parameters_in_place_and_keeps_them_trainable():
    lin, conv = Linear(6, 4), Conv2d(2, 3, 3)
    for m in (lin, conv):
        before = m.weight
        init.kaiming_normal_(m.weight, nonlinearity="relu", generator=Generator(2))
        init.zeros_(m.bias)
        assert m.weight is before and m.weight.requires_grad
        assert not np.any(m.bias.numpy())
    assert conv.weight.numpy().std() == pytest.approx(math.sqrt(2 / 18), rel=0.5)


def test_refusals_name_the_problem():
    with pytest.raises(OneModelError, match="rank >= 2"):
        init.xavier_uniform_(Parameter(np.zeros(5, np.float32)))
    with pytest.raises(OneModelError, match="floating-point"):
        init.normal_(Tensor.from_numpy(np.zeros(3, np.int64)))
    with pytest.raises(OneModelError, match="onemodel Tensor"):
        init.ones_(np.zeros(3))
    with pytest.raises(OneModelError, match="mode"):
        init.kaiming_uniform_(Parameter(np.zeros((2, 2), np.float32)), mode="fan")
    with pytest.raises(OneModelError, match="nonlinearity"):
        init.calculate_gain("swish")
    with pytest.raises(OneModelError, match="mass"):
        init.trunc_normal_(Parameter(np.zeros(3, np.float32)), a=10.0, b=11.0)
