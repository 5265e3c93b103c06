"""Gradient clipping."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from onemodel.tensors import OneModelError, Tensor


def clip_grad_norm_(parameters: Iterable[Tensor] | Tensor, max_norm: float,
                    norm_type: float = 2.0) -> Tensor:
    """Scale gradients in place so their joint norm is at most ``max_norm``; returns the norm
    before clipping."""
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    grads = [p.grad._data for p in params if p.grad is not None]
    if not grads:
        return Tensor.from_numpy(np.asarray(0.0, np.float32))
    if norm_type == float("inf"):
        total = max(float(np.abs(g).max()) for g in grads)
    else:
        total = float(sum(float(np.sum(np.abs(g.astype(np.float64)) ** norm_type)) for g in grads)
                      ** (1.0 / norm_type))
    coef = max_norm / (total + 1e-6)
    if coef < 1:
        for g in grads:
            g *= g.dtype.type(coef)
    return Tensor.from_numpy(np.asarray(total, grads[0].dtype))


def clip_grad_value_(parameters: Iterable[Tensor] | Tensor, clip_value: float) -> None:
    """Clamp every gradient element into ``[-clip_value, clip_value]`` in place."""
    if clip_value < 0:
        raise OneModelError(f"clip_grad_value_: clip_value must be >= 0, got {clip_value}")
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    for p in params:
        if p.grad is not None:
            g = p.grad._data
            np.clip(g, -clip_value, clip_value, out=g)
