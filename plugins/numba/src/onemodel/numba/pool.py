"""2-D max and average pooling (NCHW, float32/float64) in one pass over each output: the
window's value stays in a register instead of numpy's one pass over the output per kernel
position. Window bounds inside the image are precomputed per output row and column, so the
loops never test for padding; parallel over the N*C planes."""

from __future__ import annotations

import math
from functools import cache, lru_cache, partial

import numpy as np

from numba import prange
from onemodel.tensors import OneModelError
from onemodel.tensors.ops.nn import _geometry
from onemodel.tensors.ops.specialize import CallSite, Input, Output, planned, specializer

from . import _jit, pool_strided
from ._jit import jit, pick, sync_threads

U = np.uint64


@jit()
def _has_nan(x, start, stop):
    n = 0
    for t in range(start, stop):  # no early exit: the count vectorizes
        n += x[U(t)] != x[U(t)]
    return n > 0


@jit(parallel=True)
def _max_pool(x, out, h, w, oh, ow, dh, dw, sw, pl, h0, lo_h, hi_h, lo_q, hi_q, lowest):
    """out[p, y, q] = max of x[p] over the window's positions inside the image (-inf if none).
    Separable, row by row: the max over the window's rows, a contiguous sweep that
    vectorizes, then kw strided taps along that one row (lo_q[j]..hi_q[j]: the output columns
    tap j reaches inside the image). A plane holding NaN takes an exact loop so NaN wins, as
    in np.maximum."""
    planes = out.shape[0] // (oh * ow)
    kw = lo_q.shape[0]
    for p in prange(planes):
        src = p * h * w
        dst = p * oh * ow
        nan = _has_nan(x, src, src + h * w)
        acc = np.empty(ow, x.dtype)  # buffers that cannot alias x, so the loops vectorize
        col = np.empty(w, x.dtype)
        for y in range(oh):
            for q in range(ow):
                acc[U(q)] = lowest
            if nan:
                for i in range(lo_h[y], hi_h[y]):
                    row = src + (h0[y] + i * dh) * w - pl
                    for j in range(kw):
                        tap = row + j * dw
                        for q in range(lo_q[j], hi_q[j]):
                            v = x[U(tap + q * sw)]
                            if v > acc[U(q)] or v != v:
                                acc[U(q)] = v
            else:
                for c in range(w):
                    col[U(c)] = lowest
                for i in range(lo_h[y], hi_h[y]):
                    row = src + (h0[y] + i * dh) * w
                    for c in range(w):
                        v = x[U(row + c)]
                        o = col[U(c)]
                        col[U(c)] = v if v > o else o
                for j in range(kw):
                    tap = j * dw - pl
                    for q in range(lo_q[j], hi_q[j]):
                        v = col[U(tap + q * sw)]
                        o = acc[U(q)]
                        acc[U(q)] = v if v > o else o
            base = dst + y * ow
            for q in range(ow):
                out[U(base + q)] = acc[U(q)]


@jit(parallel=True)
def _avg_pool_2x2(x, out, h, w, oh, ow):
    """The common 2x2, stride-2 AveragePool whose windows all lie inside the image: four loads
    per output and no window tables (whose arguments cost more than the work on small
    planes: a step on 8x16x4x4, 7.8 -> 2.7 us)."""
    planes = out.shape[0] // (oh * ow)
    for p in prange(planes):
        src = p * h * w
        base = p * oh * ow
        for y in range(oh):
            r0 = src + 2 * y * w
            r1 = r0 + w
            o = base + y * ow
            for q in range(ow):
                out[U(o + q)] = ((x[U(r0 + 2 * q)] + x[U(r0 + 2 * q + 1)])
                                 + (x[U(r1 + 2 * q)] + x[U(r1 + 2 * q + 1)])) / 4


@jit(parallel=True)
def _max_pool_2x2(x, out, h, w, oh, ow):
    """The common 2x2, stride-2, unpadded MaxPool: four loads per output in one sweep per row
    (the separable path's per-row set-up costs more than this on small planes). NaN planes
    take the exact comparison, so NaN wins as in np.maximum."""
    planes = out.shape[0] // (oh * ow)
    for p in prange(planes):
        src = p * h * w
        base = p * oh * ow
        nan = _has_nan(x, src, src + h * w)
        for y in range(oh):
            r0 = src + 2 * y * w
            r1 = r0 + w
            o = base + y * ow
            if nan:
                for q in range(ow):
                    m = x[U(r0 + 2 * q)]
                    for v in (x[U(r0 + 2 * q + 1)], x[U(r1 + 2 * q)], x[U(r1 + 2 * q + 1)]):
                        if v > m or v != v:
                            m = v
                    out[U(o + q)] = m
            else:
                for q in range(ow):
                    a = x[U(r0 + 2 * q)]
                    b = x[U(r0 + 2 * q + 1)]
                    c = x[U(r1 + 2 * q)]
                    d = x[U(r1 + 2 * q + 1)]
                    a = a if a > b else b
                    c = c if c > d else d
                    out[U(o + q)] = a if a > c else c


