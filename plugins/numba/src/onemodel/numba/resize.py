"""Resize of the two spatial axes of NCHW float32/float64 tensors (every mode, coordinate
transformation and antialias the reference computes): the reference's own per-axis taps
(``resample._weights``: which inputs each output reads and with what weight) applied by one
numba pass per plane, a row pass then a column pass, instead of numpy's gathers and moveaxis
matmuls. A segmentation head's 8x bilinear upsampling of 1x21x64x64 measured 21 ms in the
reference (docs/benchmarks.md, "Tenth round"). Other axes, and tf_crop_and_resize's
extrapolated positions, go to the reference kernel."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from numba import prange
from onemodel.tensors.ops import resample
from onemodel.tensors.ops.specialize import CallSite, specializer

from . import _jit
from ._jit import jit, sync_threads

U = np.uint64
_PLANES_PER_TASK = 4


@jit(parallel=True)
def _resize_planes(x, iy, cy, ixt, cxt, out):
    """out[p, i, j] = sum_k cy[i, k] * sum_l cxt[l, j] * x[p, iy[i, k], ixt[l, j]] for the
    (P, H, W) planes ``x`` into (P, OH, OW) ``out``: each input row resampled along its
    width once (the taps of the width transposed, (T, OW), so their loads are contiguous
    and one or two taps are one expression that vectorizes), then each output row as a
    weighted sum of those rows, a contiguous sweep."""
    planes, h, w = x.shape
    oh, ow = out.shape[1], out.shape[2]
    ty, tx = iy.shape[1], ixt.shape[0]
    xf = x.reshape(x.size)
    of = out.reshape(out.size)
    i0, c0 = ixt[0], cxt[0]
    i1, c1 = ixt[min(1, tx - 1)], cxt[min(1, tx - 1)]
    i2, c2 = ixt[min(2, tx - 1)], cxt[min(2, tx - 1)]
    i3, c3 = ixt[min(3, tx - 1)], cxt[min(3, tx - 1)]
    for task in prange((planes + _PLANES_PER_TASK - 1) // _PLANES_PER_TASK):
        rows = np.empty(h * ow, x.dtype)
        for p in range(task * _PLANES_PER_TASK, min(planes, (task + 1) * _PLANES_PER_TASK)):
            src = p * h * w
            for r in range(h):
                s0 = src + r * w
                d0 = r * ow
                if tx == 1:
                    for j in range(ow):
                        rows[U(d0 + j)] = c0[j] * xf[U(s0 + i0[j])]
                elif tx == 2:
                    for j in range(ow):
                        rows[U(d0 + j)] = c0[j] * xf[U(s0 + i0[j])] + c1[j] * xf[U(s0 + i1[j])]
                elif tx == 4:  # cubic
                    for j in range(ow):
                        rows[U(d0 + j)] = (c0[j] * xf[U(s0 + i0[j])] + c1[j] * xf[U(s0 + i1[j])]
                                           + c2[j] * xf[U(s0 + i2[j])]
                                           + c3[j] * xf[U(s0 + i3[j])])
                else:
                    for j in range(ow):
                        rows[U(d0 + j)] = c0[j] * xf[U(s0 + i0[j])]
                    for t in range(1, tx):
                        it, ct = ixt[t], cxt[t]
                        for j in range(ow):
                            rows[U(d0 + j)] += ct[j] * xf[U(s0 + it[j])]
            dst = p * oh * ow
            for i in range(oh):
                d0 = dst + i * ow
                c = cy[i, 0]
                r0 = iy[i, 0] * ow
                if ty == 2:
                    cb = cy[i, 1]
                    r1 = iy[i, 1] * ow
                    for j in range(ow):
                        of[U(d0 + j)] = c * rows[U(r0 + j)] + cb * rows[U(r1 + j)]
                    continue
                if ty == 4:  # cubic
                    cb, cc, cd = cy[i, 1], cy[i, 2], cy[i, 3]
                    r1, r2, r3 = iy[i, 1] * ow, iy[i, 2] * ow, iy[i, 3] * ow
                    for j in range(ow):
                        of[U(d0 + j)] = (c * rows[U(r0 + j)] + cb * rows[U(r1 + j)]
                                         + cc * rows[U(r2 + j)] + cd * rows[U(r3 + j)])
                    continue
                for j in range(ow):
                    of[U(d0 + j)] = c * rows[U(r0 + j)]
                for k in range(1, ty):
                    c = cy[i, k]
                    r0 = iy[i, k] * ow
                    for j in range(ow):
                        of[U(d0 + j)] += c * rows[U(r0 + j)]


def _key(v):
    return None if v is None else tuple(np.asarray(v).reshape(-1).tolist())


@lru_cache(maxsize=256)
def _taps(shape, roi, scales, sizes, attr_key, dtype):
    """(iy, cy, ix^T, cx^T, output shape) for a 4-D input of ``shape``, the coefficients in
    ``dtype``; None where the reference must run (an axis other than H and W changes, or
    tf_crop_and_resize extrapolates some positions)."""
    plan, out = resample._weights_cached(shape, roi, scales, sizes, attr_key)
    per_axis = {}
    for a, idx, coef, outside, _dense, _back in plan:
        if a < 2 or outside is not None:
            return None
        per_axis[a] = (np.ascontiguousarray(idx, np.int64), np.ascontiguousarray(coef, dtype))
    for a in (2, 3):
        if a not in per_axis:  # unchanged: every output reads its own position
            per_axis[a] = (np.arange(shape[a], dtype=np.int64)[:, None],
                           np.ones((shape[a], 1), dtype))
    ix, cx = per_axis[3]
    taps = [*per_axis[2], np.ascontiguousarray(ix.T), np.ascontiguousarray(cx.T)]
    for arr in taps:
        arr.flags.writeable = False  # shared by every call that hits the cache
    return (*taps, out)


def _attr_key(attrs) -> tuple:
    return tuple((k, tuple(v) if isinstance(v, (list, tuple)) else v)
                 for k, v in sorted(attrs.items()))


def _run(X, taps):
    iy, cy, ixt, cxt, oshape = taps
    out = np.empty(oshape, X.dtype)
    if out.size:
        n, c, h, w = X.shape
        kernel = _resize_planes if _jit._parallel else _resize_planes.serial
        kernel(np.ascontiguousarray(X).reshape(n * c, h, w), iy, cy, ixt, cxt,
               out.reshape(n * c, oshape[2], oshape[3]))
    return out


def resize(X, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
           coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
           extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
           nearest_mode="round_prefer_floor"):
    """ONNX Resize; see the module's docstring for what runs here."""
    attrs = dict(antialias=antialias, axes=axes,
                 coordinate_transformation_mode=coordinate_transformation_mode,
                 cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
                 keep_aspect_ratio_policy=keep_aspect_ratio_policy, mode=mode,
                 nearest_mode=nearest_mode)
    taps = None
    if X.ndim == 4 and X.dtype in (np.float32, np.float64) and 0 not in X.shape:
        taps = _taps(tuple(int(d) for d in X.shape), _key(roi), _key(scales), _key(sizes),
                     _attr_key(attrs), np.dtype(X.dtype))
    if taps is None:
        return resample.resize.kernel(X, roi, scales, sizes,
                                      extrapolation_value=extrapolation_value, **attrs)
    sync_threads()
    return _run(X, taps)


