"""ActivationScope releases what a step created; long loops under it hold steady memory."""

import contextlib
import gc

import numpy as np
import pytest

from onemodel.tensors import Generator, ReleasedTensorError, Tensor
from onemodel.training import SGD, ActivationScope, Linear, ReLU, Sequential, losses


def test_released_tensors_raise_and_kept_ones_survive():
    model = Linear(3, 2, Generator(0))
    x = Tensor.randn(4, 3, generator=Generator(1))
    with ActivationScope() as scope:
        hidden = model(x)
        loss = (hidden**2).mean()
        loss.backward()
        scope.keep(loss)
    assert loss.item() > 0
    with pytest.raises(ReleasedTensorError, match="ActivationScope"):
        hidden.numpy().sum()
    with pytest.raises(ReleasedTensorError):
        hidden + 1
    assert model.weight.grad is not None and model.weight.grad.shape == (2, 3)
    assert x.shape == (4, 3)  # created outside the scope


def test_nested_scope_hands_kept_tensors_to_the_outer_one():
    x = Tensor.ones(2)
    with ActivationScope():
        with ActivationScope() as inner:
            y = inner.keep(x * 2)
        assert y.tolist() == [2.0, 2.0]
    with pytest.raises(ReleasedTensorError):
        y.tolist()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.slow
def test_long_training_loop_holds_steady_memory():
    g = Generator(0)
    model = Sequential(Linear(256, 512, g), ReLU(), Linear(512, 256, g))
    opt = SGD(model.parameters(), 0.01, momentum=0.9)
    x = Tensor.randn(128, 256, generator=g)
    history = []  # a common leak: keeping every step's outputs (128 x 256 F32 = 128 KiB each)

    def step(scope=ActivationScope):
        with scope():
            opt.zero_grad()
            out = model(x)
            loss = losses.mse(out, x)
            loss.backward()
            opt.step()
            history.append(out)

    for _ in range(30):
        step()
    gc.collect()
    start = _rss_bytes()
    for _ in range(300):
        step()
    gc.collect()
    grown = _rss_bytes() - start
    assert grown < 16 * 2**20, f"memory grew by {grown / 2**20:.1f} MiB over 300 steps"
    assert np.isfinite(model[0].weight.numpy()).all()

    # the same loop without the scope pins every kept output: the check above can fail
    start = _rss_bytes()
    for _ in range(300):
        step(scope=contextlib.nullcontext)
    gc.collect()
    assert _rss_bytes() - start > 30 * 2**20