@jit(parallel=True)
def _avg_pool(x, out, h, w, oh, ow, dh, dw, sw, pl, h0, lo_h, hi_h, lo_q, hi_q, n_h, n_w, zero):
    """out[p, y, q] = (sum of x[p] over the window inside the image) / (n_h[y] * n_w[q]),
    in the input's dtype; separable like the max: the window's rows summed in one contiguous
    sweep, then kw strided taps along that row."""
    planes = out.shape[0] // (oh * ow)
    kw = lo_q.shape[0]
    for p in prange(planes):
        src = p * h * w
        dst = p * oh * ow
        acc = np.empty(ow, x.dtype)
        col = np.empty(w, x.dtype)
        for y in range(oh):
            for c in range(w):
                col[U(c)] = zero
            for i in range(lo_h[y], hi_h[y]):
                row = src + (h0[y] + i * dh) * w
                for c in range(w):
                    col[U(c)] += x[U(row + c)]
            for q in range(ow):
                acc[U(q)] = zero
            for j in range(kw):
                tap = j * dw - pl
                for q in range(lo_q[j], hi_q[j]):
                    acc[U(q)] += col[U(tap + q * sw)]
            base = dst + y * ow
            for q in range(ow):
                out[U(base + q)] = acc[U(q)] / (n_h[y] * n_w[q])


# the (kernel height, kernel width, column stride) of the kernels compiled with these as
# constants, for windows without dilation: the common geometries (ONNX zoo, torchvision)
FIXED = frozenset({(3, 3, 1), (3, 3, 2), (2, 2, 1), (2, 2, 2)})


# no geometry compiled into a fixed MaxPool kernel: it reads the geometry from its arguments
_ANY_GEOMETRY = (-1, -1, -1, -1, -1, -1)


@lru_cache(maxsize=128)  # a kernel per planned geometry: a bound, as sessions meet many shapes
def _max_pool_fixed(kh, kw, sw, geometry=_ANY_GEOMETRY):
    """The MaxPool kernel of one (kh, kw, sw) in :data:`FIXED` (dilations 1): the loops over
    the window are unrolled and the column loops vectorize. Row by row: the window's kh rows
    reduced in one contiguous sweep into a column row padded on both sides with ``lowest``
    (``pl`` before, up to ``wp`` after), then the kw taps of each output column read from it
    without bounds tests. NaN wins as in np.maximum: the sweep also sums the window's rows,
    a NaN sum (a NaN dropped by the plain max, or inf - inf) redoes the row with NaN-aware
    selects, and a row holding NaN takes the NaN-aware taps.

    A planned call passes its ``geometry`` (h, w, oh, ow, pl, wp), compiled in as constants
    (numba keys its on-disk cache by them too): the row loops then have known lengths, which
    LLVM vectorizes without runtime remainders. SqueezeNet's 3x3/2 pools, one thread:
    1x96x109x109 272 -> 165 us, 1x256x54x54 237 -> 177 us, 1x512x27x27 157 -> 105 us,
    2x256x7x7 37 -> 17 us; ResNet-50's 1x64x112x112 166 -> 114 us."""
    gh, gw, goh, gow, gpl, gwp = geometry

    @jit(parallel=True)
    def kernel(x, out, h, w, oh, ow, pl, wp, h0, lo_h, hi_h, lowest):
        if gh >= 0:  # a closure constant: the branch is decided at compile time
            h, w, oh, ow, pl, wp = gh, gw, goh, gow, gpl, gwp
        planes = out.shape[0] // (oh * ow)
        cols = np.empty(planes * wp, x.dtype)  # one allocation: per plane it was 40-50 ns,
        for p in prange(planes):  # most of a 7x7 plane's time
            src = p * h * w
            dst = p * oh * ow
            col = cols[p * wp:(p + 1) * wp]
            for c in range(wp):
                col[U(c)] = lowest
            for y in range(oh):
                lo = lo_h[y]
                hi = hi_h[y]
                first = src + (h0[y] + lo) * w
                nan = 0
                if hi - lo == kh:  # the whole window inside the image: one sweep
                    for c in range(w):
                        a = x[U(first + c)]
                        b = a
                        for i in range(1, kh):
                            v = x[U(first + i * w + c)]
                            a = v if v > a else a
                            b += v  # NaN if a NaN was dropped (or inf - inf: a false alarm)
                        col[U(pl + c)] = a
                        nan += b != b
                    if nan:  # the NaN-aware sweep
                        for c in range(w):
                            a = x[U(first + c)]
                            for i in range(1, kh):
                                v = x[U(first + i * w + c)]
                                a = v if (v > a) | (v != v) else a
                            col[U(pl + c)] = a
                else:
                    for c in range(w):
                        col[U(pl + c)] = lowest
                    for i in range(hi - lo):
                        row = first + i * w
                        for c in range(w):
                            v = x[U(row + c)]
                            a = col[U(pl + c)]
                            col[U(pl + c)] = v if (v > a) | (v != v) else a
                    for c in range(w):
                        nan += col[U(pl + c)] != col[U(pl + c)]
                base = dst + y * ow
                if nan:
                    for q in range(ow):
                        a = col[U(q * sw)]
                        for j in range(1, kw):
                            v = col[U(q * sw + j)]
                            a = v if (v > a) | (v != v) else a
                        out[U(base + q)] = a
                else:
                    for q in range(ow):
                        a = col[U(q * sw)]
                        for j in range(1, kw):
                            v = col[U(q * sw + j)]
                            a = v if v > a else a
                        out[U(base + q)] = a
    return kernel


