"""Convolutions: Conv1d, Conv2d, ConvTranspose1d and ConvTranspose2d, with PyTorch's weight
layouts and ``padding_mode`` (zeros, reflect, replicate, circular: ONNX Pad modes before a
Conv without padding)."""

from __future__ import annotations

import math

from onemodel.tensors import Generator, OneModelError, Tensor
from onemodel.tensors import functional as F

from .. import init
from ..module import Module


def _pair(v, n):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n


class _ConvNd(Module):
    _nd = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 *, generator: Generator | None = None):
        super().__init__()
        n = self._nd
        if padding_mode not in ("zeros", "reflect", "replicate", "circular"):
            raise OneModelError(f"padding_mode must be 'zeros', 'reflect', 'replicate' or "
                                f"'circular', not {padding_mode!r}")
        if in_channels % groups or out_channels % groups:
            raise OneModelError(f"{type(self).__name__}: in_channels {in_channels} and "
                                f"out_channels {out_channels} must be divisible by groups "
                                f"{groups}")
        self.padding_mode = padding_mode
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _pair(kernel_size, n)
        self.stride, self.dilation = _pair(stride, n), _pair(dilation, n)
        self.padding = padding if isinstance(padding, str) else _pair(padding, n)
        self.groups = groups
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        self.weight = init.kaiming_uniform(shape, generator)
        bound = 1 / math.sqrt(init.fan_in(shape))
        self.bias = init.uniform((out_channels,), bound, generator) if bias else None

    def _padded(self, x: Tensor) -> tuple[Tensor, object]:
        """The input and the Conv padding: with a padding_mode other than zeros the input is
        padded by Pad (PyTorch's order: last axis first) and the Conv pads nothing."""
        if self.padding_mode == "zeros":
            return x, self.padding
        n = self._nd
        if self.padding == "valid":
            return x, 0
        if self.padding == "same":
            total = [self.dilation[i] * (self.kernel_size[i] - 1) for i in range(n)]
            pairs = [(t // 2, t - t // 2) for t in total]
        else:
            pairs = [(p, p) for p in self.padding]
        flat = [v for pair in reversed(pairs) for v in pair]
        if not any(flat):
            return x, 0
        return F.pad(x, flat, mode=self.padding_mode), 0

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode!r}"
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
        x, padding = self._padded(x)
        return F.conv1d(x, self.weight, self.bias, self.stride, padding, self.dilation,
                        self.groups)


class Conv2d(_ConvNd):
    _nd = 2

    def forward(self, x: Tensor) -> Tensor:
        x, padding = self._padded(x)
        return F.conv2d(x, self.weight, self.bias, self.stride, padding, self.dilation,
                        self.groups)


class ConvTranspose2d(Module):
    """Weight shaped (in_channels, out_channels / groups, kH, kW), as in PyTorch."""

    _nd = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, groups: int = 1, bias: bool = True, dilation=1,
                 padding_mode: str = "zeros", *, generator: Generator | None = None):
        super().__init__()
        if padding_mode != "zeros":
            raise OneModelError(f"{type(self).__name__} supports padding_mode='zeros' only (as "
                                f"PyTorch), got {padding_mode!r}")
        n = self._nd
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _pair(kernel_size, n)
        self.stride, self.padding = _pair(stride, n), _pair(padding, n)
        self.output_padding, self.dilation = _pair(output_padding, n), _pair(dilation, n)
        self.groups, self.padding_mode = groups, padding_mode
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


class ConvTranspose1d(ConvTranspose2d):
    """Weight shaped (in_channels, out_channels / groups, kL), as in PyTorch."""

    _nd = 1

    def forward(self, x: Tensor) -> Tensor:
        return F.conv_transpose1d(x, self.weight, self.bias, self.stride, self.padding,
                                  self.output_padding, self.groups, self.dilation)
