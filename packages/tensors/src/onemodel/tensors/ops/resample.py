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

import functools
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
    """(tap indices (out, T), coefficients (out, T), extrapolated rows or None) for one axis:
    output i is sum_k coef[i, k] * input[idx[i, k]]."""
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
    if mode == "nearest":  # one tap per output: the one chosen
        pick = np.argmax(coef, axis=1)[:, None]
        idx = np.take_along_axis(idx, pick, axis=1)
        coef = np.ones(idx.shape)
    outside = None
    if ctm == "tf_crop_and_resize":
        outside = (x < 0) | (x > n_in - 1)
        coef = np.where(outside[:, None], 0.0, coef)
        if not outside.any():
            outside = None
    return idx, coef, outside


def _weights(shape, roi, scales, sizes, attrs):
    """([(axis, tap indices, coefficients, extrapolated rows)] for each axis that changes, in
    ONNX's order; the output shape). Cached: a training loop asks for the same plan each step."""
    def key(a):
        return None if a is None else tuple(np.asarray(a).reshape(-1).tolist())

    attr_key = tuple((k, tuple(v) if isinstance(v, (list, tuple)) else v)
                     for k, v in sorted(attrs.items()))
    return _weights_cached(tuple(int(d) for d in shape), key(roi), key(scales), key(sizes),
                           attr_key)


@functools.lru_cache(maxsize=256)
def _weights_cached(shape, roi, scales, sizes, attr_key):
    attrs = dict(attr_key)
    rank = len(shape)
    if scales is not None and len(scales) == 0:
        scales = None
    if sizes is not None and len(sizes) == 0:
        sizes = None
    scale, out, ax = _resize_plan(
        shape, None if scales is None else [float(s) for s in scales],
        None if sizes is None else [int(s) for s in sizes], attrs["axes"],
        attrs["keep_aspect_ratio_policy"])
    tf_crop = _text(attrs["coordinate_transformation_mode"]) == "tf_crop_and_resize"
    full_roi = None
    if tf_crop:
        r = [float(v) for v in roi]
        full_roi = [(0.0, 1.0)] * rank
        for i, a in enumerate(ax):
            full_roi[a] = (r[i], r[len(ax) + i])
    plan = []
    for a in ax:
        if out[a] == shape[a] and math.isclose(scale[a], 1.0) and (
                not tf_crop or full_roi[a] == (0.0, 1.0)):
            continue  # identity along this axis
        idx, coef, outside = _axis_weights(shape[a], out[a], scale[a],
                                           full_roi[a] if tf_crop else None, attrs)
        dense = None
        if shape[a] * out[a] <= _DENSE_MAX:  # small: one matmul beats a gather per tap
            dense = np.zeros((out[a], shape[a]))
            np.add.at(dense, (np.broadcast_to(np.arange(out[a])[:, None], idx.shape), idx), coef)
        back = None if dense is not None else _transpose_taps(idx, coef, shape[a])
        for arr in (idx, coef, outside, dense, *(back or ())):
            if arr is not None:
                arr.flags.writeable = False  # shared by every call that hits the cache
        plan.append((a, idx, coef, outside, dense, back))
    return plan, tuple(out)


_DENSE_MAX = 64 * 64  # axes whose (out, in) weight matrix is at most this big use a matmul


def _apply(x, a, w):
    """Contract axis ``a`` of ``x`` with the rows of ``w`` (out, in)."""
    return np.moveaxis(np.moveaxis(x, a, -1) @ w.T, -1, a)


def _transpose_taps(idx, coef, n_in):
    """The adjoint's taps: for each input position, the output positions that read it and with
    what coefficient (padded with zero coefficients), so the gradient is a gather too. None
    when the padding would be wasteful (most outputs read one edge input)."""
    n_out = idx.shape[0]
    rows = np.broadcast_to(np.arange(n_out)[:, None], idx.shape).reshape(-1)
    cols, c = idx.reshape(-1), coef.reshape(-1)
    keep = c != 0
    rows, cols, c = rows[keep], cols[keep], c[keep]
    if n_in == 0 or len(cols) == 0:
        return None
    order = np.argsort(cols, kind="stable")
    rows, cols, c = rows[order], cols[order], c[order]
    counts = np.bincount(cols, minlength=n_in)
    width = int(counts.max())
    if n_in * width > 4 * len(cols) + 64:
        return None
    start = np.concatenate(([0], np.cumsum(counts)[:-1]))
    pos = np.arange(len(cols)) - start[cols]
    tidx = np.zeros((n_in, width), np.int64)
    tcoef = np.zeros((n_in, width))
    tidx[cols, pos] = rows
    tcoef[cols, pos] = c
    return tidx, tcoef