@cache
def _avg_pool_fixed(kh, kw, sw):
    """The AveragePool kernel of one (kh, kw, sw) in :data:`FIXED`, laid out like
    :func:`_max_pool_fixed` with a zero-padded column row. The sums run in the order of
    :func:`_avg_pool` (rows first, then taps left to right; a padded tap adds an exact 0), so
    both give the same values."""
    @jit(parallel=True)
    def kernel(x, out, h, w, oh, ow, pl, wp, h0, lo_h, hi_h, n_h, n_w, zero):
        planes = out.shape[0] // (oh * ow)
        cols = np.empty(planes * wp, x.dtype)  # one allocation (see _max_pool_fixed)
        for p in prange(planes):
            src = p * h * w
            dst = p * oh * ow
            col = cols[p * wp:(p + 1) * wp]
            for c in range(wp):
                col[U(c)] = zero
            for y in range(oh):
                lo = lo_h[y]
                hi = hi_h[y]
                first = src + (h0[y] + lo) * w
                if hi - lo == kh:
                    for c in range(w):
                        a = x[U(first + c)]
                        for i in range(1, kh):
                            a += x[U(first + i * w + c)]
                        col[U(pl + c)] = a
                else:
                    for c in range(w):
                        col[U(pl + c)] = zero
                    for i in range(hi - lo):
                        row = first + i * w
                        for c in range(w):
                            col[U(pl + c)] += x[U(row + c)]
                base = dst + y * ow
                n = n_h[y]
                for q in range(ow):
                    a = col[U(q * sw)]
                    for j in range(1, kw):
                        a += col[U(q * sw + j)]
                    out[U(base + q)] = a / (n * n_w[q])
    return kernel


