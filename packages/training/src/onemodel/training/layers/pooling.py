"""MaxPool1d/2d, AvgPool1d/2d and AdaptiveAvgPool1d/2d, with PyTorch's arguments: one class per
kind of pooling, the functional it calls (1-d or 2-d) set by each public subclass."""

from __future__ import annotations

from onemodel.tensors import Tensor
from onemodel.tensors import functional as F

from ..module import Module


class _MaxPool(Module):
    _pool = None  # F.max_pool1d or F.max_pool2d

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride or kernel_size, padding
        self.dilation, self.ceil_mode = dilation, ceil_mode

    def forward(self, x: Tensor) -> Tensor:
        return self._pool(x, self.kernel_size, self.stride, self.padding, self.dilation,
                            self.ceil_mode)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class _AvgPool(Module):
    _pool = None  # F.avg_pool1d or F.avg_pool2d

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride or kernel_size, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def forward(self, x: Tensor) -> Tensor:
        return self._pool(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class _AdaptiveAvgPool(Module):
    _pool = None  # F.adaptive_avg_pool1d or F.adaptive_avg_pool2d

    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Tensor) -> Tensor:
        return self._pool(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class MaxPool2d(_MaxPool):
    _pool = staticmethod(F.max_pool2d)


class AvgPool2d(_AvgPool):
    _pool = staticmethod(F.avg_pool2d)


class AdaptiveAvgPool2d(_AdaptiveAvgPool):
    _pool = staticmethod(F.adaptive_avg_pool2d)


class MaxPool1d(_MaxPool):
    _pool = staticmethod(F.max_pool1d)


class AvgPool1d(_AvgPool):
    _pool = staticmethod(F.avg_pool1d)


class AdaptiveAvgPool1d(_AdaptiveAvgPool):
    _pool = staticmethod(F.adaptive_avg_pool1d)
