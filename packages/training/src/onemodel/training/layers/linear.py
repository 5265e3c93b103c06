"""Linear, Identity and Flatten."""

from __future__ import annotations

import math

from onemodel.tensors import Generator, Tensor
from onemodel.tensors import functional as F

from .. import init
from ..module import Module


class Linear(Module):
    """``y = x @ weight.T + bias`` with weight shaped (out_features, in_features)."""

    def __init__(self, in_features: int, out_features: int, generator: Generator | None = None,
                 *, bias: bool = True):
        super().__init__()
        if isinstance(generator, bool):  # Linear(4, 2, False) as in PyTorch
            generator, bias = None, generator
        self.in_features, self.out_features = in_features, out_features
        self.weight = init.kaiming_uniform((out_features, in_features), generator)
        self.bias = (init.uniform((out_features,), 1 / math.sqrt(in_features), generator)
                     if bias else None)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Identity(Module):
    """Returns its input; takes and ignores any arguments, as torch's does (a placeholder that
    keeps a constructor call unchanged)."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x: Tensor) -> Tensor:
        return x


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"
