"""Adagrad, NAdam, RAdam, the schedulers, clip_grad_value_ and optimizer state in torch's layout,
step for step against torch.optim."""

import math

import numpy as np
import pytest

from onemodel.tensors import OneModelError, Tensor
from onemodel.training import (
    SGD,
    Adagrad,
    Adam,
    ExponentialLR,
    LinearLR,
    MultiStepLR,
    NAdam,
    OneCycleLR,
    Parameter,
    RAdam,
    ReduceLROnPlateau,
    SequentialLR,
    StepLR,
    clip_grad_value_,
)

torch = pytest.importorskip("torch")


@pytest.fixture
def torch_f64():
    """torch keeps NAdam's mu_product and every step count in the default dtype: float64 here,
    so the comparison can be to the last bits."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


CONFIGS = [
    (Adagrad, torch.optim.Adagrad, dict(lr=0.1)),
    (Adagrad, torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.05, weight_decay=0.1,
                                        initial_accumulator_value=0.3, eps=1e-6)),
    (Adagrad, torch.optim.Adagrad, dict(lr=0.1, maximize=True)),
    (NAdam, torch.optim.NAdam, dict(lr=0.01)),
    (NAdam, torch.optim.NAdam, dict(lr=0.01, betas=(0.8, 0.9), weight_decay=0.1,
                                    momentum_decay=0.01)),
    (NAdam, torch.optim.NAdam, dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True)),
    (RAdam, torch.optim.RAdam, dict(lr=0.01)),
    (RAdam, torch.optim.RAdam, dict(lr=0.01, betas=(0.5, 0.6), weight_decay=0.1)),
    (RAdam, torch.optim.RAdam, dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True,
                                    maximize=True)),
]


def _run(o_opt, t_opt, ours, theirs, grads_list):
    for grads in grads_list:
        o_opt.zero_grad()
        t_opt.zero_grad()
        for p, g in zip(ours, grads):
            p.grad = Tensor.from_numpy(g.copy())
        for p, g in zip(theirs, grads):
            p.grad = torch.tensor(g)
        o_opt.step()
        t_opt.step()


@pytest.mark.parametrize("ours_cls,theirs_cls,kw", CONFIGS,
                         ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CONFIGS)])
def test_optimizer_steps_match_torch(ours_cls, theirs_cls, kw, torch_f64):
    rng = np.random.default_rng(0)
    init = [rng.standard_normal((3, 4)), rng.standard_normal(4)]
    ours = [Parameter(a.copy()) for a in init]
    theirs = [torch.tensor(a.copy(), requires_grad=True) for a in init]
    o_opt, t_opt = ours_cls(ours, **kw), theirs_cls(theirs, **kw)
    # 12 steps: RAdam switches from its plain-momentum phase to the rectified one at step 6
    grads = [[rng.standard_normal(a.shape) for a in init] for _ in range(12)]
    _run(o_opt, t_opt, ours, theirs, grads)
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.numpy(), t.detach().numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("ours_cls,theirs_cls", [(NAdam, torch.optim.NAdam),
                                                  (RAdam, torch.optim.RAdam),
                                                  (Adagrad, torch.optim.Adagrad)])
def test_float32_parameters_match_torch_defaults(ours_cls, theirs_cls):
    rng = np.random.default_rng(3)
    init = [rng.standard_normal((5,)).astype(np.float32)]
    ours = [Parameter(init[0].copy())]
    theirs = [torch.tensor(init[0].copy(), requires_grad=True)]
    o_opt, t_opt = ours_cls(ours, lr=0.05), theirs_cls(theirs, lr=0.05)
    grads = [[rng.standard_normal(5).astype(np.float32)] for _ in range(8)]
    _run(o_opt, t_opt, ours, theirs, grads)
    assert ours[0].numpy().dtype == np.float32
    np.testing.assert_allclose(ours[0].numpy(), theirs[0].detach().numpy(), rtol=1e-5, atol=1e-6)


def _to_torch(sd):
    return {"state": {i: {k: torch.from_numpy(v.copy()) if isinstance(v, np.ndarray) else v
                          for k, v in s.items()} for i, s in sd["state"].items()},
            "param_groups": [dict(g) for g in sd["param_groups"]]}


def _from_torch(sd):
    return {"state": {i: {k: v.numpy().copy() if torch.is_tensor(v) else v for k, v in s.items()}
                      for i, s in sd["state"].items()},
            "param_groups": [dict(g) for g in sd["param_groups"]]}


@pytest.mark.parametrize("ours_cls,theirs_cls,kw", [
    (Adam, torch.optim.Adam, dict(lr=0.01, amsgrad=True)),
    (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
    (NAdam, torch.optim.NAdam, dict(lr=0.01)),
    (RAdam, torch.optim.RAdam, dict(lr=0.01)),
    (Adagrad, torch.optim.Adagrad, dict(lr=0.1)),
])
def test_state_dict_moves_between_frameworks_and_continues(ours_cls, theirs_cls, kw, torch_f64):
    """Our state dict, tensors converted, loads into torch.optim and the run goes on identically;
    torch's state dict (converted, or its tensors as they are) loads into ours the same way."""
    rng = np.random.default_rng(5)
    init = [rng.standard_normal((2, 3)), rng.standard_normal(3)]
    grads = [[rng.standard_normal(a.shape) for a in init] for _ in range(10)]
    ours = [Parameter(a.copy()) for a in init]
    theirs = [torch.tensor(a.copy(), requires_grad=True) for a in init]
    o_opt, t_opt = ours_cls(ours, **kw), theirs_cls(theirs, **kw)
    _run(o_opt, t_opt, ours, theirs, grads[:4])
    sd = o_opt.state_dict()
    assert set(sd) == {"state", "param_groups"} and sd["param_groups"][0]["params"] == [0, 1]
    assert set(sd["state"][0]) == set(t_opt.state_dict()["state"][0])  # same entry names
    # ours -> a fresh torch optimizer on copies of our weights
    t2 = [torch.tensor(p.numpy().copy(), requires_grad=True) for p in ours]
    t2_opt = theirs_cls(t2, **kw)
    t2_opt.load_state_dict(_to_torch(sd))
    # torch -> a fresh one of ours, from converted arrays and from raw torch tensors
    o2 = [Parameter(p.detach().numpy().copy()) for p in theirs]
    o2_opt = ours_cls(o2, **kw)
    o2_opt.load_state_dict(_from_torch(t_opt.state_dict()))
    o3 = [Parameter(p.detach().numpy().copy()) for p in theirs]
    o3_opt = ours_cls(o3, **kw)
    o3_opt.load_state_dict(t_opt.state_dict())
    _run(o_opt, t_opt, ours, theirs, grads[4:])
    _run(o2_opt, t2_opt, o2, t2, grads[4:])
    for gs in grads[4:]:
        for p, g in zip(o3, gs):
            p.grad = Tensor.from_numpy(g.copy())
        o3_opt.step()
    for o, t, o_b, t_b, o_c in zip(ours, theirs, o2, t2, o3):
        ref = t.detach().numpy()
        np.testing.assert_allclose(o.numpy(), ref, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(t_b.detach().numpy(), ref, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(o_b.numpy(), ref, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(o_c.numpy(), ref, rtol=1e-12, atol=1e-14)


def test_load_state_dict_refuses_a_mismatched_state():
    p = Parameter(np.zeros(3))
    opt = Adam([p])
    with pytest.raises(OneModelError, match="state"):
        opt.load_state_dict({"state": {}})
    with pytest.raises(OneModelError, match="shape"):
        opt.load_state_dict({"state": {0: {"step": 1, "exp_avg": np.zeros(4),
                                           "exp_avg_sq": np.zeros(4)}},
                             "param_groups": [{"lr": 0.1, "params": [0]}]})


def _lr_sequence(make, steps, torch_make, metrics=None):
    p = Parameter(np.zeros(2))
    tp = torch.zeros(2, requires_grad=True)
    o_opt, t_opt = make[0]([p]), torch_make[0]([tp])
    o_s, t_s = make[1](o_opt), torch_make[1](t_opt)
    ours, theirs = [], []
    for i in range(steps):
        ours.append(o_opt.param_groups[0]["lr"])
        theirs.append(t_opt.param_groups[0]["lr"])
        t_opt.step()
        if metrics is None:
            o_s.step()
            t_s.step()
        else:
            o_s.step(metrics[i])
            t_s.step(metrics[i])
    return ours, theirs, o_opt, t_opt


TS = torch.optim.lr_scheduler
SCHEDULES = {
    "multistep": (lambda o: MultiStepLR(o, [3, 7, 7, 11], 0.5),
                  lambda o: TS.MultiStepLR(o, [3, 7, 7, 11], 0.5)),
    "exponential": (lambda o: ExponentialLR(o, 0.9), lambda o: TS.ExponentialLR(o, 0.9)),
    "linear": (lambda o: LinearLR(o, 0.1, 1.0, 6), lambda o: TS.LinearLR(o, 0.1, 1.0, 6)),
    "linear-down": (lambda o: LinearLR(o, 1.0, 0.2, 4), lambda o: TS.LinearLR(o, 1.0, 0.2, 4)),
    "sequential": (
        lambda o: SequentialLR(o, [LinearLR(o, 0.2, 1.0, 4), ExponentialLR(o, 0.8),
                                   StepLR(o, 2, 0.5)], [5, 9]),
        lambda o: TS.SequentialLR(o, [TS.LinearLR(o, 0.2, 1.0, 4), TS.ExponentialLR(o, 0.8),
                                      TS.StepLR(o, 2, 0.5)], [5, 9])),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedulers_match_torch(name):
    ours, theirs, _, _ = _lr_sequence((lambda ps: SGD(ps, lr=0.5), SCHEDULES[name][0]), 16,
                                      (lambda ps: torch.optim.SGD(ps, lr=0.5), SCHEDULES[name][1]))
    np.testing.assert_allclose(ours, theirs, rtol=1e-12)


@pytest.mark.parametrize("kw", [dict(), dict(anneal_strategy="linear", pct_start=0.25),
                                dict(three_phase=True, div_factor=10.0)])
@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_one_cycle_matches_torch_with_momentum(kw, opt):
    steps = 20
    make = ((lambda ps: SGD(ps, lr=0.1, momentum=0.9)) if opt == "sgd" else
            (lambda ps: Adam(ps, lr=0.1)))
    tmake = ((lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)) if opt == "sgd" else
             (lambda ps: torch.optim.Adam(ps, lr=0.1)))
    ours, theirs, o_opt, t_opt = _lr_sequence(
        (make, lambda o: OneCycleLR(o, max_lr=1.0, total_steps=steps, **kw)), steps,
        (tmake, lambda o: TS.OneCycleLR(o, max_lr=1.0, total_steps=steps, **kw)))
    np.testing.assert_allclose(ours, theirs, rtol=1e-12)
    key = "momentum" if opt == "sgd" else "betas"
    np.testing.assert_allclose(np.ravel(o_opt.param_groups[0][key]),
                               np.ravel(t_opt.param_groups[0][key]), rtol=1e-12)


def test_one_cycle_refuses_too_many_steps():
    opt = SGD([Parameter(np.zeros(1))], lr=0.1, momentum=0.9)
    sch = OneCycleLR(opt, max_lr=1.0, epochs=2, steps_per_epoch=2)
    for _ in range(4):
        sch.step()
    with pytest.raises(OneModelError, match="total_steps=4"):
        sch.step()


@pytest.mark.parametrize("kw", [dict(patience=2), dict(mode="max", patience=1, cooldown=2),
                                dict(threshold_mode="abs", threshold=0.05, factor=0.5,
                                     min_lr=0.06, patience=0)])
def test_reduce_on_plateau_matches_torch(kw):
    rng = np.random.default_rng(0)
    metrics = list(np.cumsum(rng.standard_normal(30) * 0.1) + np.repeat([3, 2, 2, 2, 1], 6))
    ours, theirs, _, _ = _lr_sequence(
        (lambda ps: SGD(ps, lr=0.5), lambda o: ReduceLROnPlateau(o, **kw)), 30,
        (lambda ps: torch.optim.SGD(ps, lr=0.5), lambda o: TS.ReduceLROnPlateau(o, **kw)),
        metrics=metrics)
    assert len(set(theirs)) > 1  # the schedule did reduce
    np.testing.assert_allclose(ours, theirs, rtol=1e-12)


def test_clip_grad_value_matches_torch():
    rng = np.random.default_rng(2)
    grads = [rng.standard_normal((3, 3)) * 5, rng.standard_normal(4)]
    ours = [Parameter(np.zeros(g.shape)) for g in grads]
    theirs = [torch.zeros(g.shape, dtype=torch.float64, requires_grad=True) for g in grads]
    for p, g in zip(ours, grads):
        p.grad = Tensor.from_numpy(g.copy())
    for p, g in zip(theirs, grads):
        p.grad = torch.tensor(g)
    clip_grad_value_(ours, 0.7)
    torch.nn.utils.clip_grad_value_(theirs, 0.7)
    for o, t in zip(ours, theirs):
        np.testing.assert_array_equal(o.grad.numpy(), t.grad.numpy())
    with pytest.raises(OneModelError, match="clip_value"):
        clip_grad_value_(ours, -1.0)
    assert math.isfinite(float(ours[0].grad.numpy().sum()))