def _along(v, a, ndim):
    shape = [1] * ndim
    shape[a] = -1
    return v.reshape(shape)


def _gather(x, a, idx, coef):
    """Output rows along axis ``a``: sum over taps of coef * x[idx]."""
    y = None
    for k in range(idx.shape[1]):
        term = np.take(x, idx[:, k], axis=a)
        c = coef[:, k]
        if not np.all(c == 1):
            term *= _along(c.astype(x.dtype), a, x.ndim)
        y = term if y is None else np.add(y, term, out=y)
    return y


def _scatter(g, a, idx, coef, n_in):
    """The adjoint of :func:`_gather`: each output row's gradient added back to its taps."""
    shape = list(g.shape)
    shape[a] = n_in
    out = np.zeros(shape, g.dtype)
    for k in range(idx.shape[1]):
        c = coef[:, k]
        vals = g if np.all(c == 1) else g * _along(c.astype(g.dtype), a, g.ndim)
        col = idx[:, k]
        if len(col) == 0:
            continue
        if np.any(col[1:] < col[:-1]):
            order = np.argsort(col, kind="stable")
            col, vals = col[order], np.take(vals, order, axis=a)
        starts = np.flatnonzero(np.concatenate(([True], col[1:] != col[:-1])))
        sums = np.add.reduceat(vals, starts, axis=a)
        index = [slice(None)] * g.ndim
        index[a] = col[starts]
        out[tuple(index)] += sums
    return out


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
    nearest = _text(mode) == "nearest"
    work = X if (X.dtype.kind == "f" and X.dtype != np.float16) or nearest else \
        X.astype(np.float32 if X.dtype == np.float16 else np.float64)
    y = work
    for a, idx, coef, outside, dense, _ in plan:
        y = _gather(y, a, idx, coef) if dense is None or y.dtype.kind != "f" else \
            _apply(y, a, dense.astype(y.dtype))
        if outside is not None:
            y[(slice(None),) * a + (outside,)] = extrapolation_value
    if y is X:
        y = X.copy()
    if y.dtype == X.dtype:
        return np.ascontiguousarray(y).reshape(out)
    if X.dtype.kind == "f":
        return y.astype(X.dtype).reshape(out)
    info = np.iinfo(X.dtype)
    return np.clip(np.rint(y), info.min, info.max).astype(X.dtype).reshape(out)


def _resize_grad_shape(specs, **attrs):
    return TensorSpec(specs[0].shape, same_dtype(specs[:2], FLOATING))


@defop("ResizeGrad", shape=_resize_grad_shape, domain="onemodel", traceable=False)
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
    g = dY.astype(np.float32) if dY.dtype == np.float16 else dY
    for a, idx, coef, outside, dense, back in reversed(plan):
        if outside is not None:
            g = g.copy()
            g[(slice(None),) * a + (outside,)] = 0
        if dense is not None:
            g = _apply(g, a, dense.T.astype(g.dtype))
        elif back is not None:
            g = _gather(g, a, *back)
        else:
            g = _scatter(g, a, idx, coef, X.shape[a])
    if g is dY:
        g = dY.copy()
    return np.ascontiguousarray(g, dY.dtype).reshape(X.shape)



# GridSample ------------------------------------------------------------------------------------

def _grid_sample_shape(specs, *, align_corners=0, mode="linear", padding_mode="zeros"):
    x, grid = specs
    dt = same_dtype(specs, FLOATING)
    mode, padding_mode = _text(mode), _text(padding_mode)
    if mode not in ("linear", "nearest", "cubic"):
        raise ShapeError(f"mode {mode!r} is not one of linear, nearest, cubic")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ShapeError(f"padding_mode {padding_mode!r} is not one of zeros, border, reflection")
    nd = len(x.shape) - 2
    if nd < 1 or len(grid.shape) != nd + 2:
        raise ShapeError(f"X {format_shape(x.shape)} (N, C, *spatial) needs a grid of rank "
                         f"{nd + 2} (N, *out, {nd}), got {format_shape(grid.shape)}")
    if isinstance(grid.shape[-1], int) and grid.shape[-1] != nd:
        raise ShapeError(f"the grid's last axis holds {grid.shape[-1]} coordinates for {nd} "
                         "spatial axes")
    if mode == "cubic" and nd != 2:
        raise ShapeError("mode cubic samples 2-D images (N, C, H, W) only")
    if isinstance(x.shape[0], int) and isinstance(grid.shape[0], int) and \
            x.shape[0] != grid.shape[0]:
        raise ShapeError(f"X has batch {x.shape[0]} but the grid has {grid.shape[0]}")
    return TensorSpec((x.shape[0], x.shape[1], *grid.shape[1:-1]), dt)


