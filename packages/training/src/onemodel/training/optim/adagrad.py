"""Adagrad, NAdam and RAdam, update for update as ``torch.optim`` computes them (single-tensor
path), so a run started in either framework continues in the other."""

from __future__ import annotations

import numpy as np

from onemodel.tensors import OneModelError

from .optimizer import Optimizer


class Adagrad(Optimizer):
    """Per-coordinate rates from the running sum of squared gradients."""

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10,
                 maximize: bool = False):
        if initial_accumulator_value < 0:
            raise OneModelError(f"Adagrad: initial_accumulator_value must be >= 0, "
                                f"got {initial_accumulator_value}")
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      eps=eps, maximize=maximize))

    def _update(self, param, grad, state, group):
        if not state:
            state["step"] = 0
            state["sum"] = np.full_like(param, group["initial_accumulator_value"])
        state["step"] += 1
        if group["weight_decay"]:
            grad = grad + group["weight_decay"] * param
        clr = group["lr"] / (1 + (state["step"] - 1) * group["lr_decay"])
        s = state["sum"]
        s += grad * grad
        param -= clr * (grad / (np.sqrt(s) + group["eps"]))


class NAdam(Optimizer):
    """Adam with Nesterov momentum and the momentum-decay schedule of Dozat (2016)."""

    def __init__(self, params, lr: float = 2e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, maximize: bool = False):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, momentum_decay=momentum_decay,
                                      decoupled_weight_decay=decoupled_weight_decay,
                                      maximize=maximize))

    def _update(self, param, grad, state, group):
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        if not state:
            state["step"] = 0
            state["mu_product"] = 1.0
            state["exp_avg"] = np.zeros_like(param)
            state["exp_avg_sq"] = np.zeros_like(param)
        state["step"] += 1
        t = state["step"]
        bc2 = 1 - b2**t
        if wd:
            if group["decoupled_weight_decay"]:
                param *= 1 - lr * wd
            else:
                grad = grad + wd * param
        md = group["momentum_decay"]
        mu = b1 * (1.0 - 0.5 * 0.96 ** (t * md))
        mu_next = b1 * (1.0 - 0.5 * 0.96 ** ((t + 1) * md))
        state["mu_product"] = mu_product = float(state["mu_product"]) * mu
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m += (1 - b1) * (grad - m)  # torch's lerp_
        v *= b2
        v += (1 - b2) * grad * grad
        denom = np.sqrt(v / bc2) + eps
        param += (-lr * (1.0 - mu) / (1.0 - mu_product)) * (grad / denom)
        param += ((-lr * mu_next) / (1.0 - mu_product * mu_next)) * (m / denom)


class RAdam(Optimizer):
    """Adam with the variance rectification of Liu et al. (2019): plain momentum SGD while the
    second-moment estimate is too young to trust."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, decoupled_weight_decay: bool = False,
                 maximize: bool = False):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay,
                                      decoupled_weight_decay=decoupled_weight_decay,
                                      maximize=maximize))

    def _update(self, param, grad, state, group):
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        if not state:
            state["step"] = 0
            state["exp_avg"] = np.zeros_like(param)
            state["exp_avg_sq"] = np.zeros_like(param)
        state["step"] += 1
        t = state["step"]
        if wd:
            if group["decoupled_weight_decay"]:
                param *= 1 - lr * wd
            else:
                grad = grad + wd * param
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m += (1 - b1) * (grad - m)
        v *= b2
        v += (1 - b2) * grad * grad
        bc1 = 1 - b1**t
        bc2 = 1 - b2**t
        corrected = m / bc1
        rho_inf = 2 / (1 - b2) - 1
        rho_t = rho_inf - 2 * t * (b2**t) / bc2
        if rho_t > 5.0:
            rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
            adaptive = (bc2**0.5) / (np.sqrt(v) + eps)
            param -= corrected * lr * adaptive * rect
        else:
            param -= corrected * lr
