"""BatchNorm1d/2d (running statistics, momentum), LayerNorm and GroupNorm."""

from __future__ import annotations

import numpy as np

from onemodel.tensors import DType, OneModelError, Tensor
from onemodel.tensors import functional as F

from .. import init
from ..module import Module


class _BatchNorm(Module):
    _ranks: tuple[int, ...] = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = init.ones((num_features,)) if affine else None
        self.bias = init.zeros((num_features,)) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", Tensor._wrap(np.zeros(num_features, np.float32)))
            self.register_buffer("running_var", Tensor._wrap(np.ones(num_features, np.float32)))
            self.register_buffer("num_batches_tracked",
                                 Tensor.zeros(DType.I64, ()))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim not in self._ranks:
            raise OneModelError(
                f"{type(self).__name__} expects input of rank {' or '.join(map(str, self._ranks))}"
                f", got shape {list(x.shape)}"
            )
        use_batch = self.training or not self.track_running_stats
        if self.training and self.track_running_stats:
            self.num_batches_tracked._data += 1
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            training=use_batch, momentum=self.momentum, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}"


class BatchNorm1d(_BatchNorm):
    _ranks = (2, 3)


class BatchNorm2d(_BatchNorm):
    _ranks = (4,)


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps = shape, eps
        self.weight = init.ones(shape) if elementwise_affine else None
        self.bias = init.zeros(shape) if elementwise_affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class GroupNorm(Module):
    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
        super().__init__()
        if num_channels % num_groups:
            raise OneModelError(f"{num_channels} channels do not split into {num_groups} groups")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = init.ones((num_channels,)) if affine else None
        self.bias = init.zeros((num_channels,)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}"