def _reflect(x, lo, hi):
    """Reflect coordinates by the near border until they lie in [lo, hi] (ONNX's rule)."""
    span = hi - lo
    if span <= 0:
        return np.full_like(x, lo)
    below, above = x < lo, x > hi
    dx = np.where(below, lo - x, np.where(above, x - hi, 0.0))
    n = np.floor(dx / span)
    r = dx - n * span
    even = n % 2 == 0
    low_side = np.where(even, lo + r, hi - r)
    high_side = np.where(even, hi - r, lo + r)
    return np.where(below, low_side, np.where(above, high_side, x))


def _reflect_slope(x, lo, hi):
    """d reflect(x) / dx: +1 or -1 by how many times ``x`` was reflected."""
    span = hi - lo
    if span <= 0:
        return np.zeros_like(x)
    below, above = x < lo, x > hi
    dx = np.where(below, lo - x, np.where(above, x - hi, 0.0))
    even = np.floor(dx / span) % 2 == 0
    return np.where(below | above, np.where(even, -1.0, 1.0), 1.0)


def _gs_taps(x, size, mode, padding_mode, align_corners):
    """(indices (P, T), weights (P, T), d weights / d x (P, T)) along one axis for normalized
    coordinates ``x`` (P,)."""
    if align_corners:
        pos = (x + 1) / 2 * (size - 1)
        lo, hi, dpos = 0.0, size - 1.0, (size - 1) / 2
    else:
        pos = ((x + 1) * size - 1) / 2
        lo, hi, dpos = -0.5, size - 0.5, size / 2
    if mode == "nearest":
        pos = np.rint(pos)
    outside = (pos < lo) | (pos > hi)
    slope = np.full(pos.shape, float(dpos))
    if padding_mode == "border":
        slope = np.where(outside & ((pos < 0) | (pos > size - 1)), 0.0, slope)
        pos = np.where(outside, np.clip(pos, 0, size - 1), pos)
    elif padding_mode == "reflection":
        slope = slope * _reflect_slope(pos, lo, hi)
        pos = np.where(outside, _reflect(pos, lo, hi), pos)
    if mode == "nearest":
        idx = np.trunc(pos).astype(np.int64)[:, None]
        w = np.ones(idx.shape)
        dw = np.zeros(idx.shape)
    else:
        base = np.floor(pos)
        t = pos - base
        base = base.astype(np.int64)
        if mode == "linear":
            idx = base[:, None] + np.array([0, 1])[None, :]
            w = np.stack([1 - t, t], axis=1)
            dw = np.stack([-np.ones_like(t), np.ones_like(t)], axis=1)
        else:
            offsets = np.array([-1, 0, 1, 2])[None, :]
            idx = base[:, None] + offsets
            w = _cubic(offsets - t[:, None], -0.75)
            dw = -_cubic_slope(offsets - t[:, None], -0.75)
        dw = dw * slope[:, None]
    if padding_mode == "zeros":
        out = (idx < 0) | (idx >= size)
        w = np.where(out, 0.0, w)
        dw = np.where(out, 0.0, dw)
    elif padding_mode == "reflection":
        idx = np.trunc(_reflect(idx.astype(np.float64), lo, hi)).astype(np.int64)
    return np.clip(idx, 0, max(size - 1, 0)), w, dw


