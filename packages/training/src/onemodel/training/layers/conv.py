"""Convolutions: Conv1d, Conv2d and ConvTranspose2d, with PyTorch's weight layouts."""

from __future__ import annotations

import math

from onemodel.tensors import Generator, Tensor
from onemodel.tensors import functional as F

from .. import init
from ..module import Module


def _pair(v, n):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n


class _ConvNd(Module):
    _nd = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, *,
                 generator: Generator | None = None):
        super().__init__()
        n = self._nd
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _pair(kernel_size, n)
        self.stride, self.dilation = _pair(stride, n), _pair(dilation, n)
        self.padding = padding if isinstance(padding, str) else _pair(padding, n)
        self.groups = groups
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        self.weight = init.kaiming_uniform(shape, generator)
        bound = 1 / math.sqrt(init.fan_in(shape))
        self.bias = init.uniform((out_channels,), bound, generator) if bias else None

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding not in ((0,) * self._nd, "valid"):
            s += f", padding={self.padding}"
        if self.dilation != (1,) * self._nd:
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        return s + ("" if self.bias is not None else ", bias=False")


class Conv1d(_ConvNd):
    _nd = 1

    def forward(self, x: Tensor) -> Tensor:
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)


class Conv2d(_ConvNd):
    _nd = 2

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)


class ConvTranspose2d(Module):
    """Weight shaped (in_channels, out_channels / groups, kH, kW), as in PyTorch."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, groups: int = 1, bias: bool = True, dilation=1, *,
                 generator: Generator | None = None):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _pair(kernel_size, 2)
        self.stride, self.padding = _pair(stride, 2), _pair(padding, 2)
        self.output_padding, self.dilation = _pair(output_padding, 2), _pair(dilation, 2)
        self.groups = groups
        shape = (in_channels, out_channels // groups, *self.kernel_size)
        self.weight = init.kaiming_uniform(shape, generator)
        # PyTorch computes fan_in from weight.shape[1] * kernel for transposed convolutions
        bound = 1 / math.sqrt(init.fan_in(shape))
        self.bias = init.uniform((out_channels,), bound, generator) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding,
                                  self.output_padding, self.groups, self.dilation)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}")
