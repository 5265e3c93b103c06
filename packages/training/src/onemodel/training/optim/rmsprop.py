"""RMSprop with momentum and the centered variant."""

from __future__ import annotations

import numpy as np

from .optimizer import Optimizer


class RMSprop(Optimizer):
    def __init__(self, params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False,
                 maximize: bool = False):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum, centered=centered, maximize=maximize))

    def _update(self, param, grad, state, group):
        alpha, eps, lr = group["alpha"], group["eps"], group["lr"]
        if group["weight_decay"]:
            grad = grad + group["weight_decay"] * param
        if not state:
            state["step"] = 0
            state["square_avg"] = np.zeros_like(param)
            if group["momentum"]:
                state["momentum_buffer"] = np.zeros_like(param)
            if group["centered"]:
                state["grad_avg"] = np.zeros_like(param)
        state["step"] += 1
        sq = state["square_avg"]
        sq *= alpha
        sq += (1 - alpha) * grad * grad
        if group["centered"]:
            ga = state["grad_avg"]
            ga *= alpha
            ga += (1 - alpha) * grad
            avg = np.sqrt(sq - ga * ga) + eps
        else:
            avg = np.sqrt(sq) + eps
        if group["momentum"]:
            buf = state["momentum_buffer"]
            buf *= group["momentum"]
            buf += grad / avg
            param -= lr * buf
        else:
            param -= lr * grad / avg