def _cubic_slope(t, a):
    """d _cubic(t) / dt."""
    s = np.sign(t)
    t = np.abs(t)
    near = 3 * (a + 2) * t * t - 2 * (a + 3) * t
    far = 3 * a * t * t - 10 * a * t + 8 * a
    return s * np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _gs_setup(X, grid, mode, padding_mode, align_corners):
    n = X.shape[0]
    spatial = X.shape[2:]
    nd = len(spatial)
    p = math.prod(grid.shape[1:-1])
    coords = grid.reshape(n, p, nd).astype(np.float64)
    strides = [math.prod(spatial[i + 1:]) for i in range(nd)]
    taps = []
    for i in range(nd):  # spatial axis i reads grid coordinate nd - 1 - i (x is the last axis)
        idx, w, dw = _gs_taps(coords[..., nd - 1 - i].reshape(-1), spatial[i], mode,
                              padding_mode, align_corners)
        taps.append((idx.reshape(n, p, -1), w.reshape(n, p, -1), dw.reshape(n, p, -1)))
    return p, strides, taps


def _gs_combos(taps, strides, n, p):
    """(flat offsets (N, P), weights (N, P), [d weights / d coordinate i]) per tap combination."""
    for combo in np.ndindex(*(t[0].shape[-1] for t in taps)):
        offset = np.zeros((n, p), np.int64)
        parts = []
        for i, k in enumerate(combo):
            offset += taps[i][0][..., k] * strides[i]
            parts.append((taps[i][1][..., k], taps[i][2][..., k]))
        weight = np.prod([w for w, _ in parts], axis=0)
        slopes = []
        for i in range(len(parts)):
            d = parts[i][1]
            for j, (w, _) in enumerate(parts):
                if j != i:
                    d = d * w
            slopes.append(d)
        yield offset, weight, slopes


def _grid_sample_grad(ctx, g):
    x, grid = ctx.inputs
    gx, ggrid = call("GridSampleGrad", x, grid, g, **ctx.attrs)
    return (gx if x.requires_grad else None), (ggrid if grid.requires_grad else None)


@defop("GridSample", shape=_grid_sample_shape, grad=_grid_sample_grad, onnx_opset=20)
def grid_sample(X, grid, *, align_corners=0, mode="linear", padding_mode="zeros"):
    """ONNX GridSample (opset 20): sample X at the grid's normalized coordinates (x, y[, z]
    in [-1, 1]) with nearest, linear or cubic interpolation and zeros, border or reflection
    padding."""
    mode, padding_mode = _text(mode), _text(padding_mode)
    n, c = X.shape[:2]
    out_sp = grid.shape[1:-1]
    if n * c * math.prod(out_sp) == 0:
        return np.zeros((n, c, *out_sp), X.dtype)
    p, strides, taps = _gs_setup(X, grid, mode, padding_mode, align_corners)
    flat = X.reshape(n, c, -1).transpose(0, 2, 1)  # (N, S, C)
    batch = np.arange(n)[:, None]
    out = np.zeros((n, p, c))
    for offset, weight, _ in _gs_combos(taps, strides, n, p):
        out += flat[batch, offset] * weight[..., None]
    return np.ascontiguousarray(out.transpose(0, 2, 1)).reshape(n, c, *out_sp).astype(X.dtype)


def _gs_grad_shape(specs, **attrs):
    x, grid = specs[0], specs[1]
    return [TensorSpec(x.shape, x.dtype), TensorSpec(grid.shape, grid.dtype)]


@defop("GridSampleGrad", shape=_gs_grad_shape, outputs=("dX", "dgrid"), domain="onemodel",
       traceable=False)
def grid_sample_grad(X, grid, dY, *, align_corners=0, mode="linear", padding_mode="zeros"):
    """Gradient of GridSample: dY scattered back onto X's taps, and the slope of the
    interpolation along each coordinate (zero for nearest and where border padding clamps)."""
    mode, padding_mode = _text(mode), _text(padding_mode)
    n, c = X.shape[:2]
    spatial = X.shape[2:]
    nd = len(spatial)
    s = math.prod(spatial)
    if n * c * math.prod(grid.shape[1:-1]) == 0:
        return np.zeros_like(X), np.zeros_like(grid)
    p, strides, taps = _gs_setup(X, grid, mode, padding_mode, align_corners)
    flat = X.reshape(n, c, s).transpose(0, 2, 1).astype(np.float64)  # (N, S, C)
    gy = dY.reshape(n, c, p).transpose(0, 2, 1).astype(np.float64)  # (N, P, C)
    batch = np.arange(n)[:, None]
    dx = np.zeros((n * s, c))
    dpos = np.zeros((n, p, nd))
    rows = (batch * s).astype(np.int64)
    for offset, weight, slopes in _gs_combos(taps, strides, n, p):
        np.add.at(dx, (rows + offset).reshape(-1), (gy * weight[..., None]).reshape(-1, c))
        value = np.einsum("npc,npc->np", flat[batch, offset], gy)
        for i in range(nd):
            dpos[..., nd - 1 - i] += value * slopes[i]
    dX = dx.reshape(n, s, c).transpose(0, 2, 1).reshape(X.shape).astype(X.dtype)
    return np.ascontiguousarray(dX), dpos.reshape(grid.shape).astype(grid.dtype)


