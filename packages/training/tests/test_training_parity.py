"""Train the same networks here and in PyTorch from the same initial weights on the same data with
the same optimizer (float32, as users train): the loss at every step agrees to 1e-4 relative and
the final weights to 1e-3."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel import training as T
from onemodel.tensors import Tensor
from onemodel.training import losses

torch = pytest.importorskip("torch")
nn = torch.nn
TF = torch.nn.functional


def _copy_weights(ours, theirs):
    ours.load_state_dict({k: v.detach().numpy().copy() for k, v in theirs.state_dict().items()})


def _run(ours, theirs, o_opt, t_opt, batches, o_loss, t_loss, steps):
    o_losses, t_losses = [], []
    for step in range(steps):
        xs = batches(step)
        with T.ActivationScope():
            o_opt.zero_grad()
            lo = o_loss(ours, *[Tensor.from_numpy(a) for a in xs])
            lo.backward()
            o_opt.step()
            o_losses.append(lo.item())
        t_opt.zero_grad()
        lt = t_loss(theirs, *[torch.from_numpy(a) for a in xs])
        lt.backward()
        t_opt.step()
        t_losses.append(lt.item())
    np.testing.assert_allclose(o_losses, t_losses, rtol=1e-4)
    theirs_sd = theirs.state_dict()
    for name, value in ours.state_dict().items():
        np.testing.assert_allclose(value.numpy(), theirs_sd[name].detach().numpy(), rtol=1e-3,
                                   atol=1e-4, err_msg=name)
    assert o_losses[-1] < o_losses[0]


def _classification_batches(n_in, n_classes, batch, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n_in, n_classes)).astype(np.float32)

    def make(step):
        r = np.random.default_rng(1000 + step)
        x = r.standard_normal((batch, n_in)).astype(np.float32)
        return x, np.argmax(x @ w, axis=1).astype(np.int64)

    return make


def _ce(model, x, y):
    out = model(x)
    return losses.cross_entropy(out, y) if isinstance(out, Tensor) else TF.cross_entropy(out, y)


@pytest.mark.parametrize("optimizer", ["sgd_momentum", "adam"])
def test_mlp(optimizer):
    torch.manual_seed(0)
    theirs = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(),
                           nn.Linear(32, 5))
    ours = T.Sequential(T.Linear(20, 32), T.ReLU(), T.Linear(32, 32), T.Tanh(), T.Linear(32, 5))
    _copy_weights(ours, theirs)
    if optimizer == "adam":
        o_opt, t_opt = T.Adam(ours.parameters(), 1e-2), torch.optim.Adam(theirs.parameters(), 1e-2)
    else:
        o_opt = T.SGD(ours.parameters(), 0.05, momentum=0.9, weight_decay=1e-4)
        t_opt = torch.optim.SGD(theirs.parameters(), 0.05, momentum=0.9, weight_decay=1e-4)
    _run(ours, theirs, o_opt, t_opt, _classification_batches(20, 5, 16), _ce, _ce, 25)


def test_cnn_with_batchnorm_and_max_pooling():
    torch.manual_seed(1)

    def build(lib):
        return lib.Sequential(lib.Conv2d(1, 4, 3, padding=1), lib.BatchNorm2d(4), lib.ReLU(),
                              lib.MaxPool2d(2), lib.Conv2d(4, 8, 3), lib.BatchNorm2d(8), lib.ReLU(),
                              lib.MaxPool2d(2), lib.Flatten(), lib.Linear(8, 3))

    theirs, ours = build(nn), build(T)
    _copy_weights(ours, theirs)
    o_opt = T.SGD(ours.parameters(), 0.05, momentum=0.9)
    t_opt = torch.optim.SGD(theirs.parameters(), 0.05, momentum=0.9)

    def batches(step):
        r = np.random.default_rng(step)
        x = r.standard_normal((8, 1, 8, 8)).astype(np.float32)
        return x, (x[:, 0, :4].sum(axis=(1, 2)) > 0).astype(np.int64) + (x[:, 0, 4:, :4].mean(
            axis=(1, 2)) > 0.2)

    _run(ours, theirs, o_opt, t_opt, batches, _ce, _ce, 12)


def test_transformer_encoder_layer():
    torch.manual_seed(2)
    theirs = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    ours = T.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    _copy_weights(ours, theirs)
    # SGD, not Adam: the key part of in_proj_bias has an exactly zero gradient (softmax ignores a
    # per-row constant), and Adam would scale both libraries' rounding noise there up to lr-sized,
    # unrelated steps.
    o_opt = T.SGD(ours.parameters(), 0.05, momentum=0.9)
    t_opt = torch.optim.SGD(theirs.parameters(), 0.05, momentum=0.9)

    def batches(step):
        r = np.random.default_rng(step)
        x = r.standard_normal((4, 6, 16)).astype(np.float32)
        return x, np.roll(x, 1, axis=1)

    def o_loss(m, x, y):
        return losses.mse(m(x), y)

    def t_loss(m, x, y):
        return TF.mse_loss(m(x), y)

    _run(ours, theirs, o_opt, t_opt, batches, o_loss, t_loss, 15)


def test_ctc_training():
    torch.manual_seed(3)
    theirs = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 5))
    ours = T.Sequential(T.Linear(6, 16), T.Tanh(), T.Linear(16, 5))
    _copy_weights(ours, theirs)
    o_opt, t_opt = T.Adam(ours.parameters(), 1e-2), torch.optim.Adam(theirs.parameters(), 1e-2)
    steps_t, n = 12, 3
    in_len = np.array([12, 10, 11])
    tgt_len = np.array([4, 3, 2])

    def batches(step):
        r = np.random.default_rng(step)
        x = r.standard_normal((steps_t, n, 6)).astype(np.float32)
        return x, r.integers(1, 5, (n, 4)).astype(np.int64)

    def o_loss(m, x, y):
        return losses.ctc(m(x).log_softmax(-1), y, in_len, tgt_len)

    def t_loss(m, x, y):
        return TF.ctc_loss(m(x).log_softmax(-1), y, torch.tensor(in_len), torch.tensor(tgt_len))

    _run(ours, theirs, o_opt, t_opt, batches, o_loss, t_loss, 15)
