"""``interpolate`` (and ``grid_sample``, ``affine_grid``) as in ``torch.nn.functional``, mapped
onto the Resize (GridSample, AffineGrid) op.

Each PyTorch mode becomes the Resize form that computes the same thing:

- ``nearest``: ``asymmetric`` coordinates, ``floor`` rounding (PyTorch's legacy nearest);
- ``nearest-exact``: ``half_pixel`` coordinates, ``round_prefer_ceil`` (floor((y + 0.5) / s));
- ``linear``/``bilinear``/``trilinear`` and ``bicubic`` (cubic with a = -0.75): ``align_corners``
  when asked, else ``half_pixel`` (PyTorch's source index is (y + 0.5) / s - 0.5; ONNX's
  ``pytorch_half_pixel`` differs from it for an output of size 1, ``half_pixel`` does not);
- ``area``: adaptive average pooling to the output size;
- ``antialias=True`` (bilinear, bicubic): Resize's ``antialias`` with ``exclude_outside`` (PyTorch
  renormalizes over the taps inside the image) and, for bicubic, a = -0.5 as PyTorch uses.

With ``scale_factor`` (and ``recompute_scale_factor`` not set) PyTorch samples with the scale
itself, not the ratio of sizes, so the op gets ``scales``; with ``size``, ``align_corners`` or
``recompute_scale_factor=True`` it gets ``sizes``. Output sizes are floor(size * scale), kept
symbolic while tracing.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from . import trace_state
from .errors import OneModelError
from .symbolic import SymInt
from .tensor import Tensor, _call

_MODES = {
    "nearest": None, "nearest-exact": None, "linear": 1, "bilinear": 2, "bicubic": 2,
    "trilinear": 3, "area": None,
}


def _per_axis(value, n: int, what: str) -> tuple:
    if isinstance(value, (tuple, list)):
        if len(value) != n:
            raise OneModelError(f"interpolate: {what} has {len(value)} values for {n} spatial "
                                f"axes; give {n} (or one for all)")
        return tuple(value)
    return (value,) * n


def _floor_scaled(dim, scale: float):
    """floor(dim * scale) as PyTorch computes it, symbolic when ``dim`` is a SymInt."""
    if isinstance(dim, SymInt):
        frac = Fraction(float(scale))
        return (dim * frac.numerator) // frac.denominator
    return int(np.floor(float(dim) * float(scale)))


def interpolate(input: Tensor, size=None, scale_factor=None, mode: str = "nearest",
                align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False) -> Tensor:
    """Resample the spatial axes (all axes after the first two) of ``input``, as
    ``torch.nn.functional.interpolate`` does."""
    if mode not in _MODES:
        raise OneModelError(f"interpolate: mode {mode!r} is not one of {', '.join(_MODES)}")
    nd = input.ndim - 2
    if nd < 1:
        raise OneModelError(f"interpolate needs an input (N, C, *spatial), got rank {input.ndim}")
    want = _MODES[mode]
    if want is not None and nd != want:
        raise OneModelError(f"interpolate: mode {mode!r} needs {want} spatial axes "
                            f"(rank {want + 2}), got rank {input.ndim}")
    if mode == "area" and nd != 2:
        raise OneModelError("interpolate: mode 'area' is supported for 4-D inputs (N, C, H, W)")
    linear = mode in ("linear", "bilinear", "bicubic", "trilinear")
    if align_corners is not None and not linear:
        raise OneModelError("interpolate: align_corners applies to the modes linear, bilinear, "
                            "bicubic and trilinear only")
    if antialias and mode not in ("bilinear", "bicubic"):
        raise OneModelError("interpolate: antialias=True applies to the modes bilinear and "
                            "bicubic only")
    align_corners = bool(align_corners)
    if antialias and align_corners:
        raise OneModelError("interpolate: antialias=True with align_corners=True is not "
                            "supported (ONNX's antialiasing has no aligned-corners form); use "
                            "align_corners=False")
    if (size is None) == (scale_factor is None):
        raise OneModelError("interpolate: give exactly one of size and scale_factor")
    spatial = tuple(input.shape[2:])
    scales = None
    if size is not None:
        out = tuple(_per_axis(size, nd, "size"))
        if any(int(d) < 0 for d in out):
            raise OneModelError(f"interpolate: size {list(out)} has a negative value")
    else:
        factors = tuple(float(f) for f in _per_axis(scale_factor, nd, "scale_factor"))
        if any(not f > 0 for f in factors):
            raise OneModelError(f"interpolate: scale_factor must be positive, got "
                                f"{list(factors)}")
        out = tuple(_floor_scaled(d, f) for d, f in zip(spatial, factors))
        # the scale itself sets the sampling positions; where the sizes give the same ratio
        # exactly, sizes say it without the float32 rounding of a scales tensor (0.6 ->
        # 0.6000000238 would move a nearest sample at an exact boundary)
        exact = not any(isinstance(d, SymInt) for d in spatial) and all(
            d and o / d == f for d, o, f in zip(spatial, out, factors))
        if not recompute_scale_factor and not exact:
            scales = factors
        if scales is not None and trace_state.is_traced(input):
            if any(f != int(f) for f in factors):
                trace_state.refuse(
                    f"interpolate(scale_factor={list(factors)})",
                    "a traced Resize takes its output sizes from the input's shape, which "
                    "samples at the ratio of sizes, not at a non-integral scale_factor",
                    "pass size=..., an integral scale_factor, or recompute_scale_factor=True")
            scales = None  # an integral factor: the sizes give the same sampling
    if mode == "area":
        from .functional import adaptive_avg_pool2d

        if any(isinstance(d, SymInt) for d in (*spatial, *out)):
            trace_state.refuse("interpolate(mode='area') on a symbolic size",
                               "its pooling windows depend on the size",
                               "trace with fixed spatial axes, or use mode='bilinear'")
        return adaptive_avg_pool2d(input, tuple(int(d) for d in out))
    attrs: dict = {"axes": tuple(range(2, 2 + nd))}
    if mode == "nearest":
        attrs.update(mode="nearest", coordinate_transformation_mode="asymmetric",
                     nearest_mode="floor")
    elif mode == "nearest-exact":
        attrs.update(mode="nearest", coordinate_transformation_mode="half_pixel",
                     nearest_mode="round_prefer_ceil")
    else:
        attrs.update(mode="cubic" if mode == "bicubic" else "linear",
                     coordinate_transformation_mode="align_corners" if align_corners
                     else "half_pixel")
        if mode == "bicubic":
            attrs["cubic_coeff_a"] = -0.5 if antialias else -0.75
        if antialias:  # PyTorch's antialiasing: ONNX's, renormalized over the taps inside
            attrs.update(antialias=1, exclude_outside=1)
    if scales is not None and not align_corners:
        scales_t = Tensor._wrap(np.asarray(scales, dtype=np.float32))
        return _call("Resize", input, None, scales_t, None, **attrs)
    sizes_t = trace_state.shape_operand(out, sizes=False)
    return _call("Resize", input, None, None, sizes_t, **attrs)


def upsample(input: Tensor, size=None, scale_factor=None, mode: str = "nearest",
             align_corners: bool | None = None) -> Tensor:
    """``torch.nn.functional.upsample`` (deprecated there): :func:`interpolate`."""
    return interpolate(input, size, scale_factor, mode, align_corners)


def upsample_nearest(input: Tensor, size=None, scale_factor=None) -> Tensor:
    return interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input: Tensor, size=None, scale_factor=None) -> Tensor:
    """Bilinear with ``align_corners=True``, as ``torch.nn.functional.upsample_bilinear``."""
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)


def grid_sample(input: Tensor, grid: Tensor, mode: str = "bilinear", padding_mode: str = "zeros",
                align_corners: bool | None = None) -> Tensor:
    """``torch.nn.functional.grid_sample``: the GridSample op (differentiable in both inputs).

    ONNX and PyTorch agree except for ``bicubic`` with ``padding_mode='border'``, where ONNX
    clamps the sampling point before taking its 4 x 4 taps and PyTorch clamps each tap."""
    modes = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
    if mode not in modes:
        raise OneModelError(f"grid_sample: mode {mode!r} is not one of {', '.join(modes)}")
    return _call("GridSample", input, grid, mode=modes[mode], padding_mode=padding_mode,
                 align_corners=int(bool(align_corners)))


def affine_grid(theta: Tensor, size, align_corners: bool | None = None) -> Tensor:
    """``torch.nn.functional.affine_grid``: the AffineGrid op (differentiable in theta)."""
    size_t = trace_state.shape_operand(tuple(size), sizes=False)
    return _call("AffineGrid", theta, size_t, align_corners=int(bool(align_corners)))


__all__: Sequence[str] = ["affine_grid", "grid_sample", "interpolate", "upsample",
                          "upsample_bilinear", "upsample_nearest"]