@onnx_adapter("GridSample", before=20)
def _grid_sample_16(node: ImportNode) -> None:
    """GridSample-16 named its modes bilinear and bicubic."""
    mode = _text(node.attrs.get("mode", "bilinear"))
    node.attrs["mode"] = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)


# AffineGrid ------------------------------------------------------------------------------------

def _affine_grid_shape(specs, *, align_corners=0):
    theta, size = specs
    dt = same_dtype(specs[:1], FLOATING)
    sizes = tuple(size.value) if size.value is not None else None
    if sizes is None:
        raise UnknownValueError("size must be known when the graph is planned (a constant or "
                                "computed from shapes)")
    nd = len(sizes) - 2
    if nd not in (2, 3):
        raise ShapeError(f"size {list(sizes)} must be (N, C, H, W) or (N, C, D, H, W)")
    if len(theta.shape) != 3 or (isinstance(theta.shape[1], int) and theta.shape[1] != nd) or \
            (isinstance(theta.shape[2], int) and theta.shape[2] != nd + 1):
        raise ShapeError(f"theta must be (N, {nd}, {nd + 1}) for size {list(sizes)}, got "
                         f"{format_shape(theta.shape)}")
    return TensorSpec((theta.shape[0], *sizes[2:], nd), dt)


def _affine_base(spatial, align_corners):
    """Homogeneous base grid (P, nd + 1): (x, y[, z], 1) per output position."""
    axes = []
    for n in spatial:
        if align_corners:
            a = np.linspace(-1.0, 1.0, n) if n > 1 else np.array([-1.0] * n)
        else:
            a = (np.arange(n) * 2 + 1) / n - 1
        axes.append(a)
    mesh = np.meshgrid(*axes, indexing="ij")
    cols = [m.reshape(-1) for m in reversed(mesh)]  # x (the last axis) first
    return np.stack([*cols, np.ones(math.prod(spatial))], axis=1)


def _affine_grid_grad(ctx, g):
    _theta, size = ctx.inputs
    sizes = [int(v) for v in size.numpy().reshape(-1)]
    nd = len(sizes) - 2
    base = _affine_base(sizes[2:], ctx.attrs["align_corners"]).astype(g.numpy().dtype)
    n = sizes[0]
    gt = g.reshape(n, math.prod(sizes[2:]), nd).transpose(1, 2)  # (N, nd, P)
    return gt @ _wrap(base), None


def _wrap(arr):
    from ._grad import _tensor

    return _tensor()._wrap(arr)


@defop("AffineGrid", shape=_affine_grid_shape, grad=_affine_grid_grad, static=("size",),
       onnx_opset=20)
def affine_grid(theta, size, *, align_corners=0):
    """ONNX AffineGrid (opset 20): the sampling grid (N, *spatial, nd) that the affine
    matrices theta (N, nd, nd + 1) make of a normalized base grid."""
    sizes = [int(v) for v in np.asarray(size).reshape(-1)]
    base = _affine_base(sizes[2:], align_corners).astype(theta.dtype)
    nd = len(sizes) - 2
    grid = base @ np.swapaxes(theta, 1, 2)  # (N, P, nd)
    return np.ascontiguousarray(grid.reshape(theta.shape[0], *sizes[2:], nd))


# CenterCropPad ---------------------------------------------------------------------------------

def _ccp_shape(specs, *, axes=None):
    x, shape = specs
    if shape.value is None:
        raise UnknownValueError("shape must be known when the graph is planned (a constant or "
                                "computed from shapes)")
    ax = _axes(axes, len(x.shape))
    target = tuple(shape.value)
    if len(target) != len(ax):
        raise ShapeError(f"shape has {len(target)} values for {len(ax)} axes")
    out = list(x.shape)
    for a, n in zip(ax, target):
        if isinstance(n, int) and n < 0:
            raise ShapeError(f"shape {list(target)} has a negative size")
        out[a] = n
    return TensorSpec(tuple(out), x.dtype)


