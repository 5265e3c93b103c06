"""Resampling ops: Resize, GridSample, AffineGrid, Col2Im, CenterCropPad.

Resize is separable and linear in X: along each resized axis the output is a (out, in) weight
matrix applied to the input (plus a constant where ``tf_crop_and_resize`` extrapolates). The
kernel builds those matrices once per call and applies them with matmul; its gradient
(``ResizeGrad``) applies the transposed matrices in reverse order, so it is the exact adjoint
for every mode (nearest, linear, cubic, antialias).

Legacy forms (``Upsample`` of opsets 7-9, Resize of opsets 10/11 with its ``roi``/``scales``
inputs in other places) import through adapters on this definition.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ..dtype import FLOATING, NUMERIC, DType
from ..errors import ShapeError
from ..symbolic import floordiv, format_shape, mul
from ._grad import call
from .adapters import ImportNode, onnx_adapter
from .base import TensorSpec, UnknownValueError, defop, norm_axis, same_dtype

_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_crop_and_resize")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_POLICIES = ("stretch", "not_larger", "not_smaller")


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _check_attrs(mode, coordinate_transformation_mode, nearest_mode, keep_aspect_ratio_policy,
                 antialias) -> None:
    mode = _text(mode)
    if mode not in ("nearest", "linear", "cubic"):
        raise ShapeError(f"mode {mode!r} is not one of nearest, linear, cubic")
    ctm = _text(coordinate_transformation_mode)
    if ctm not in _COORD_MODES:
        raise ShapeError(f"coordinate_transformation_mode {ctm!r} is not one of "
                         f"{', '.join(_COORD_MODES)}")
    if _text(nearest_mode) not in _NEAREST_MODES:
        raise ShapeError(f"nearest_mode {_text(nearest_mode)!r} is not one of "
                         f"{', '.join(_NEAREST_MODES)}")
    if _text(keep_aspect_ratio_policy) not in _POLICIES:
        raise ShapeError(f"keep_aspect_ratio_policy {_text(keep_aspect_ratio_policy)!r} is not "
                         f"one of {', '.join(_POLICIES)}")
    if antialias and mode == "nearest":
        raise ShapeError("antialias=1 needs mode linear or cubic, not nearest")


def _present(spec) -> bool:
    """An optional input counts as given when it is there and not empty (opsets 11-13 pass an
    empty ``scales`` beside ``sizes``)."""
    return spec is not None and not (len(spec.shape) == 1 and spec.shape[0] == 0)


def _axes(axes, rank: int) -> list[int]:
    if axes is None:
        return list(range(rank))
    out = [norm_axis(int(a), rank) for a in axes]
    if len(set(out)) != len(out):
        raise ShapeError(f"axes {list(axes)} repeat an axis")
    return out


def _scale_dim(dim, scale: float):
    """floor(dim * scale), exactly (a float32 scale times a size is exact in float64), and
    symbolic when ``dim`` is: (dim * p) // q for the scale's exact fraction p / q."""
    if isinstance(dim, int):
        return math.floor(dim * float(scale))
    frac = Fraction(float(scale))
    return floordiv(mul(dim, frac.numerator), frac.denominator)


def _resize_plan(shape, scales, sizes, axes, policy):
    """Per-axis (scale, output size) for every axis of X; ``shape`` may hold symbolic dims only
    where the output is computed from scales (or given by sizes under 'stretch')."""
    rank = len(shape)
    ax = _axes(axes, rank)
    scale = [1.0] * rank
    out = list(shape)
    if scales is not None:
        if len(scales) != len(ax):
            raise ShapeError(f"scales has {len(scales)} values for {len(ax)} axes")
        for a, s in zip(ax, scales):
            s = float(s)
            if not s > 0:
                raise ShapeError(f"scales must be positive, got {list(scales)}")
            scale[a] = s
            out[a] = _scale_dim(shape[a], s)
        return scale, out, ax
    if len(sizes) != len(ax):
        raise ShapeError(f"sizes has {len(sizes)} values for {len(ax)} axes")
    policy = _text(policy)
    if policy == "stretch":
        for a, n in zip(ax, sizes):
            out[a] = n
            if isinstance(n, int) and isinstance(shape[a], int):
                if n < 0:
                    raise ShapeError(f"sizes must not be negative, got {list(sizes)}")
                scale[a] = n / shape[a] if shape[a] else 1.0
        return scale, out, ax
    if not all(isinstance(shape[a], int) for a in ax) or \
            not all(isinstance(n, int) for n in sizes):
        raise UnknownValueError(f"keep_aspect_ratio_policy {policy!r} needs the sizes of the "
                                "resized axes, known when the graph is planned")
    ratios = [n / shape[a] for a, n in zip(ax, sizes)]
    s = min(ratios) if policy == "not_larger" else max(ratios)
    for a in ax:
        scale[a] = s
        out[a] = int(s * shape[a] + 0.5)
    return scale, out, ax


