"""PyTorch's default initializations, drawn from a OneModel ``Generator`` (same seed, same
weights)."""

from __future__ import annotations

import math

import numpy as np

from onemodel.tensors import Generator
from onemodel.tensors.generator import default_generator

from .module import Parameter


def fan_in(shape) -> int:
    """Inputs feeding one output unit: in_features for Linear, in/groups * kernel for Conv."""
    return int(shape[1] * math.prod(shape[2:])) if len(shape) > 1 else int(shape[0])


def uniform(shape, bound: float, generator: Generator | None, dtype=np.float32) -> Parameter:
    g = generator or default_generator()
    return Parameter(g.uniform(shape, -bound, bound).astype(dtype))


def kaiming_uniform(shape, generator: Generator | None, a: float = math.sqrt(5)) -> Parameter:
    """``torch.nn.init.kaiming_uniform_(w, a=sqrt(5))``: the default of Linear and Conv."""
    gain = math.sqrt(2.0 / (1 + a * a))
    bound = gain * math.sqrt(3.0 / fan_in(shape))
    return uniform(shape, bound, generator)


def xavier_uniform(shape, generator: Generator | None) -> Parameter:
    fan_out = int(shape[0] * math.prod(shape[2:]))
    bound = math.sqrt(6.0 / (fan_in(shape) + fan_out))
    return uniform(shape, bound, generator)


def zeros(shape) -> Parameter:
    return Parameter(np.zeros(shape, np.float32))


def ones(shape) -> Parameter:
    return Parameter(np.ones(shape, np.float32))


def normal(shape, generator: Generator | None, std: float = 1.0) -> Parameter:
    g = generator or default_generator()
    return Parameter(g.normal(shape, 0.0, std))