def _ccp_grad(ctx, g):
    x = ctx.inputs[0]
    ax = _axes(ctx.attrs["axes"], x.ndim)
    back = np.asarray([x.shape[a] for a in ax], np.int64)
    return call("CenterCropPad", g, _wrap(back), axes=tuple(ax)), None


@defop("CenterCropPad", shape=_ccp_shape, grad=_ccp_grad, static=("shape",), onnx_opset=18)
def center_crop_pad(input_data, shape, *, axes=None):
    """ONNX CenterCropPad (opset 18): crop or zero-pad each listed axis to its new size around
    the centre (an odd difference puts the extra element at the end)."""
    ax = _axes(axes, input_data.ndim)
    target = [int(v) for v in np.asarray(shape).reshape(-1)]
    out = list(input_data.shape)
    src = [slice(None)] * input_data.ndim
    dst = [slice(None)] * input_data.ndim
    for a, n in zip(ax, target):
        d = input_data.shape[a]
        out[a] = n
        if n < d:
            start = (d - n) // 2
            src[a] = slice(start, start + n)
        elif n > d:
            start = (n - d) // 2
            dst[a] = slice(start, start + d)
    res = np.zeros(out, input_data.dtype)
    res[tuple(dst)] = input_data[tuple(src)]
    return res


# Col2Im ----------------------------------------------------------------------------------------

def _col2im_geometry(image, block, dilations, pads, strides):
    nd = len(image)
    d = tuple(dilations) if dilations else (1,) * nd
    p = tuple(pads) if pads else (0,) * (2 * nd)
    s = tuple(strides) if strides else (1,) * nd
    blocks = []
    for i in range(nd):
        n = (image[i] + p[i] + p[i + nd] - d[i] * (block[i] - 1) - 1) // s[i] + 1
        blocks.append(n)
    return d, p, s, blocks


def _col2im_shape(specs, *, dilations=None, pads=None, strides=None):
    x, image, block = specs
    if image.value is None or block.value is None:
        raise UnknownValueError("image_shape and block_shape must be known when the graph is "
                                "planned (constants)")
    im, bl = tuple(image.value), tuple(block.value)
    if len(im) != len(bl):
        raise ShapeError(f"image_shape {list(im)} and block_shape {list(bl)} differ in rank")
    if len(x.shape) != 3:
        raise ShapeError(f"input must be (N, C * prod(block_shape), L), got "
                         f"{format_shape(x.shape)}")
    k = math.prod(bl)
    if isinstance(x.shape[1], int) and x.shape[1] % k:
        raise ShapeError(f"input axis 1 ({x.shape[1]}) is not a multiple of prod(block_shape) "
                         f"= {k}")
    if all(isinstance(v, int) for v in im):
        _, _, _, blocks = _col2im_geometry(im, bl, dilations, pads, strides)
        if min(blocks) < 1:
            raise ShapeError(f"no block fits in image_shape {list(im)} with these pads")
        if isinstance(x.shape[2], int) and x.shape[2] != math.prod(blocks):
            raise ShapeError(f"input has {x.shape[2]} blocks, image_shape {list(im)} holds "
                             f"{' x '.join(map(str, blocks))} = {math.prod(blocks)}")
    return TensorSpec((x.shape[0], floordiv(x.shape[1], k), *im), x.dtype)


@defop("Col2Im", shape=_col2im_shape, static=("image_shape", "block_shape"), onnx_opset=18)
def col2im(input, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    """ONNX Col2Im (opset 18): add sliding blocks (N, C * prod(block), L) back into images
    (N, C, *image_shape), the inverse layout of an unfold (overlaps sum)."""
    from .nn import _col2im, _crop

    im = [int(v) for v in np.asarray(image_shape).reshape(-1)]
    bl = [int(v) for v in np.asarray(block_shape).reshape(-1)]
    nd = len(im)
    d, p, s, blocks = _col2im_geometry(im, bl, dilations, pads, strides)
    n = input.shape[0]
    c = input.shape[1] // math.prod(bl)
    cols = input.reshape(n, c, *bl, *blocks)
    padded = (n, c, *(im[i] + p[i] + p[i + nd] for i in range(nd)))
    out = _col2im(cols, padded, tuple(bl), s, d, tuple(blocks))
    return np.ascontiguousarray(_crop(out, p[:nd], p[nd:]))
