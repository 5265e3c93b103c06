"""Adam and AdamW (decoupled weight decay), with amsgrad."""

from __future__ import annotations

import math

import numpy as np

from .optimizer import Optimizer, update_kernel


class Adam(Optimizer):
    _decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, maximize: bool = False):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize))

    def _update(self, param, grad, state, group):
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        if not state:
            state["step"] = 0
            state["exp_avg"] = np.zeros_like(param)
            state["exp_avg_sq"] = np.zeros_like(param)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = np.zeros_like(param)
        vmax = state.get("max_exp_avg_sq") if group["amsgrad"] else None
        fast = update_kernel("optim.Adam", param, grad, state["exp_avg"], state["exp_avg_sq"],
                             *(() if vmax is None else (vmax,)))
        if fast is not None and (vmax is not None or not group["amsgrad"]):
            state["step"] += 1
            fast(param, grad, state["exp_avg"], state["exp_avg_sq"], vmax, lr=lr, beta1=b1,
                 beta2=b2, eps=eps, weight_decay=wd, decoupled=self._decoupled,
                 step=state["step"])
            return
        if wd:
            if self._decoupled:
                param *= 1 - lr * wd
            else:
                grad = grad + wd * param
        state["step"] += 1
        t = state["step"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m *= b1
        m += (1 - b1) * grad
        v *= b2
        v += (1 - b2) * grad * grad
        if group["amsgrad"]:
            np.maximum(state["max_exp_avg_sq"], v, out=state["max_exp_avg_sq"])
            v = state["max_exp_avg_sq"]
        bc1 = 1 - b1**t
        bc2 = 1 - b2**t
        denom = np.sqrt(v) / math.sqrt(bc2) + eps
        param -= (lr / bc1) * m / denom


class AdamW(Adam):
    _decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, maximize: bool = False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize)
