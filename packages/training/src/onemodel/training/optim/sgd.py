"""Stochastic gradient descent with momentum, dampening, Nesterov and weight decay."""

from __future__ import annotations

import numpy as np

from onemodel.tensors import OneModelError

from .optimizer import Optimizer, update_kernel


class SGD(Optimizer):
    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False):
        if nesterov and (momentum <= 0 or dampening != 0):
            raise OneModelError("Nesterov momentum needs momentum > 0 and dampening = 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize))

    def _update(self, param, grad, state, group):
        mom = group["momentum"]
        buf = state.get("momentum_buffer") if mom else None
        fast = update_kernel("optim.SGD", param, grad, *(() if buf is None else (buf,)))
        if fast is not None:
            first = mom and buf is None
            if first:
                buf = state["momentum_buffer"] = np.empty_like(param)
            fast(param, grad, buf, lr=group["lr"], momentum=mom, dampening=group["dampening"],
                 weight_decay=group["weight_decay"], nesterov=group["nesterov"], first=first)
            return
        d = grad + group["weight_decay"] * param if group["weight_decay"] else grad
        mom = group["momentum"]
        if mom:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = d.copy()  # on the parameter's device
            else:
                buf *= mom
                buf += (1 - group["dampening"]) * d if group["dampening"] else d
            d = d + mom * buf if group["nesterov"] else buf
        step = self._scratch(d)
        np.multiply(d, param.dtype.type(group["lr"]), out=step)
        param -= step
