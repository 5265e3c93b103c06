"""Upsample, UpsamplingNearest2d and UpsamplingBilinear2d: ``F.interpolate`` as modules."""

from __future__ import annotations

from onemodel.tensors import Tensor
from onemodel.tensors import functional as F

from ..module import Module


class Upsample(Module):
    """``torch.nn.Upsample``: resample the spatial axes by ``size`` or ``scale_factor``."""

    def __init__(self, size=None, scale_factor=None, mode: str = "nearest",
                 align_corners: bool | None = None, recompute_scale_factor: bool | None = None):
        super().__init__()
        self.size, self.scale_factor, self.mode = size, scale_factor, mode
        self.align_corners, self.recompute_scale_factor = align_corners, recompute_scale_factor

    def forward(self, x: Tensor) -> Tensor:
        return F.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners,
                             self.recompute_scale_factor)

    def extra_repr(self) -> str:
        what = f"size={self.size}" if self.size is not None else \
            f"scale_factor={self.scale_factor}"
        return f"{what}, mode={self.mode!r}"


class UpsamplingNearest2d(Upsample):
    """``torch.nn.UpsamplingNearest2d``: nearest neighbour on (N, C, H, W)."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="nearest")


class UpsamplingBilinear2d(Upsample):
    """``torch.nn.UpsamplingBilinear2d``: bilinear with ``align_corners=True``, as in PyTorch."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="bilinear", align_corners=True)