def _resize_shape(specs, *, antialias=0, axes=None, coordinate_transformation_mode="half_pixel",
                  cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0,
                  keep_aspect_ratio_policy="stretch", mode="nearest",
                  nearest_mode="round_prefer_floor"):
    x = specs[0]
    roi, scales, sizes = (specs + [None] * 4)[1:4]
    _check_attrs(mode, coordinate_transformation_mode, nearest_mode, keep_aspect_ratio_policy,
                 antialias)
    dt = x.dtype
    if dt not in NUMERIC:
        raise ShapeError(f"X has dtype {dt.name}; Resize takes numeric tensors")
    if _present(scales) == _present(sizes):
        raise ShapeError("exactly one of scales and sizes must be given")
    if _present(scales):
        if scales.dtype not in FLOATING:
            raise ShapeError(f"scales must be a float tensor, got {scales.dtype.name}")
        if scales.value is None:
            raise UnknownValueError("scales must be known when the graph is planned (a constant)")
        _, out, _ = _resize_plan(x.shape, scales.value, None, axes, keep_aspect_ratio_policy)
    else:
        if sizes.dtype is not DType.I64:
            raise ShapeError(f"sizes must be an int64 tensor, got {sizes.dtype.name}")
        if sizes.value is None:
            raise UnknownValueError("sizes must be known when the graph is planned (a constant "
                                    "or computed from shapes)")
        _, out, _ = _resize_plan(x.shape, None, tuple(sizes.value), axes,
                                 keep_aspect_ratio_policy)
    if _text(coordinate_transformation_mode) == "tf_crop_and_resize":
        n_ax = len(_axes(axes, len(x.shape)))
        if roi is None or (len(roi.shape) == 1 and isinstance(roi.shape[0], int)
                           and roi.shape[0] != 2 * n_ax):
            raise ShapeError(f"tf_crop_and_resize needs roi with {2 * n_ax} values "
                             "(starts then ends of the resized axes)")
    for d in out:
        if isinstance(d, int) and d < 0:
            raise ShapeError(f"the output would have the negative shape {format_shape(out)}")
    return TensorSpec(tuple(out), dt)


# weights ---------------------------------------------------------------------------------------