@specializer(resize)
def _resize_at(site: CallSite):
    """Resize planned for its input shape, with roi, scales and sizes known while planning
    (constants, or computed from shapes): the taps are worked out once."""
    shape, dtype = site.shapes[0], site.dtypes[0]
    if shape is None or len(shape) != 4 or dtype not in (np.float32, np.float64) or 0 in shape:
        return None
    given = list(site.values[1:4]) + [None] * (4 - len(site.values))
    for i, v in enumerate(given[:3], start=1):
        if v is None and i < len(site.shapes) and site.shapes[i] is not None:
            return None  # an input fed at run time: the generic call reads it each time
    a = site.attrs
    attrs = {k: a[k] for k in ("antialias", "axes", "coordinate_transformation_mode",
                               "cubic_coeff_a", "exclude_outside", "keep_aspect_ratio_policy",
                               "mode", "nearest_mode") if k in a}
    try:
        taps = _taps(tuple(shape), *(_key(v) for v in given[:3]),
                     _attr_key({**_DEFAULTS, **attrs}), np.dtype(dtype))
    except Exception:  # what the generic call refuses: it names the problem
        return None
    if taps is None:
        return None
    generic = site.generic
    planned = tuple(given[:3])
    keys = tuple(_key(v) for v in planned)

    def resize_at(X, roi=None, scales=None, sizes=None):
        if X.shape != shape or X.dtype != dtype or not (
                (roi is planned[0] and scales is planned[1] and sizes is planned[2])
                or (_key(roi), _key(scales), _key(sizes)) == keys):
            return generic(X, roi, scales, sizes)
        sync_threads()
        return _run(X, taps)
    return resize_at


_DEFAULTS = dict(antialias=0, axes=None, coordinate_transformation_mode="half_pixel",
                 cubic_coeff_a=-0.75, exclude_outside=0, keep_aspect_ratio_policy="stretch",
                 mode="nearest", nearest_mode="round_prefer_floor")
