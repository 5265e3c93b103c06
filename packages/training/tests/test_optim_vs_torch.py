"""Optimizers, schedulers and clipping step for step against torch.optim on the same gradients."""

import math

import numpy as np
import pytest

from onemodel.tensors import Tensor
from onemodel.training import (
    SGD,
    Adam,
    AdamW,
    CosineAnnealingLR,
    LambdaLR,
    Parameter,
    RMSprop,
    StepLR,
    clip_grad_norm_,
)

torch = pytest.importorskip("torch")

CONFIGS = [
    (SGD, torch.optim.SGD, dict(lr=0.1)),
    (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.5, maximize=True)),
    (Adam, torch.optim.Adam, dict(lr=0.01)),
    (Adam, torch.optim.Adam, dict(lr=0.01, betas=(0.8, 0.9), weight_decay=0.1, amsgrad=True)),
    (AdamW, torch.optim.AdamW, dict(lr=0.01)),
    (AdamW, torch.optim.AdamW, dict(lr=0.01, weight_decay=0.3, amsgrad=True)),
    (RMSprop, torch.optim.RMSprop, dict(lr=0.01)),
    (RMSprop, torch.optim.RMSprop, dict(lr=0.01, momentum=0.9, centered=True, weight_decay=0.1)),
]


@pytest.mark.parametrize("ours_cls,theirs_cls,kw", CONFIGS,
                         ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CONFIGS)])
def test_optimizer_steps_match_torch(ours_cls, theirs_cls, kw):
    rng = np.random.default_rng(0)
    init = [rng.standard_normal((3, 4)), rng.standard_normal(4)]
    ours = [Parameter(a.copy()) for a in init]
    theirs = [torch.tensor(a.copy(), requires_grad=True) for a in init]
    o_opt, t_opt = ours_cls(ours, **kw), theirs_cls(theirs, **kw)
    for _ in range(6):
        grads = [rng.standard_normal(a.shape) for a in init]
        o_opt.zero_grad()
        t_opt.zero_grad()
        for p, g in zip(ours, grads):
            p.grad = Tensor.from_numpy(g.copy())
        for p, g in zip(theirs, grads):
            p.grad = torch.tensor(g)
        o_opt.step()
        t_opt.step()
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.numpy(), t.detach().numpy(), rtol=1e-12, atol=1e-14)


def test_optimizer_state_dict_round_trip_continues_identically():
    rng = np.random.default_rng(1)
    a = [Parameter(rng.standard_normal(3))]
    b = [Parameter(a[0].numpy().copy())]
    opt_a, opt_b = Adam(a, lr=0.1), Adam(b, lr=0.1)
    for p, opt in ((a[0], opt_a), (b[0], opt_b)):
        p.grad = Tensor.from_numpy(np.ones(3))
        opt.step()
    opt_b.load_state_dict(opt_a.state_dict())
    for p, opt in ((a[0], opt_a), (b[0], opt_b)):
        p.grad = Tensor.from_numpy(np.full(3, 0.5))
        opt.step()
    np.testing.assert_array_equal(a[0].numpy(), b[0].numpy())


@pytest.mark.parametrize("name", ["step", "cosine", "lambda"])
def test_schedulers_match_torch(name):
    p = Parameter(np.zeros(2))
    tp = torch.zeros(2, requires_grad=True)
    o_opt, t_opt = SGD([p], lr=0.5), torch.optim.SGD([tp], lr=0.5)
    if name == "step":
        o_s, t_s = StepLR(o_opt, 3, 0.5), torch.optim.lr_scheduler.StepLR(t_opt, 3, 0.5)
    elif name == "cosine":
        o_s = CosineAnnealingLR(o_opt, 10, 0.01)
        t_s = torch.optim.lr_scheduler.CosineAnnealingLR(t_opt, 10, 0.01)
    else:
        o_s, t_s = LambdaLR(o_opt, lambda e: 0.9**e), torch.optim.lr_scheduler.LambdaLR(
            t_opt, lambda e: 0.9**e)
    for _ in range(12):
        assert math.isclose(o_s.get_last_lr()[0], t_s.get_last_lr()[0], rel_tol=1e-12)
        t_opt.step()
        o_s.step()
        t_s.step()


def test_clip_grad_norm_matches_torch():
    rng = np.random.default_rng(2)
    grads = [rng.standard_normal((3, 3)) * 5, rng.standard_normal(4)]
    ours = [Parameter(np.zeros(g.shape)) for g in grads]
    theirs = [torch.zeros(g.shape, dtype=torch.float64, requires_grad=True) for g in grads]
    for p, g in zip(ours, grads):
        p.grad = Tensor.from_numpy(g.copy())
    for p, g in zip(theirs, grads):
        p.grad = torch.tensor(g)
    total = clip_grad_norm_(ours, 1.0)
    ttotal = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert math.isclose(total.item(), ttotal.item(), rel_tol=1e-12)
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=1e-12)