def _source_coords(mode, y, scale, n_in, n_out, roi):
    """Where output positions ``y`` read the input (ONNX's coordinate transformations)."""
    width = scale * n_in  # ONNX's output_width: a float, not the rounded size
    if mode == "align_corners":
        return np.zeros(n_out) if width == 1 else y * (n_in - 1) / (width - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "pytorch_half_pixel":
        return np.full(n_out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
        return offset + (y + 0.5) / scale - 0.5
    # tf_crop_and_resize
    start, end = roi
    if width == 1:
        x = np.full(n_out, (end - start) * (n_in - 1) / 2)
    else:
        x = y * (end - start) * (n_in - 1) / (width - 1)
    return x + start * (n_in - 1)


def _cubic(t, a):
    t = np.abs(t)
    t2, t3 = t * t, t * t * t
    near = (a + 2) * t3 - (a + 3) * t2 + 1
    far = a * t3 - 5 * a * t2 + 8 * a * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _taps(mode, ratio, scale, nearest_mode, cubic_a, antialias):
    """(offsets of the taps from ``left``, coefficients (out, taps)) for ``ratio`` in (0, 1]."""
    if mode == "nearest":
        if nearest_mode == "round_prefer_floor":
            right = ratio > 0.5
        elif nearest_mode == "round_prefer_ceil":
            right = ratio >= 0.5
        elif nearest_mode == "floor":
            right = ratio == 1
        else:
            right = np.ones(ratio.shape, bool)
        return np.array([0, 1]), np.stack([~right, right], axis=1).astype(np.float64)
    if antialias and scale < 1:
        if mode == "linear":
            start = int(np.floor(-1 / scale) + 1)
        else:
            start = int(np.floor(-2 / scale) + 1)
        offsets = np.arange(start, 2 - start)
        t = (offsets[None, :] - ratio[:, None]) * scale
        c = np.clip(1 - np.abs(t), 0, 1) if mode == "linear" else _cubic(t, cubic_a)
        return offsets, c / c.sum(axis=1, keepdims=True)
    if mode == "linear":
        return np.array([0, 1]), np.stack([1 - ratio, ratio], axis=1)
    offsets = np.array([-1, 0, 1, 2])
    return offsets, _cubic(offsets[None, :] - ratio[:, None], cubic_a)


def _axis_weights(n_in, n_out, scale, roi, attrs):
    """(dense (out, in) weight matrix, extrapolated rows or None) for one axis."""
    ctm = _text(attrs["coordinate_transformation_mode"])
    mode = _text(attrs["mode"])
    y = np.arange(n_out, dtype=np.float64)
    x = _source_coords(ctm, y, scale, n_in, n_out, roi)
    # the tap left of x (x itself counts as right of its left neighbour): ratio in (0, 1]
    left = np.ceil(x).astype(np.int64) - 1
    ratio = x - left
    offsets, coef = _taps(mode, ratio, scale, _text(attrs["nearest_mode"]),
                          float(attrs["cubic_coeff_a"]), attrs["antialias"])
    idx = left[:, None] + offsets[None, :]
    if attrs["exclude_outside"]:
        coef = np.where((idx < 0) | (idx >= n_in), 0.0, coef)
        total = coef.sum(axis=1, keepdims=True)
        coef = coef / np.where(total == 0, 1.0, total)
    idx = np.clip(idx, 0, max(n_in - 1, 0))
    w = np.zeros((n_out, n_in))
    rows = np.broadcast_to(np.arange(n_out)[:, None], idx.shape)
    np.add.at(w, (rows, idx), coef)
    outside = None
    if ctm == "tf_crop_and_resize":
        outside = (x < 0) | (x > n_in - 1)
        w[outside] = 0.0
        if not outside.any():
            outside = None
    return w, outside


def _weights(shape, roi, scales, sizes, attrs):
    """[(axis, weights, extrapolated rows)] for each axis that changes, in ONNX's order."""
    rank = len(shape)
    if scales is not None and scales.size == 0:
        scales = None
    if sizes is not None and sizes.size == 0:
        sizes = None
    scale, out, ax = _resize_plan(
        tuple(shape), None if scales is None else [float(s) for s in scales.reshape(-1)],
        None if sizes is None else [int(s) for s in sizes.reshape(-1)], attrs["axes"],
        attrs["keep_aspect_ratio_policy"])
    tf_crop = _text(attrs["coordinate_transformation_mode"]) == "tf_crop_and_resize"
    full_roi = None
    if tf_crop:
        r = [float(v) for v in np.asarray(roi).reshape(-1)]
        full_roi = [(0.0, 1.0)] * rank
        for i, a in enumerate(ax):
            full_roi[a] = (r[i], r[len(ax) + i])
    plan = []
    for a in ax:
        if out[a] == shape[a] and math.isclose(scale[a], 1.0) and (
                not tf_crop or full_roi[a] == (0.0, 1.0)):
            continue  # identity along this axis
        w, outside = _axis_weights(shape[a], out[a], scale[a],
                                   full_roi[a] if tf_crop else None, attrs)
        plan.append((a, w, outside))
    return plan, out


def _apply(x, a, w):
    """Contract axis ``a`` of ``x`` with the rows of ``w`` (out, in)."""
    moved = np.moveaxis(x, a, -1)
    return np.moveaxis(moved @ w.T, -1, a)


def _attrs(**kw):
    return kw


def _resize_grad(ctx, g):
    x = ctx.inputs[0]
    rest = list(ctx.inputs[1:]) + [None] * (3 - len(ctx.inputs[1:]))
    return (call("ResizeGrad", x, g, *rest, **ctx.attrs), None, None, None)


def _resize_opset(attrs) -> int:
    """half_pixel_symmetric came in opset 19; axes, antialias and the aspect-ratio policy in 18;
    the other forms are Resize-13's."""
    if _text(attrs.get("coordinate_transformation_mode", "")) == "half_pixel_symmetric":
        return 19
    if attrs.get("axes") is not None or attrs.get("antialias") or \
            _text(attrs.get("keep_aspect_ratio_policy", "stretch")) != "stretch":
        return 18
    return 13


@onnx_adapter("Upsample")
def _upsample(node: ImportNode) -> None:
    """Upsample (opsets 7-9, removed in 10): scales as an attribute (7) or an input (9);
    nearest picks floor(y / scale), linear samples at y / scale (``asymmetric``)."""
    node.need(1)
    if "scales" in node.attrs:
        scales = node.const(node.attrs.pop("scales"), np.float32)
    else:
        node.need(2)
        scales = node.inputs[1]
    mode = _text(node.attrs.pop("mode", "nearest"))
    mode = {"bilinear": "linear", "trilinear": "linear"}.get(mode, mode)
    node.op = "Resize"
    node.inputs = [node.inputs[0], "", scales]
    node.attrs.update(mode=mode, coordinate_transformation_mode="asymmetric",
                      nearest_mode="floor")


@onnx_adapter("Resize", before=11)
def _resize_10(node: ImportNode) -> None:
    """Resize-10: inputs X and scales, the Upsample-9 sampling (``asymmetric``, floor)."""
    if len(node.inputs) >= 3:  # already in the later form (a renamed Upsample)
        return
    node.need(2)
    node.inputs = [node.inputs[0], "", node.inputs[1]]
    node.attrs.setdefault("coordinate_transformation_mode", "asymmetric")
    node.attrs.setdefault("nearest_mode", "floor")


@onnx_adapter("Resize", before=13)
def _resize_tf_half_pixel(node: ImportNode) -> None:
    """Resize-11's ``tf_half_pixel_for_nn`` (removed in 13) samples nearest at (y + 0.5) / s:
    rounding that down is ``half_pixel`` rounded half up, rounding it to the nearest (ties
    down) is ``half_pixel`` rounded up."""
    if _text(node.attrs.get("coordinate_transformation_mode", "")) != "tf_half_pixel_for_nn":
        return
    nearest = _text(node.attrs.get("nearest_mode", "round_prefer_floor"))
    mapped = {"floor": "round_prefer_ceil", "round_prefer_floor": "ceil"}.get(nearest)
    if mapped is None or _text(node.attrs.get("mode", "nearest")) != "nearest":
        raise node.error(f"coordinate_transformation_mode tf_half_pixel_for_nn with mode "
                         f"{_text(node.attrs.get('mode', 'nearest'))!r} and nearest_mode "
                         f"{nearest!r} has no opset-13 form")
    node.attrs.update(coordinate_transformation_mode="half_pixel", nearest_mode=mapped)


@defop("Resize", shape=_resize_shape, grad=_resize_grad, static=("scales", "sizes"),
       onnx_opset=_resize_opset)
def resize(X, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
           coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
           extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
           nearest_mode="round_prefer_floor"):
    """ONNX Resize (opset 19): nearest, linear or cubic resampling of any axes, from scales or
    sizes, with every coordinate transformation, antialias and aspect-ratio policy."""
    attrs = _attrs(antialias=antialias, axes=axes,
                   coordinate_transformation_mode=coordinate_transformation_mode,
                   cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
                   keep_aspect_ratio_policy=keep_aspect_ratio_policy, mode=mode,
                   nearest_mode=nearest_mode)
    plan, out = _weights(X.shape, roi, scales, sizes, attrs)
    if X.dtype.kind == "f":
        y = X
        for a, w, outside in plan:
            y = _apply(y, a, w.astype(X.dtype))
            if outside is not None:
                index = (slice(None),) * a + (outside,)
                y[index] = extrapolation_value
        return np.ascontiguousarray(y, X.dtype).reshape(out)
    y = X.astype(np.float64)
    for a, w, outside in plan:
        y = _apply(y, a, w)
        if outside is not None:
            y[(slice(None),) * a + (outside,)] = extrapolation_value
    info = np.iinfo(X.dtype)
    return np.clip(np.rint(y), info.min, info.max).astype(X.dtype).reshape(out)


def _resize_grad_shape(specs, **attrs):
    return TensorSpec(specs[0].shape, same_dtype(specs[:2], FLOATING))


@defop("ResizeGrad", shape=_resize_grad_shape, domain="onemodel")
def resize_grad(X, dY, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
                coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75,
                exclude_outside=0, extrapolation_value=0.0, keep_aspect_ratio_policy="stretch",
                mode="nearest", nearest_mode="round_prefer_floor"):
    """Gradient of Resize with respect to X (whose values are not read, only its shape): the
    transposed weight matrices applied in reverse order; extrapolated positions pass nothing."""
    attrs = _attrs(antialias=antialias, axes=axes,
                   coordinate_transformation_mode=coordinate_transformation_mode,
                   cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
                   keep_aspect_ratio_policy=keep_aspect_ratio_policy, mode=mode,
                   nearest_mode=nearest_mode)
    plan, _ = _weights(X.shape, roi, scales, sizes, attrs)
    g = dY
    for a, w, outside in reversed(plan):
        if outside is not None:
            g = g.copy()
            g[(slice(None),) * a + (outside,)] = 0
        g = _apply(g, a, w.T.astype(dY.dtype))
    return np.ascontiguousarray(g, dY.dtype).reshape(X.shape)

