"""Optimizer updates in one pass per parameter: SGD (momentum, dampening, Nesterov, weight
decay) and Adam/AdamW (amsgrad). numpy makes four to ten passes over each parameter, its
gradient and its state, each with a temporary; here every element is read and written once.

onemodel-training's optimizers find these through the registry (``optim.SGD``, ``optim.Adam``;
see ``plugin.UPDATES``) and keep their numpy update when none is registered. The arithmetic is
the numpy update's, operation for operation in the parameter's dtype (the hyperparameters are
rounded to it first, as numpy rounds a Python float against a float32 array), so the results
are the same bits."""

from __future__ import annotations

import numpy as np

from numba import prange

from ._jit import jit, sync_threads


@jit(parallel=True)
def _sgd(p, g, buf, lr, wd, mom, damp1, use_wd, use_mom, use_damp, nesterov, first):
    for i in prange(p.size):
        d = g[i]
        if use_wd:
            d = d + wd * p[i]
        if use_mom:
            if first:
                b = d
            else:
                b = buf[i] * mom
                b = b + (damp1 * d if use_damp else d)
            buf[i] = b
            d = d + mom * b if nesterov else b
        p[i] = p[i] - lr * d


@jit(parallel=True)
def _adam(p, g, m, v, vmax, step_size, b1, one_b1, b2, one_b2, sqrt_bc2, eps, wd, decay,
          coupled, decoupled, amsgrad):
    for i in prange(p.size):
        x = p[i]
        gi = g[i]
        if decoupled:
            x = x * decay
        if coupled:
            gi = gi + wd * x
        mi = m[i] * b1
        mi = mi + one_b1 * gi
        m[i] = mi
        vi = v[i] * b2
        vi = vi + one_b2 * gi * gi
        v[i] = vi
        if amsgrad:
            top = vmax[i]
            if vi > top or vi != vi:
                top = vi
            vmax[i] = top
            vi = top
        denom = np.sqrt(vi) / sqrt_bc2 + eps
        p[i] = x - step_size * mi / denom


def _flat(*arrays):
    return [a.reshape(-1) for a in arrays]


def sgd(param, grad, buf, *, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
        nesterov=False, first=False) -> None:
    """``param -= lr * d`` in place, with ``d`` the gradient plus weight decay, through the
    momentum buffer ``buf`` (set to ``d`` on the ``first`` step, as PyTorch does). Every array
    is C-contiguous, of the parameter's shape and float dtype; ``buf`` may be None without
    momentum."""
    sync_threads()
    t = param.dtype.type
    if buf is None:
        buf = param  # not read or written without momentum: only its type matters
    p, g, b = _flat(param, grad, buf)
    _sgd(p, g, b, t(lr), t(weight_decay), t(momentum), t(1 - dampening), bool(weight_decay),
         bool(momentum), bool(dampening), bool(nesterov), bool(first))


def adam(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, *, lr, beta1, beta2, eps,
         weight_decay=0.0, decoupled=False, step=1) -> None:
    """One Adam (AdamW when ``decoupled``) step in place: the moments, the running maximum of
    the second moment (amsgrad, when ``max_exp_avg_sq`` is given) and the parameter."""
    sync_threads()
    t = param.dtype.type
    bc1 = 1 - beta1**step
    bc2 = 1 - beta2**step
    amsgrad = max_exp_avg_sq is not None
    vmax = max_exp_avg_sq if amsgrad else exp_avg_sq
    p, g, m, v, vm = _flat(param, grad, exp_avg, exp_avg_sq, vmax)
    _adam(p, g, m, v, vm, t(lr / bc1), t(beta1), t(1 - beta1), t(beta2), t(1 - beta2),
          t(np.sqrt(bc2)), t(eps), t(weight_decay), t(1 - lr * weight_decay),
          bool(weight_decay) and not decoupled, bool(weight_decay) and decoupled, amsgrad)