@cache
def _max_pool_same(kh, kw):
    """The MaxPool kernel of a stride-1 (kh, kw) in :data:`FIXED` whose output has its
    input's shape (pads adding up to kh - 1 and kw - 1): a group of ``group`` planes is
    reduced in two sweeps along its flat extent, long loops that vectorize however small the
    planes. Rows: ``t[i] = max of x[i + (r - pt) * w]`` over the group, then each plane's
    ``kh - 1`` border rows (read across plane borders by the sweep) redone from the rows
    inside the image. Columns: ``out[i] = max of t[i - pl + j]``, then the ``kw - 1`` border
    columns of every row redone from the taps inside the image. NaN wins as in np.maximum
    (a NaN sum of the rows redoes the row sweep with NaN-aware selects, as in
    :func:`_max_pool_fixed`; the group's NaN count picks the NaN-aware column sweep)."""
    @jit(parallel=True)
    def kernel(x, out, h, w, pt, pl, lo_h, hi_h, group, lowest):
        size = h * w
        planes = out.shape[0] // size
        pb = kh - 1 - pt
        pr = kw - 1 - pl
        top = min(pt, h)  # the border rows and columns: those whose window leaves the image
        bottom = min(pb, h - top)
        left = min(pl, w)
        right = min(pr, w - left)
        for g in prange((planes + group - 1) // group):
            p0 = g * group
            rows = (min(planes, p0 + group) - p0) * h
            n = rows * w
            base = p0 * size
            t = np.empty(n, x.dtype)
            nan = 0
            for i in range(pt * w, n - pb * w):
                a = x[U(base + i - pt * w)]
                b = a
                for r in range(1, kh):
                    v = x[U(base + i + (r - pt) * w)]
                    a = v if v > a else a
                    b += v  # NaN if a NaN was dropped (or inf - inf: a false alarm)
                t[U(i)] = a
                nan += b != b
            if nan:  # the NaN-aware sweep
                for i in range(pt * w, n - pb * w):
                    a = x[U(base + i - pt * w)]
                    for r in range(1, kh):
                        v = x[U(base + i + (r - pt) * w)]
                        a = v if (v > a) | (v != v) else a
                    t[U(i)] = a
            for p in range(rows // h):
                for b in range(top + bottom):
                    y = b if b < top else h - top - bottom + b
                    row = p * size + y * w
                    first = base + p * size + (y - pt + lo_h[y]) * w
                    for c in range(w):
                        t[U(row + c)] = x[U(first + c)]
                    for r in range(1, hi_h[y] - lo_h[y]):
                        for c in range(w):
                            v = x[U(first + r * w + c)]
                            a = t[U(row + c)]
                            t[U(row + c)] = v if (v > a) | (v != v) else a
                    for c in range(w):
                        nan += t[U(row + c)] != t[U(row + c)]
            if nan:
                for i in range(pl, n - pr):
                    a = t[U(i - pl)]
                    for j in range(1, kw):
                        v = t[U(i - pl + j)]
                        a = v if (v > a) | (v != v) else a
                    out[U(base + i)] = a
            else:
                for i in range(pl, n - pr):
                    a = t[U(i - pl)]
                    for j in range(1, kw):
                        v = t[U(i - pl + j)]
                        a = v if v > a else a
                    out[U(base + i)] = a
            for b in range(left + right):
                q = b if b < left else w - left - right + b
                jlo = max(0, pl - q)
                jhi = min(kw, w + pl - q)
                for r in range(rows):
                    at = r * w + q - pl
                    a = t[U(at + jlo)]
                    for j in range(jlo + 1, jhi):
                        v = t[U(at + j)]
                        a = v if (v > a) | (v != v) else a
                    out[U(base + r * w + q)] = a
    return kernel


@cache
def _avg_pool_same(kh, kw):
    """The AveragePool kernel of the geometries :func:`_max_pool_same` takes, laid out the
    same way: the column sweep divides by ``whole`` (a window inside the image: kh * kw
    elements, whether or not padding counts), the border rows and columns are redone with
    their counts (``count``: the plane's, row-major). The sums run in :func:`_avg_pool`'s
    order, so both give the same values."""
    @jit(parallel=True)
    def kernel(x, out, h, w, pt, pl, lo_h, hi_h, group, count, whole):
        size = h * w
        planes = out.shape[0] // size
        pb = kh - 1 - pt
        pr = kw - 1 - pl
        top = min(pt, h)
        bottom = min(pb, h - top)
        left = min(pl, w)
        right = min(pr, w - left)
        for g in prange((planes + group - 1) // group):
            p0 = g * group
            rows = (min(planes, p0 + group) - p0) * h
            n = rows * w
            base = p0 * size
            t = np.empty(n, x.dtype)
            for i in range(pt * w, n - pb * w):
                a = x[U(base + i - pt * w)]
                for r in range(1, kh):
                    a += x[U(base + i + (r - pt) * w)]
                t[U(i)] = a
            for p in range(rows // h):
                for b in range(top + bottom):
                    y = b if b < top else h - top - bottom + b
                    row = p * size + y * w
                    first = base + p * size + (y - pt + lo_h[y]) * w
                    for c in range(w):
                        t[U(row + c)] = x[U(first + c)]
                    for r in range(1, hi_h[y] - lo_h[y]):
                        for c in range(w):
                            t[U(row + c)] += x[U(first + r * w + c)]
            for i in range(pl, n - pr):
                a = t[U(i - pl)]
                for j in range(1, kw):
                    a += t[U(i - pl + j)]
                out[U(base + i)] = a / whole
            for p in range(rows // h):  # the border rows' inner columns
                for b in range(top + bottom):
                    y = b if b < top else h - top - bottom + b
                    row = p * size + y * w
                    for q in range(left, w - right):
                        a = t[U(row + q - pl)]
                        for j in range(1, kw):
                            a += t[U(row + q - pl + j)]
                        out[U(base + row + q)] = a / count[U(y * w + q)]
            for b in range(left + right):
                q = b if b < left else w - left - right + b
                jlo = max(0, pl - q)
                jhi = min(kw, w + pl - q)
                for r in range(rows):
                    at = r * w + q - pl
                    a = t[U(at + jlo)]
                    for j in range(jlo + 1, jhi):
                        a += t[U(at + j)]
                    out[U(base + r * w + q)] = a / count[U((r % h) * w + q)]
    return kernel


@jit(parallel=True, fastmath={"reassoc"})
def _plane_mean(x, out, length):
    """out[p] = mean of the p-th ``length`` elements: an AveragePool whose one window is the
    whole plane, summed in float64 like :func:`_global_avg` (reassociation lets the sum run in
    vector lanes; NaN and infinities propagate as in numpy)."""
    for p in prange(out.shape[0]):
        acc = 0.0
        start = p * length
        for i in range(length):
            acc += x[U(start + i)]
        out[p] = acc / length


def _taps(size, k, s, pb, d, o):
    """Per kernel tap j along the row: the output columns [lo, hi) whose input column
    q*s - pb + j*d lies inside the image."""
    lo = np.zeros(k, np.int64)
    hi = np.zeros(k, np.int64)
    for j in range(k):
        off = j * d - pb
        a = max(0, -(off // s)) if off < 0 else 0  # first q with q*s + off >= 0
        while a < o and a * s + off < 0:
            a += 1
        b = o
        while b > a and (b - 1) * s + off >= size:
            b -= 1
        lo[j], hi[j] = a, max(a, b)
    return lo, hi


def _axis(size, k, s, pb, d, o, pad_end_explicit, include_pad, dtype):
    """Per output index along one axis: the window's first input index, the range of kernel
    taps inside the image, and the averaging count along this axis."""
    start = np.arange(o, dtype=np.int64) * s - pb
    taps = start[:, None] + np.arange(k, dtype=np.int64)[None, :] * d
    inside = (taps >= 0) & (taps < size)
    lo = np.where(inside.any(1), inside.argmax(1), 0).astype(np.int64)
    hi = np.where(inside.any(1), k - inside[:, ::-1].argmax(1), 0).astype(np.int64)
    if include_pad:
        count = ((taps >= -pb) & (taps < size + pad_end_explicit)).sum(1)
    else:
        count = hi - lo
    return start, lo, hi, count.astype(dtype)


@lru_cache(maxsize=256)
def _plan(shape, dtype, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode, include_pad):
    """The window tables of one call signature, made once: on small tensors their numpy set-up
    would cost more than the kernel. Read-only, so threads share them."""
    k = kernel_shape
    s, pb, pe, d, (oh, ow), _extra = _geometry(shape[2:], k, strides, pads, dilations, auto_pad,
                                               ceil_mode)
    h, w = shape[2:]
    hy = _axis(h, k[0], s[0], pb[0], d[0], oh, pe[0], include_pad, dtype)
    wq = _axis(w, k[1], s[1], pb[1], d[1], ow, pe[1], include_pad, dtype)
    taps = _taps(w, k[1], s[1], pb[1], d[1], ow)
    for table in (*hy, *wq, *taps):
        table.flags.writeable = False
    return (h, w, oh, ow), (s[1], pb[1]), d, hy, wq, taps


def _tuple(v):
    return None if v is None else tuple(int(t) for t in v)


def _setup(X, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode, include_pad=0,
           out=None):
    X = np.ascontiguousarray(X)
    plan = _plan(X.shape, X.dtype, _tuple(kernel_shape), _tuple(strides), _tuple(pads),
                 _tuple(dilations), auto_pad, int(ceil_mode), int(include_pad))
    out = _out(out, (*X.shape[:2], plan[0][2], plan[0][3]), X.dtype)
    return X, out, plan


def _out(out, shape, dtype):
    """The output array: a new one, or the planned ``out=`` buffer after checking that it is
    what the out= contract promises (a C-contiguous array of this shape and dtype)."""
    if out is None:
        return np.empty(shape, dtype)
    if out.shape != shape or out.dtype != dtype or not out.flags.carray:
        raise OneModelError(f"out= must be a writeable C-contiguous {dtype} array of shape "
                            f"{list(shape)}, got {out.dtype}{list(out.shape)}"
                            f"{'' if out.flags.c_contiguous else ' (not C-contiguous)'}"
                            f"{'' if out.flags.writeable else ' (read-only)'}")
    return out


def _tiles_2x2(kernel_shape, strides, sw, d, hy, wq) -> bool:
    """Whether a pool is 2x2, stride 2, with its first and last windows inside the image
    (then so are all the others): :func:`_max_pool_2x2`'s and :func:`_avg_pool_2x2`'s case."""
    return _tuple(kernel_shape) == (2, 2) and (sw, d) == (2, (1, 1)) and \
        hy[0][0] == 0 and hy[2][-1] == 2 and wq[0][0] == 0 and wq[2][-1] == 2 and \
        _tuple(strides)[0] == 2


def _fixed(kernel_shape, sw, d):
    """(kh, kw, sw) when a call's geometry has a kernel compiled for it (:data:`FIXED`)."""
    k = _tuple(kernel_shape)
    if d != (1, 1) or len(k) != 2 or (*k, sw) not in FIXED:
        return None
    return (*k, sw)


# per plan (keyed by its id, the plan kept alive so the id stays its own): what the "same"
# kernels need beyond it
_SAME: dict = {}
# elements per group of planes in the "same" kernels: a scratch that stays in L1
_GROUP = 4096


def _same(plan, fixed, strides):
    """(pt, group, counts) for a call the "same" kernels take (stride 1 along both axes, a
    geometry in :data:`FIXED`, the output of the input's shape), None for the others: the
    begin pad along the height, the planes per group, and the plane's averaging counts
    (row-major, in the plan's dtype)."""
    (h, w, oh, ow), (sw, _pl), _d, hy, wq, _taps = plan
    s = _tuple(strides)
    if fixed is None or sw != 1 or (s is not None and s[0] != 1) or (oh, ow) != (h, w):
        return None
    got = _SAME.get(id(plan))
    if got is None or got[0] is not plan:
        counts = np.multiply.outer(hy[3], wq[3]).reshape(-1)
        counts.flags.writeable = False
        if len(_SAME) >= 256:
            _SAME.clear()
        got = _SAME[id(plan)] = (plan, (-int(hy[0][0]), max(1, _GROUP // (h * w)), counts))
    return got[1]


def _max_call(plan, kernel_shape, strides, dtype, compiled_geometry=False):
    """The MaxPool kernel for one planned call and its arguments after (x, out); with
    ``compiled_geometry`` (a plan's call, made once per shape), a fixed kernel has the
    geometry compiled in."""
    (h, w, oh, ow), (sw, pl), d, hy, wq, taps = plan
    lowest = dtype.type(-np.inf)
    if _tiles_2x2(kernel_shape, strides, sw, d, hy, wq):
        return _max_pool_2x2, (h, w, oh, ow)
    fixed = _fixed(kernel_shape, sw, d)
    same = _same(plan, fixed, strides)
    if same:
        pt, group, _counts = same
        return _max_pool_same(*fixed[:2]), (h, w, pt, pl, hy[1], hy[2], group, lowest)
    k = _tuple(kernel_shape)
    if sw == 2 and pool_strided.takes(dtype, k, (1, sw), d):
        return pool_strided.max_pool_kernel(*k), (h, w, oh, ow, pl, hy[0], hy[1], hy[2])
    if fixed:
        wp = max(pl + w, (ow - 1) * sw + fixed[1])
        geometry = (h, w, oh, ow, pl, wp) if compiled_geometry else _ANY_GEOMETRY
        return _max_pool_fixed(*fixed, geometry), (h, w, oh, ow, pl, wp, hy[0], hy[1], hy[2],
                                                   lowest)
    return _max_pool, (h, w, oh, ow, d[0], d[1], sw, pl, hy[0], hy[1], hy[2], taps[0], taps[1],
                       lowest)


def _avg_call(plan, kernel_shape, strides, dtype):
    """The AveragePool kernel for one planned call and its arguments after (x, out)."""
    (h, w, oh, ow), (sw, pl), d, hy, wq, taps = plan
    zero = dtype.type(0)
    if _tiles_2x2(kernel_shape, strides, sw, d, hy, wq):  # every window four elements inside
        return _avg_pool_2x2, (h, w, oh, ow)
    if (oh, ow) == (1, 1) and d == (1, 1) and _tuple(kernel_shape) == (h, w) and \
            hy[0][0] == 0 and wq[0][0] == 0 and hy[3][0] * wq[3][0] == h * w:
        return _plane_mean, (h * w,)  # the window is the plane, every element counted once
    fixed = _fixed(kernel_shape, sw, d)
    same = _same(plan, fixed, strides)
    if same:
        pt, group, counts = same
        return _avg_pool_same(*fixed[:2]), (h, w, pt, pl, hy[1], hy[2], group, counts,
                                            dtype.type(fixed[0] * fixed[1]))
    if fixed:
        wp = max(pl + w, (ow - 1) * sw + fixed[1])
        return _avg_pool_fixed(*fixed), (h, w, oh, ow, pl, wp, hy[0], hy[1], hy[2], hy[3],
                                         wq[3], zero)
    return _avg_pool, (h, w, oh, ow, d[0], d[1], sw, pl, hy[0], hy[1], hy[2], taps[0], taps[1],
                       hy[3], wq[3], zero)


def max_pool(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=(), pads=None,
             storage_order=0, strides=None, out=None):
    """MaxPool; ``out``: the planned output buffer to fill and return (see the hookspec)."""
    sync_threads()
    X, out, plan = _setup(X, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode, out=out)
    if out.size:
        kernel, tail = _max_call(plan, kernel_shape, strides, X.dtype)
        pick(kernel)(X.reshape(-1), out.reshape(-1), *tail)
    return out


def average_pool(X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=(), pads=None, strides=None, out=None):
    """AveragePool; ``out``: the planned output buffer to fill and return (see the hookspec)."""
    sync_threads()
    X, out, plan = _setup(X, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode,
                          count_include_pad, out)
    if out.size:
        kernel, tail = _avg_call(plan, kernel_shape, strides, X.dtype)
        pick(kernel)(X.reshape(-1), out.reshape(-1), *tail)
    return out


# backward ----------------------------------------------------------------------------------

@jit(parallel=True)
def _max_pool_grad_2x2(x4, dy2, dx4, z):
    """Gradient of a 2x2/stride-2 MaxPool whose windows tile the image, on (rows, 2, ow, 2)
    views: every input element is written once (dy at the window's first maximum, 0
    elsewhere; ``z``: a zero of dx's dtype), so dx needs no zeroing. Branch-free selects, so it
    vectorizes. A window holding NaN passes no gradient, as in the reference."""
    rows, _, ow, _ = x4.shape
    for r in prange(rows):
        xa = x4[r, 0]
        xc = x4[r, 1]
        g_row = dy2[r]
        da = dx4[r, 0]
        dc = dx4[r, 1]
        for q in range(ow):
            a = xa[q, 0]
            b = xa[q, 1]
            c = xc[q, 0]
            d = xc[q, 1]
            g = g_row[q]
            # the first maximum in the order a, b, c, d: a tree of strict comparisons
            right_top = b > a
            right_bot = d > c
            lower = (d if right_bot else c) > (b if right_top else a)
            nan = (a != a) | (b != b) | (c != c) | (d != d)
            up = not lower and not nan
            low = lower and not nan
            da[q, 0] = g if up and not right_top else z
            da[q, 1] = g if up and right_top else z
            dc[q, 0] = g if low and not right_bot else z
            dc[q, 1] = g if low and right_bot else z


@jit(parallel=True)
def _max_pool_grad(x, dy, dx, h, w, oh, ow, dh, dw, h0, lo_h, hi_h, w0, lo_w, hi_w):
    """dx[p, argmax of window (y, q)] += dy[p, y, q], the argmax recomputed per window in one
    pass over its taps inside the image (row-major, the first maximum wins). As in the
    reference, a window whose first tap is padding starts from that tap's -inf, and a window
    holding NaN passes no gradient."""
    planes = dy.shape[0] // (oh * ow)
    for p in prange(planes):
        src = p * h * w
        base = p * oh * ow
        for t in range(h * w):
            dx[U(src + t)] = 0
        for y in range(oh):
            for q in range(ow):
                ilo, ihi, jlo, jhi = lo_h[y], hi_h[y], lo_w[q], hi_w[q]
                if ilo >= ihi or jlo >= jhi:
                    continue  # no tap inside the image
                first = src + (h0[y] + ilo * dh) * w + w0[q] + jlo * dw
                if ilo > 0 or jlo > 0:  # tap (0, 0) is padding: it holds the max at -inf
                    best = -np.inf
                    idx = -1
                else:
                    best = x[U(first)]
                    idx = first
                nan = False
                for i in range(ilo, ihi):  # branch-free selects: the first strict maximum
                    row = src + (h0[y] + i * dh) * w + w0[q]
                    for j in range(jlo, jhi):
                        at = row + j * dw
                        v = x[U(at)]
                        nan |= v != v
                        gt = v > best
                        best = v if gt else best
                        idx = at if gt else idx
                if idx >= 0 and not nan:
                    dx[U(idx)] += dy[U(base + y * ow + q)]


@jit(parallel=True)
def _avg_pool_grad(dy, dx, h, w, oh, ow, dh, dw, sw, pl, h0, lo_h, hi_h, lo_q, hi_q, n_h, n_w,
                   zero):
    """The adjoint of :func:`_avg_pool`, separable the same way: per output row, its shares
    dy / count scattered along one input-width row by the kw strided taps, then that row added
    to each input row of the window."""
    planes = dy.shape[0] // (oh * ow)
    kw = lo_q.shape[0]
    for p in prange(planes):
        src = p * oh * ow
        dst = p * h * w
        share = np.empty(ow, dy.dtype)
        col = np.empty(w, dy.dtype)
        for t in range(h * w):
            dx[U(dst + t)] = zero
        for y in range(oh):
            for q in range(ow):
                share[U(q)] = dy[U(src + y * ow + q)] / (n_h[y] * n_w[q])
            for c in range(w):
                col[U(c)] = zero
            for j in range(kw):
                tap = j * dw - pl
                for q in range(lo_q[j], hi_q[j]):
                    col[U(tap + q * sw)] += share[U(q)]
            for i in range(lo_h[y], hi_h[y]):
                row = dst + (h0[y] + i * dh) * w
                for c in range(w):
                    dx[U(row + c)] += col[U(c)]


def _grad_setup(X, dY, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode,
                include_pad=0):
    sync_threads()
    X = np.ascontiguousarray(X)
    dY = np.ascontiguousarray(dY)
    plan = _plan(X.shape, X.dtype, _tuple(kernel_shape), _tuple(strides), _tuple(pads),
                 _tuple(dilations), auto_pad, int(ceil_mode), int(include_pad))
    return X, dY, np.empty(X.shape, dY.dtype), plan


def max_pool_grad(X, dY, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=(),
                  pads=None, storage_order=0, strides=None):
    """Gradient of 2-D MaxPool (see the reference ``MaxPoolGrad``): the argmax recomputed per
    window in one pass and dY scattered onto it, instead of a pass over the whole output per
    kernel position."""
    X, dY, dx, ((h, w, oh, ow), _row, d, hy, wq, _taps) = _grad_setup(
        X, dY, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode)
    if dx.size == 0:
        return dx
    if _tuple(kernel_shape) == (2, 2) and _tuple(strides) == (2, 2) and d == (1, 1) and \
            h == 2 * oh and w == 2 * ow and hy[0][0] == 0 and wq[0][0] == 0:
        rows = X.shape[0] * X.shape[1] * oh
        pick(_max_pool_grad_2x2)(X.reshape(rows, 2, ow, 2), dY.reshape(rows, ow),
                                  dx.reshape(rows, 2, ow, 2), dY.dtype.type(0))
    elif dY.size == 0:
        dx[...] = 0
    else:
        pick(_max_pool_grad)(X.reshape(-1), dY.reshape(-1), dx.reshape(-1), h, w, oh, ow, d[0],
                              d[1], hy[0], hy[1], hy[2], wq[0], wq[1], wq[2])
    return dx


def average_pool_grad(X, dY, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0,
                      dilations=None, kernel_shape=(), pads=None, strides=None):
    """Gradient of 2-D AveragePool: each window's dY / count spread over what it averaged."""
    X, dY, dx, ((h, w, oh, ow), (sw, pl), d, hy, wq, taps) = _grad_setup(
        X, dY, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode, count_include_pad)
    if dx.size == 0:
        return dx
    if dY.size == 0:
        dx[...] = 0
        return dx
    pick(_avg_pool_grad)(dY.reshape(-1), dx.reshape(-1), h, w, oh, ow, d[0], d[1], sw, pl, hy[0],
                          hy[1], hy[2], taps[0], taps[1], hy[3], wq[3], dY.dtype.type(0))
    return dx


# global pooling ----------------------------------------------------------------------------

@jit(parallel=True, fastmath={"reassoc"})
def _global_avg(x, out):
    """out[p] = mean of plane x[p], summed in float64: reassociation lets the sum run in
    vector lanes (it only reorders additions; NaN and infinities propagate as in numpy)."""
    planes, length = x.shape
    if length == 1:  # 1x1 planes: each mean is the value itself, copied in one vector loop
        for p in prange(planes):  # (planned, 2x1280x1x1: 4.91 -> 1.55 us; planned_calls.py)
            out[p] = x[p, 0]
        return
    for p in prange(planes):
        row = x[p]
        acc = 0.0
        for q in range(length):
            acc += row[q]
        out[p] = acc / length


def global_average_pool(X, *, out=None):
    """GlobalAveragePool (N, C, spatial...) -> (N, C, 1, ...): one pass per plane. ``out``: the
    planned output buffer to fill and return (see the hookspec)."""
    sync_threads()
    X = np.ascontiguousarray(X)
    n, c = X.shape[:2]
    length = int(np.prod(X.shape[2:], dtype=np.int64))
    out = _out(out, (n, c) + (1,) * (X.ndim - 2), X.dtype)
    if out.size:
        pick(_global_avg)(X.reshape(n * c, length), out.reshape(n * c))
    return out


# plan-time specialization -------------------------------------------------------------------

def _planned(site: CallSite, include_pad=0):
    """What a pooling call site's calls share: (shape, dtype, output shape, flat size, the
    plan's tables), or None where the generic call must run (other dtypes or ranks, refused
    attributes, empty outputs)."""
    shape, dtype = site.shapes[0], site.dtypes[0]
    if shape is None or len(shape) != 4 or dtype not in (np.float32, np.float64):
        return None
    a = site.attrs
    try:
        plan = _plan(shape, dtype, _tuple(a.get("kernel_shape", ())), _tuple(a.get("strides")),
                     _tuple(a.get("pads")), _tuple(a.get("dilations")),
                     a.get("auto_pad", "NOTSET"), int(a.get("ceil_mode", 0)), int(include_pad))
    except Exception:  # attributes the generic call refuses: it names the problem
        return None
    oshape = (*shape[:2], plan[0][2], plan[0][3])
    if 0 in oshape or 0 in shape:
        return None
    return shape, np.dtype(dtype), oshape, plan


def _fits(out, oshape, dtype) -> bool:
    """Whether ``out`` is what the out= contract promises (else the generic call says so)."""
    return out.shape == oshape and out.dtype == dtype and out.flags.carray


def _pool_at(shape, dtype, oshape, kernel, x_flat, out_flat, tail, generic):
    """The specialized call of a pooling kernel: an input of the planned shape and dtype (and an
    ``out=`` as the contract promises) goes to ``kernel(X.reshape(x_flat),
    out.reshape(out_flat), *tail)``; anything else to the generic call."""
    bound = [None]  # the serial kernel's machine code (_jit.entry), bound at the first call

    def pool_at(X, out=None):
        if X.shape != shape or X.dtype != dtype or (out is not None
                                                    and not _fits(out, oshape, dtype)):
            return generic(X, out=out)
        sync_threads()
        if not X.flags.c_contiguous:
            X = np.ascontiguousarray(X)
        if out is None:
            out = np.empty(oshape, dtype)
        x, y = X.reshape(x_flat), out.reshape(out_flat)
        if _jit._parallel:
            kernel(x, y, *tail)
        else:
            (bound[0] or _jit.bind(bound, kernel.serial, (x, y, *tail)))(x, y, *tail)
        return out

    def direct(known, out):  # the serial kernel, where the plan proves what the call checks
        sync_threads()
        if _jit._parallel or not (planned(known[0], shape, dtype) and
                                  planned(out, oshape, dtype)):
            return None
        return _jit.direct(kernel.serial, (Input(0, _flat(x_flat)), Output(_flat(out_flat)),
                                           *tail), known, out)
    pool_at.direct = direct
    return pool_at


def _flat(shape) -> tuple[int, ...]:
    """A reshape's target as a tuple (-1 or a size: one dimension)."""
    return (shape,) if isinstance(shape, int) else tuple(shape)


def _windows_at(site: CallSite, choose, include_pad=0):
    """A windowed pool planned for its shapes: the window tables (and counts) and the kernel
    that ``choose`` (:func:`_max_call` or :func:`_avg_call`) picks for them, made once."""
    site_plan = _planned(site, include_pad)
    if site_plan is None:
        return None
    shape, dtype, oshape, plan = site_plan
    try:
        kernel, tail = choose(plan, site.attrs.get("kernel_shape", ()), site.attrs.get("strides"),
                              dtype)
    except Exception:  # attributes the generic call refuses: it names the problem
        return None
    return _pool_at(shape, dtype, oshape, kernel, -1, -1, tail, site.generic)


@specializer(max_pool)
def _max_pool_at(site: CallSite):
    """MaxPool planned for its shapes: on one thread, float32 blocks of eight channels in
    vector lanes where :func:`.pool_lanes.fits` takes them (unless :mod:`.pool_strided`
    does); otherwise :func:`_windows_at`, a fixed window's geometry compiled into its
    kernel, or the sixteen-lane rows of :mod:`.pool_strided`."""
    return _max_lanes_at(site) or _windows_at(site, partial(_max_call, compiled_geometry=True))


def _max_lanes_at(site: CallSite):
    """The planned call of :func:`.pool_lanes.max_lanes`, or None where it does not fit."""
    site_plan = _planned(site)
    if site_plan is None or site_plan[1] != np.float32 or _jit._parallel:
        return None
    shape, dtype, oshape, _plan = site_plan
    a = site.attrs
    k = _tuple(a.get("kernel_shape", ()))
    try:
        s, pb, _pe, d, out_hw, _extra = _geometry(
            shape[2:], k, _tuple(a.get("strides")), _tuple(a.get("pads")),
            _tuple(a.get("dilations")), a.get("auto_pad", "NOTSET"), int(a.get("ceil_mode", 0)))
    except Exception:  # attributes the generic call refuses: it names the problem
        return None
    if k == (2, 2) and tuple(s) == (2, 2):
        return None  # the NCHW 2x2 kernel's tiles are as fast (2x64x16x16: 1.04x)
    if s[1] == 2 and shape[3] >= pool_strided.MIN_WIDTH_OVER_LANES and \
            pool_strided.takes(dtype, k, s, d):
        return None  # the sixteen-lane rows need no copies into and out of the lanes
    from . import pool_lanes

    geo = pool_lanes.geometry(shape, tuple(out_hw), tuple(s), tuple(pb), tuple(d), k)
    if geo is None:
        return None
    tail = (geo.taps, geo.pix, geo.into, geo.hp, geo.wq)
    generic = site.generic
    bound = [None]  # the kernel's machine code (_jit.entry), bound at the first call

    def max_lanes_at(X, out=None):
        if X.shape != shape or X.dtype != dtype or (out is not None
                                                    and not _fits(out, oshape, dtype)):
            return generic(X, out=out)  # (a read-only out is not a carray: refused there)
        if not X.flags.c_contiguous:
            X = np.ascontiguousarray(X)
        if out is None:
            out = np.empty(oshape, dtype)
        (bound[0] or _jit.bind(bound, pool_lanes.max_lanes, (X, *tail, out)))(X, *tail, out)
        return out

    def direct(known, out):  # the kernel, where the plan proves what the call checks
        if not (planned(known[0], shape, dtype) and planned(out, oshape, dtype)):
            return None
        return _jit.direct(pool_lanes.max_lanes, (Input(0), *tail, Output()), known, out)
    max_lanes_at.direct = direct
    return max_lanes_at


@specializer(average_pool)
def _average_pool_at(site: CallSite):
    """AveragePool planned for its shapes, its counts included (:func:`_windows_at`)."""
    return _windows_at(site, _avg_call, site.attrs.get("count_include_pad", 0))


@specializer(global_average_pool)
def _global_average_pool_at(site: CallSite):
    """GlobalAveragePool planned for its shape: the planes' geometry worked out once."""
    shape, dtype = site.shapes[0], site.dtypes[0]
    if shape is None or len(shape) < 3 or dtype not in (np.float32, np.float64) or 0 in shape:
        return None
    dtype = np.dtype(dtype)
    n, c = shape[:2]
    planes = (n * c, math.prod(shape[2:]))
    oshape = (n, c) + (1,) * (len(shape) - 2)
    return _pool_at(shape, dtype, oshape, _global_avg, planes, planes[0], (), site.generic)
