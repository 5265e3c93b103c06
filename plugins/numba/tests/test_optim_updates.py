"""The fused optimizer updates (``optim.SGD``, ``optim.Adam``) against the optimizers' own numpy
updates (the same bits: same operations in the same dtype) and against PyTorch, over several
steps and every option; and the optimizers find them through the registry."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from onemodel.numba import plugin
from onemodel.tensors import Tensor, registry
from onemodel.training import SGD, Adam, AdamW
from onemodel.training.optim import optimizer as base

SHAPES = [(7, 5), (3,), (2, 3, 4)]


def _params(dtype, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for s in SHAPES:
        p = Tensor.from_numpy(rng.standard_normal(s).astype(dtype))
        p.requires_grad = True
        out.append(p)
    return out


def _run(make, dtype, steps=4, fused=True, monkeypatch=None):
    params = _params(dtype)
    opt = make(params)
    rng = np.random.default_rng(1)
    if not fused:
        monkeypatch.setattr(base, "update_kernel", lambda *a: None)
        for mod in ("sgd", "adam"):
            monkeypatch.setattr(f"onemodel.training.optim.{mod}.update_kernel",
                                lambda *a: None)
    for _ in range(steps):
        for p in params:
            p.grad = Tensor.from_numpy(rng.standard_normal(p.shape).astype(dtype))
        opt.step()
    if not fused:
        monkeypatch.undo()
    return [p.numpy().copy() for p in params], opt


SGD_CASES = [dict(momentum=m, dampening=d, weight_decay=w, nesterov=n, maximize=x)
             for m, d, w, n, x in itertools.product((0.0, 0.9), (0.0, 0.3), (0.0, 0.01),
                                                    (False, True), (False, True))
             if not (n and (m == 0 or d != 0))]
ADAM_CASES = [(cls, dict(weight_decay=w, amsgrad=a, maximize=x))
              for cls, w, a, x in itertools.product((Adam, AdamW), (0.0, 0.05), (False, True),
                                                    (False, True))]


def test_the_optimizers_find_the_updates():
    for name in plugin.UPDATES:
        rec = registry.kernels()[name][0]
        assert rec.plugin == "numba" and rec.device == "cpu"
    a = np.zeros(4, np.float32)
    assert base.update_kernel("optim.SGD", a, a) is registry.kernels()["optim.SGD"][0].function()
    assert base.update_kernel("optim.SGD", a, a[::2]) is None  # not contiguous: numpy update
    assert base.update_kernel("optim.SGD", a.astype(np.float16), a.astype(np.float16)) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kw", SGD_CASES, ids=str)
def test_sgd_same_bits_as_numpy(kw, dtype, monkeypatch):
    got, _ = _run(lambda ps: SGD(ps, 0.05, **kw), dtype)
    want, _ = _run(lambda ps: SGD(ps, 0.05, **kw), dtype, fused=False, monkeypatch=monkeypatch)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cls,kw", ADAM_CASES, ids=str)
def test_adam_same_bits_as_numpy(cls, kw, dtype, monkeypatch):
    got, o1 = _run(lambda ps: cls(ps, 0.01, **kw), dtype)
    want, o2 = _run(lambda ps: cls(ps, 0.01, **kw), dtype, fused=False, monkeypatch=monkeypatch)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    s1, s2 = o1.state_dict()["state"], o2.state_dict()["state"]
    for i in s1:
        assert s1[i]["step"] == s2[i]["step"] == 4
        for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            if k in s2[i]:
                np.testing.assert_array_equal(s1[i][k], s2[i][k])


def test_against_torch():
    torch = pytest.importorskip("torch")
    for ours, theirs in (
        (lambda ps: SGD(ps, 0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
         lambda ps: torch.optim.SGD(ps, 0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
        (lambda ps: AdamW(ps, 0.01, amsgrad=True),
         lambda ps: torch.optim.AdamW(ps, 0.01, amsgrad=True)),
    ):
        got, _ = _run(ours, np.float32)
        tp = [torch.tensor(p.numpy(), requires_grad=True) for p in _params(np.float32)]
        opt = theirs(tp)
        rng = np.random.default_rng(1)
        for _ in range(4):
            for p in tp:
                p.grad = torch.tensor(rng.standard_normal(tuple(p.shape)).astype(np.float32))
            opt.step()
        for g, w in zip(got, tp):
            np.testing.assert_allclose(g, w.detach().numpy(), rtol=1e-5, atol=1e-6)
