"""Normalizations (float32/float64): batch normalization with running statistics, layer and
RMS normalization over the last axis (and layer normalization of a residual sum, the fused
SkipLayerNormalization), and LRN across channels. One pass per row or plane with
float64 accumulators, where numpy makes a temporary per arithmetic step."""

from __future__ import annotations

import math

import numpy as np

from numba import prange
from onemodel.tensors.errors import ShapeError
from onemodel.tensors.ops.specialize import (
    CallSite,
    Input,
    Output,
    constant,
    constant_at,
    contiguous,
    planned,
    specializer,
)

from . import _jit
from ._jit import jit, pick, sync_threads
from .support import skip_norm

U = np.uint64  # unsigned offsets: indexing without negative-index checks, which vectorizes


@jit(parallel=True)
def _affine_planes(x, mul, add, out):
    """out[n, c, :] = x[n, c, :] * mul[c] + add[c]."""
    n_img, ch, length = x.shape
    for t in prange(n_img * ch):
        c = t % ch
        a = mul[c]
        b = add[c]
        src = x[t // ch, c]
        dst = out[t // ch, c]
        for q in range(length):
            dst[q] = src[q] * a + b


@jit(parallel=True, fastmath={"reassoc"})
def _layer_norm(x, scale, bias, has_bias, eps, rms, out, stats, mean_out, inv_out):
    """Rows of ``x`` normalized into ``out``; with ``stats``, each row's mean and inverse
    standard deviation stored in ``mean_out`` and ``inv_out`` (of the stash dtype). The sums
    may be reassociated so that they run in vector lanes (float64 either way): a sum in order
    is one dependent add per element, 90 of the 100 ns a row of 32 took. ``x`` and ``out``
    come C-contiguous, of any rank: the rows are those of ``scale``'s length, viewed here
    (two reshapes in Python were 0.35 of the 2.8 us a (2, 16, 32) LayerNorm took)."""
    width = scale.shape[0]
    rows = x.size // width if width > 0 else 0
    xr = x.reshape((rows, width))
    outr = out.reshape((rows, width))
    for r in prange(rows):
        row = xr[r]
        mean = 0.0
        if not rms:
            for q in range(width):
                mean += row[q]
            mean /= width
        var = 0.0
        for q in range(width):
            d = row[q] - mean
            var += d * d
        inv = 1.0 / math.sqrt(var / width + eps)
        dst = outr[r]
        for q in range(width):
            v = (row[q] - mean) * inv * scale[q]
            if has_bias:
                v += bias[q]
            dst[q] = v
        if stats:
            mean_out[r] = mean
            inv_out[r] = inv


@jit(parallel=True, fastmath={"reassoc"})
def _layer_norm_channels(x, scale, bias, has_bias, eps, out, channels_last):
    """LayerNormalization over the channels of channels-first data: ``x`` (N, C, P)
    C-contiguous, each of the N * P pixels' C values normalized as a row, into ``out``
    C-contiguous: (N, P, C) with ``channels_last``, else (N, C, P) (ChannelLayerNormalization).
    The channels-last output is what a ConvNeXt block's LayerNorm over a permuted (N, H, W, C)
    view of an (N, C, H, W) activation computes: the view's rows lie P apart, so the row
    kernel first copied the whole view (2x16x16x96: 82 us a call, 46 here). The sums run
    along the pixels (unit stride, in vector lanes; float64, as the row kernel's) for every
    channel, the mean first, then the squared deviations from it; the output is written a
    channel at a time (channels-last: a block of eight pixels made first, then written pixel
    by pixel, measured slower: 63 us; channels-first: whole planes, unit stride in and out).
    ``x`` and ``out`` may come with their spatial axes unflattened, viewed here: two reshapes
    in Python cost 0.4 us a call."""
    n_img, c_n = x.shape[0], x.shape[1]
    p_n = x.size // (n_img * c_n) if n_img * c_n else 0
    x = x.reshape((n_img, c_n, p_n))
    out = out.reshape((n_img, p_n, c_n)) if channels_last else out.reshape((n_img, c_n, p_n))
    sums = np.zeros((n_img, 2, p_n), np.float64)  # one allocation: each is 0.1-0.2 us
    for i in prange(n_img):
        mean = sums[i, 0]
        inv = sums[i, 1]
        for c in range(c_n):
            for p in range(p_n):
                mean[p] += x[i, c, p]
        for p in range(p_n):
            mean[p] /= c_n
        for c in range(c_n):
            for p in range(p_n):
                d = x[i, c, p] - mean[p]
                inv[p] += d * d
        for p in range(p_n):
            inv[p] = 1.0 / math.sqrt(inv[p] / c_n + eps)
        for c in range(c_n):
            sc = scale[c]
            bc = bias[c] if has_bias else 0.0
            if channels_last:
                for p in range(p_n):
                    out[i, p, c] = (x[i, c, p] - mean[p]) * inv[p] * sc + bc
            else:
                for p in range(p_n):
                    out[i, c, p] = (x[i, c, p] - mean[p]) * inv[p] * sc + bc


@jit(parallel=True, fastmath={"reassoc"})
def _skip_layer_norm(x, skip, bias, has_bias, scale, beta, has_beta, eps, out, total, keep):
    """Rows of ``total = (x + bias) + skip`` (in the dtype, in that order, as the Adds it
    replaces) normalized into ``out``, the sums as :func:`_layer_norm` takes them. ``skip``'s
    rows repeat over ``x``'s (one row, or a trailing block such as positions). Without
    ``keep`` the sums go to ``out``'s row, normalized there in place (``total`` unused): one
    view read and written, where two views of one row would send the loop to its scalar
    version (1.7 against 1.2 us on (2, 5, 32)). All C-contiguous, ``x``, ``out`` and ``total``
    of the same shape."""
    width = scale.shape[0]
    rows = x.size // width if width > 0 else 0
    period = skip.size // width if width > 0 else 1
    xr = x.reshape((rows, width))
    sr = skip.reshape((period, width))
    outr = out.reshape((rows, width))
    tr = total.reshape((rows, width))
    for r in prange(rows):
        row = xr[r]
        srow = sr[r % period]
        dst = outr[r]
        trow = tr[r] if keep else dst
        mean = 0.0
        for q in range(width):
            v = row[q] + bias[q] if has_bias else row[q]
            v = v + srow[q]
            trow[q] = v
            mean += v
        mean /= width
        var = 0.0
        for q in range(width):
            d = trow[q] - mean
            var += d * d
        inv = 1.0 / math.sqrt(var / width + eps)
        if keep:
            for q in range(width):
                v = (trow[q] - mean) * inv * scale[q]
                if has_beta:
                    v += beta[q]
                dst[q] = v
        else:
            for q in range(width):
                v = (dst[q] - mean) * inv * scale[q]
                if has_beta:
                    v += beta[q]
                dst[q] = v

@jit(parallel=True)
def _lrn(x, alpha, beta, bias, size, out):
    """Squares summed over the channel window in float64; ``beta`` 0.75 (every zoo network's)
    as two square roots instead of a power."""
    n_img, ch, length = x.shape
    before = (size - 1) // 2
    after = size // 2
    three_quarters = beta == 0.75
    scale = alpha / size
    for t in prange(n_img * ch):
        n = t // ch
        c = t % ch
        lo = max(0, c - before)
        hi = min(ch, c + after + 1)
        acc = np.zeros(length)
        for k in range(lo, hi):
            src = x[n, k]
            for q in range(length):
                v = np.float64(src[q])
                acc[q] += v * v
        src = x[n, c]
        dst = out[n, c]
        if three_quarters:
            for q in range(length):
                d = bias + scale * acc[q]
                r = math.sqrt(d)
                dst[q] = src[q] / (r * math.sqrt(r))
        else:
            for q in range(length):
                dst[q] = src[q] / (bias + scale * acc[q]) ** beta


@jit(parallel=True, fastmath={"reassoc"})
def _group_norm(x, scale, bias, groups, eps, out):
    """Each instance's groups of ``C // groups`` channels (``x`` (N, C, L), C-contiguous)
    normalized by their mean and variance (float64 sums, reassociated into vector lanes), then
    each channel's ``scale`` and ``bias``: ``(x - mean) * inv * scale + bias`` in x's dtype, the
    reference's order of operations. One task per (instance, group)."""
    n_img, ch, length = x.shape
    cg = ch // groups
    count = cg * length
    xf = x.reshape(x.size)
    of = out.reshape(out.size)
    for t in prange(n_img * groups):
        base = t * count  # a group's channels are adjacent: one contiguous run
        total = 0.0
        for q in range(count):
            total += xf[U(base + q)]
        mean64 = total / count
        sq = 0.0
        for q in range(count):
            d = xf[U(base + q)] - mean64
            sq += d * d
        stats = np.empty(2, x.dtype)  # the mean and 1/std rounded to x's dtype, as the
        stats[0] = mean64  # reference's (the stats of float32 arrays are float32)
        stats[1] = 1.0 / math.sqrt(sq / count + eps)
        mean, inv = stats[0], stats[1]
        first = (t % groups) * cg
        for k in range(cg):
            a = scale[first + k]
            b = bias[first + k]
            row = base + k * length
            for q in range(length):
                of[U(row + q)] = (xf[U(row + q)] - mean) * inv * a + b


def _per_channel(X, scale, bias) -> bool:
    """Whether ``scale`` and ``bias`` hold one value per channel of ``X``: the kernel reads
    them unchecked, so any other shape goes to the reference (which says what is wrong)."""
    return X.ndim >= 2 and np.shape(scale) == (X.shape[1],) and np.shape(bias) == (X.shape[1],)


def _grouped(X, scale, bias, groups, epsilon):
    sync_threads()
    X = np.ascontiguousarray(X)
    out = np.empty_like(X)
    pick(_group_norm)(_planes(X), np.ascontiguousarray(scale, X.dtype),
                      np.ascontiguousarray(bias, X.dtype), int(groups), float(epsilon),
                      _planes(out))
    return out


def instance_normalization(input, scale, B, *, epsilon=1e-5):
    """InstanceNormalization: one group per channel."""
    if input.size == 0 or not _per_channel(input, scale, B):
        from onemodel.tensors.ops import OPS

        return OPS["InstanceNormalization"].kernel(input, scale, B, epsilon=epsilon)
    return _grouped(input, scale, B, input.shape[1], epsilon)


def group_normalization(X, scale, bias, *, epsilon=1e-5, num_groups=None, stash_type=1):
    """GroupNormalization (opset 21: per-channel scale and bias). A group count below one or
    one that does not divide the channels, or an empty tensor, goes to the reference (which
    says what is wrong)."""
    if X.size == 0 or not isinstance(num_groups, int) or num_groups < 1 or \
            X.shape[1] % num_groups or not _per_channel(X, scale, bias):
        from onemodel.tensors.ops import OPS

        return OPS["GroupNormalization"].kernel(X, scale, bias, epsilon=epsilon,
                                                num_groups=num_groups, stash_type=stash_type)
    return _grouped(X, scale, bias, num_groups, epsilon)


def batch_normalization(X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9,
                        training_mode=0, out=None):
    sync_threads()
    if not X.flags.c_contiguous:
        X = np.ascontiguousarray(X)
    mul, add = _folded(scale, B, input_mean, input_var, epsilon, X.dtype)
    if out is None:
        out = np.empty_like(X)
    pick(_affine_planes)(_planes(X), mul, add, _planes(out))
    return out


def _folded(scale, B, input_mean, input_var, epsilon, dtype):
    """The statistics and affine parameters folded into one multiply and one add per channel."""
    inv = 1.0 / np.sqrt(input_var.astype(np.float64) + epsilon)
    mul = (scale * inv.astype(dtype)).astype(dtype)
    add = (B - input_mean * mul).astype(dtype)
    return mul, add


_NO_STATS = np.empty(0)  # the statistics arrays of a call that keeps none (never written)


def _planes(X):
    """(N, C, everything else) without -1, so empty batches reshape too."""
    return X.reshape(X.shape[0], X.shape[1], math.prod(X.shape[2:]))


def _param(P, shape, width, dtype):
    """A Scale or B broadcast over the normalized axes, as a contiguous row of ``width``:
    the array itself when it already is one (the usual 1-D weight), no copy."""
    if P.shape == (width,) and P.dtype == dtype and P.flags.c_contiguous:
        return P
    return np.ascontiguousarray(np.broadcast_to(P, shape), dtype).reshape(width)


# (shape, axis, stash dtype) -> (rows, width, normalized axes' shape, statistics' shape)
_ln_geometry: dict[tuple, tuple] = {}


def _geometry(key: tuple) -> tuple:
    shape, axis, _ = key
    nd = len(shape)
    a = axis + nd if axis < 0 else axis
    geometry = (math.prod(shape[:a]), math.prod(shape[a:]), shape[a:],
                shape[:a] + (1,) * (nd - a))
    if len(_ln_geometry) >= 4096:
        _ln_geometry.clear()
    _ln_geometry[key] = geometry
    return geometry


def layer_normalization(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    sync_threads()
    dtype = X.dtype
    stash = np.float32 if stash_type == 1 else dtype
    key = (X.shape, axis, stash)
    rows, width, tail, stats = _ln_geometry.get(key) or _geometry(key)
    if not X.flags.c_contiguous:
        X = np.ascontiguousarray(X)
    scale = _param(Scale, tail, width, dtype)
    bias = scale if B is None else _param(B, tail, width, dtype)
    out = np.empty(X.shape, dtype)
    mean = np.empty(stats, stash)
    inv = np.empty(stats, stash)
    (_layer_norm if _jit._parallel else _layer_norm.serial)(
        X.reshape(rows, width), scale, bias, B is not None, float(epsilon), False,
        out.reshape(rows, width), True, mean.reshape(rows), inv.reshape(rows))
    return out, mean, inv


def channel_layer_normalization(X, Scale, B=None, *, epsilon=1e-5, out=None):
    """ChannelLayerNormalization (see the reference op) by :func:`_layer_norm_channels`; ``out``:
    the planned buffer (C-contiguous, X's shape and dtype)."""
    sync_threads()
    dtype = X.dtype
    if not X.flags.c_contiguous:
        X = np.ascontiguousarray(X)
    c = X.shape[1]
    scale = _param(Scale, (c,), c, dtype)
    bias = scale if B is None else _param(B, (c,), c, dtype)
    if out is not None and not (out.shape == X.shape and out.dtype == dtype and
                                out.flags.carray):
        if out.shape != X.shape:
            raise ShapeError(f"ChannelLayerNormalization: out= has shape {out.shape}, the "
                             f"result {X.shape}; pass an array of the input's shape")
        out[...] = channel_layer_normalization(X, Scale, B, epsilon=epsilon)
        return out
    if out is None:
        out = np.empty(X.shape, dtype)
    if X.size:
        pick(_layer_norm_channels)(X, scale, bias, B is not None, float(epsilon), out,
                                    False)
    return out


def rms_normalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1, out=None):
    sync_threads()
    shape = X.shape
    nd = len(shape)
    a = axis + nd if axis < 0 else axis
    width = math.prod(shape[a:])
    dtype = X.dtype
    if not X.flags.c_contiguous:
        X = np.ascontiguousarray(X)
    sc = _param(scale, shape[a:], width, dtype)
    if out is not None and not (out.shape == shape and out.dtype == dtype and
                                out.flags.c_contiguous):
        if out.shape != shape:
            raise ShapeError(f"RMSNormalization: out= has shape {out.shape}, the result "
                             f"{shape}; pass an array of the input's shape")
        out[...] = rms_normalization(X, scale, axis=axis, epsilon=epsilon)
        return out
    if out is None:
        out = np.empty(shape, dtype)
    pick(_layer_norm)(X, sc, sc, False, float(epsilon), True, out, False, _NO_STATS, _NO_STATS)
    return out


def skip_layer_normalization(X, Skip, Scale, B=None, Bias=None, *, epsilon=1e-5):
    """SkipLayerNormalization of float32/float64 (see :func:`onemodel.numba.support.skip_norm`):
    the normalized rows and the sum, both new arrays. Other calls go to the reference kernel:
    the kernel repeats Skip's rows, which only a trailing part of X's shape may do."""
    if not skip_norm(X, Skip, Scale, B, Bias):
        from onemodel.tensors.ops import OPS

        return OPS["SkipLayerNormalization"].kernel(X, Skip, Scale, B, Bias, epsilon=epsilon)
    sync_threads()
    dtype = X.dtype
    x = np.ascontiguousarray(X)
    skip = np.ascontiguousarray(Skip)
    scale = np.ascontiguousarray(Scale)
    beta = scale if B is None else np.ascontiguousarray(B)
    bias = scale if Bias is None else np.ascontiguousarray(Bias)
    out = np.empty(X.shape, dtype)
    total = np.empty(X.shape, dtype)
    pick(_skip_layer_norm)(x, skip, bias, Bias is not None, scale, beta, B is not None,
                           float(epsilon), out, total, True)
    return out, total


def lrn(X, *, alpha=1e-4, beta=0.75, bias=1.0, size=1):
    sync_threads()
    X = np.ascontiguousarray(X)
    out = np.empty_like(X)
    pick(_lrn)(_planes(X), float(alpha), float(beta), float(bias), int(size), _planes(out))
    return out


# plan-time specialization -------------------------------------------------------------------

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_UNSET = object()  # no constant input planned: no array is this


def _const(site: CallSite, i: int):
    """Input ``i``'s value when the plan knows it (a constant), else a marker no array is."""
    v = site.values[i] if i < len(site.values) else None
    return _UNSET if v is None else v


def _rows(shape, axis):
    """(rows, width, the normalized axes' shape, the statistics' shape) of normalizing
    ``shape`` over ``axis`` and the axes after it."""
    nd = len(shape)
    a = axis + nd if axis < 0 else axis
    return math.prod(shape[:a]), math.prod(shape[a:]), shape[a:], shape[:a] + (1,) * (nd - a)


@specializer(batch_normalization)
def _batch_normalization_at(site: CallSite):
    """BatchNormalization (inference) planned for its shapes: with constant statistics and
    parameters (an exported network's), their fold into one multiply and add made once."""
    shape, dtype = site.shapes[0], site.dtypes[0]
    if shape is None or len(shape) < 2 or dtype not in _FLOATS or 0 in shape or \
            len(site.shapes) != 5 or any(s is None for s in site.shapes) or \
            site.attrs.get("training_mode", 0):
        return None
    eps = site.attrs.get("epsilon", 1e-5)
    params = tuple(_const(site, i) for i in range(1, 5))
    folded = None
    if all(p is not _UNSET for p in params):
        try:
            folded = _folded(*params, eps, dtype)
        except Exception:
            return None
    pshapes = site.shapes[1:]
    planes = (shape[0], shape[1], math.prod(shape[2:]))
    generic = site.generic

    bound = [None]  # the serial kernel's machine code (_jit.entry), bound at the first call

    def batch_normalization_at(X, scale, B, input_mean, input_var, out=None):
        if X.shape != shape or X.dtype != dtype or (out is not None and (
                out.shape != shape or out.dtype != dtype or not out.flags.carray)):
            return generic(X, scale, B, input_mean, input_var, out=out)
        if folded is not None and scale is params[0] and B is params[1] and \
                input_mean is params[2] and input_var is params[3]:
            mul, add = folded
        elif (scale.shape, B.shape, input_mean.shape, input_var.shape) != pshapes:
            return generic(X, scale, B, input_mean, input_var, out=out)
        else:
            mul, add = _folded(scale, B, input_mean, input_var, eps, dtype)
        sync_threads()
        if not X.flags.c_contiguous:
            X = np.ascontiguousarray(X)
        if out is None:
            out = np.empty(shape, dtype)
        x, y = X.reshape(planes), out.reshape(planes)
        if _jit._parallel or folded is None or mul is not folded[0]:
            (_affine_planes if _jit._parallel else _affine_planes.serial)(x, mul, add, y)
        else:  # the plan's folded constants: the types are fixed
            (bound[0] or _jit.bind(bound, _affine_planes.serial, (x, mul, add, y)))(
                x, mul, add, y)
        return out
    return batch_normalization_at


def _norm_param(site: CallSite, i: int, tail, width, dtype):
    """Scale or B of a layer (RMS) normalization: (its planned shape, the constant array or the
    marker, that constant as the kernel's contiguous row). Shape None: the input is omitted."""
    shape = site.shapes[i] if i < len(site.shapes) else None
    const = _const(site, i)
    if shape is None or const is _UNSET:
        return shape, _UNSET, None
    row = _param(const, tail, width, dtype)
    if row is not const:  # a copy: made per call, so an update of the constant in place shows
        return shape, _UNSET, None
    return shape, const, row


def _rows_site(site: CallSite):
    """What the row normalizations' call sites share: (shape, dtype, epsilon, :func:`_rows`),
    or None where the generic call must run (other dtypes, empty shapes, no scale, an axis out
    of range)."""
    shape, dtype = site.shapes[0], site.dtypes[0]
    if shape is None or not shape or 0 in shape or dtype not in _FLOATS or \
            len(site.shapes) < 2 or site.shapes[1] is None:
        return None
    axis = site.attrs.get("axis", -1)
    if not -len(shape) <= axis < len(shape):
        return None
    return shape, dtype, float(site.attrs.get("epsilon", 1e-5)), _rows(shape, axis)


@specializer(layer_normalization)
def _layer_normalization_at(site: CallSite):
    """LayerNormalization planned for its shapes: the rows' geometry, and the constant Scale
    and B as contiguous rows, made once. The mean and inverse standard deviation are computed
    and returned only when the node names those outputs (an inference graph's rarely does)."""
    rows_site = _rows_site(site)
    if rows_site is None:
        return None
    shape, dtype, eps, (rows, width, tail, stats) = rows_site
    stash = np.dtype(np.float32 if site.attrs.get("stash_type", 1) == 1 else dtype)
    try:
        s_shape, s_const, s_row = _norm_param(site, 1, tail, width, dtype)
        b_shape, b_const, b_row = _norm_param(site, 2, tail, width, dtype)
    except Exception:  # a Scale or B that does not broadcast: the generic call says so
        return None
    has_bias = b_shape is not None
    flat = (rows, width)
    generic = site.generic
    keep_stats = any(s is not None for s in site.out_shapes[1:])
    bound = [None]  # the serial kernel's machine code (_jit.entry), bound at the first call
    # normalized over the last axis alone, of rank 3 or more: a permuted view of
    # channels-first data (ConvNeXt's) goes to _layer_norm_channels without a copy
    channels = None
    bound_channels = [None]
    if len(tail) == 1 and len(shape) >= 3:
        nd = len(shape)
        channels = (0, nd - 1, *range(1, nd - 1))

    def layer_normalization_at(X, Scale, B=None):
        if X.shape != shape or X.dtype != dtype or (B is None) == has_bias:
            return generic(X, Scale, B)
        if Scale is s_const:
            scale = s_row
        elif Scale.shape != s_shape:
            return generic(X, Scale, B)
        else:
            scale = _param(Scale, tail, width, dtype)
        if B is None:
            bias = scale
        elif B is b_const:
            bias = b_row
        elif B.shape != b_shape:
            return generic(X, Scale, B)
        else:
            bias = _param(B, tail, width, dtype)
        sync_threads()
        out = np.empty(shape, dtype)
        if not X.flags.c_contiguous:
            if channels and not keep_stats:
                xt = X.transpose(channels)  # (N, C, spatial...) when X is a permuted view
                if xt.flags.c_contiguous:
                    args = (xt, scale, bias, has_bias, eps, out, True)
                    if _jit._parallel or scale is not s_row or (has_bias and bias is not b_row):
                        (_layer_norm_channels if _jit._parallel else
                         _layer_norm_channels.serial)(*args)
                    else:  # the plan's own rows, the arrays C-contiguous: the types are fixed
                        (bound_channels[0] or _jit.bind(
                            bound_channels, _layer_norm_channels.serial, args))(*args)
                    return out, None, None
            X = np.ascontiguousarray(X)
        kernel = _layer_norm if _jit._parallel else _layer_norm.serial
        if not keep_stats:
            if kernel is _layer_norm or scale is not s_row or (has_bias and bias is not b_row):
                kernel(X, scale, bias, has_bias, eps, False, out, False, _NO_STATS, _NO_STATS)
            else:  # the plan's own rows: the types are fixed
                args = (X, scale, bias, has_bias, eps, False, out, False, _NO_STATS, _NO_STATS)
                (bound[0] or _jit.bind(bound, kernel, args))(*args)
            return out, None, None
        mean = np.empty(stats, stash)
        inv = np.empty(stats, stash)
        kernel(X.reshape(flat), scale, bias, has_bias, eps, False, out.reshape(flat), True,
               mean.reshape(rows), inv.reshape(rows))
        return out, mean, inv

    def direct(known, out):  # the serial kernel on the plan's rows, without the statistics
        sync_threads()
        if keep_stats or _jit._parallel or s_row is None or (has_bias and b_row is None) or \
                not (planned(known[0], shape, dtype) and constant(known[1], s_const) and
                     constant_at(known, 2, b_const if has_bias else None) and
                     planned(out, shape, dtype)):
            return None
        return _jit.direct(_layer_norm.serial, (Input(0), s_row, b_row if has_bias else s_row,
                                                has_bias, eps, False, Output(), False,
                                                _NO_STATS, _NO_STATS), known, out)
    layer_normalization_at.direct = direct
    return layer_normalization_at


@specializer(channel_layer_normalization)
def _channel_layer_normalization_at(site: CallSite):
    """ChannelLayerNormalization planned for its shape: the constant Scale and B as contiguous
    rows made once, the kernel's machine code bound at the first call (one thread)."""
    shape, dtype = site.shapes[0], site.dtypes[0]
    if shape is None or len(shape) < 3 or 0 in shape or dtype not in _FLOATS:
        return None
    c = shape[1]
    s_const, b_const = _const(site, 1), _const(site, 2)
    has_bias = len(site.shapes) > 2 and site.shapes[2] is not None
    if not isinstance(s_const, np.ndarray) or s_const.shape != (c,) or (has_bias and (
            not isinstance(b_const, np.ndarray) or b_const.shape != (c,))):
        return None  # a Scale or B given at run time: the generic call
    s_row = np.ascontiguousarray(s_const, dtype)
    b_row = np.ascontiguousarray(b_const, dtype) if has_bias else s_row
    eps = float(site.attrs.get("epsilon", 1e-5))
    generic = site.generic
    bound = [None]  # the serial kernel's machine code (_jit.entry), bound at the first call

    def channel_layer_normalization_at(X, Scale, B=None, out=None):
        if X.shape != shape or X.dtype != dtype or Scale is not s_const or \
                (has_bias and B is not b_const) or (B is not None) != has_bias or \
                not X.flags.c_contiguous or (out is not None and (
                    out.shape != shape or out.dtype != dtype or not out.flags.carray)):
            return generic(X, Scale, B, out=out)
        sync_threads()
        if out is None:
            out = np.empty(shape, dtype)
        args = (X, s_row, b_row, has_bias, eps, out, False)
        if _jit._parallel:
            _layer_norm_channels(*args)
        else:
            (bound[0] or _jit.bind(bound, _layer_norm_channels.serial, args))(*args)
        return out

    def direct(known, out):  # the serial kernel on the plan's rows
        sync_threads()
        if _jit._parallel or not (
                contiguous(known[0], shape, dtype) and constant(known[1], s_const) and
                constant_at(known, 2, b_const if has_bias else None) and
                planned(out, shape, dtype)):
            return None
        return _jit.direct(_layer_norm_channels.serial,
                           (Input(0), s_row, b_row, has_bias, eps, Output(), False), known, out)
    channel_layer_normalization_at.direct = direct
    return channel_layer_normalization_at


@specializer(rms_normalization)
def _rms_normalization_at(site: CallSite):
    """RMSNormalization planned for its shapes: the rows' geometry and the constant scale as
    a contiguous row made once."""
    rows_site = _rows_site(site)
    if rows_site is None:
        return None
    shape, dtype, eps, (_, width, tail, _) = rows_site
    try:
        s_shape, s_const, s_row = _norm_param(site, 1, tail, width, dtype)
    except Exception:
        return None
    generic = site.generic

    bound = [None]  # the serial kernel's machine code (_jit.entry), bound at the first call

    def rms_normalization_at(X, scale, out=None):
        if X.shape != shape or X.dtype != dtype:
            return generic(X, scale, out=out)
        if scale is s_const:
            sc = s_row
        elif scale.shape != s_shape:
            return generic(X, scale, out=out)
        else:
            sc = _param(scale, tail, width, dtype)
        if out is not None and (out.shape != shape or out.dtype != dtype or
                                not out.flags.carray):
            return generic(X, scale, out=out)
        sync_threads()
        if not X.flags.c_contiguous:
            X = np.ascontiguousarray(X)
        if out is None:
            out = np.empty(shape, dtype)
        if _jit._parallel or sc is not s_row:
            (_layer_norm if _jit._parallel else _layer_norm.serial)(
                X, sc, sc, False, eps, True, out, False, _NO_STATS, _NO_STATS)
        else:  # the plan's own row: the types are fixed
            args = (X, sc, sc, False, eps, True, out, False, _NO_STATS, _NO_STATS)
            (bound[0] or _jit.bind(bound, _layer_norm.serial, args))(*args)
        return out

    def direct(known, out):  # the serial kernel on the plan's row
        sync_threads()
        if _jit._parallel or s_row is None or not (
                contiguous(known[0], shape, dtype) and constant(known[1], s_const) and
                planned(out, shape, dtype)):
            return None
        return _jit.direct(_layer_norm.serial, (Input(0), s_row, s_row, False, eps, True,
                                                Output(), False, _NO_STATS, _NO_STATS),
                           known, out)
    rms_normalization_at.direct = direct
    return rms_normalization_at


@specializer(skip_layer_normalization)
def _skip_layer_normalization_at(site: CallSite):
    """SkipLayerNormalization planned for its shapes: constant Scale, B and Bias taken as
    they are (contiguous rows, checked once), and the sum written only when the node names
    that output (else the rows are summed in the output and normalized in place)."""
    shapes, dtypes = site.shapes, site.dtypes
    x_shape = shapes[0]
    dtype = dtypes[0]
    if x_shape is None or not x_shape or 0 in x_shape or dtype not in _FLOATS or \
            any(s is None for s in shapes[1:3]):
        return None
    width = x_shape[-1]
    consts = []
    for i in (2, 3, 4):
        shape = shapes[i] if i < len(shapes) else None
        const = _const(site, i)
        if shape is None:
            consts.append(None)
        elif const is _UNSET or const.shape != (width,) or const.dtype != dtype or \
                not const.flags.c_contiguous:
            return None  # a parameter computed at run time: the generic call
        else:
            consts.append(const)
    scale, beta, bias = consts
    skip_shape = shapes[1]
    eps = float(site.attrs.get("epsilon", 1e-5))
    keep_sum = len(site.out_shapes) > 1 and site.out_shapes[1] is not None
    generic = site.generic
    has_beta, has_bias = beta is not None, bias is not None
    beta_row = scale if beta is None else beta
    bias_row = scale if bias is None else bias

    bound = [None]  # the serial kernel's machine code (_jit.entry), bound at the first call

    def skip_layer_normalization_at(X, Skip, Scale, B=None, Bias=None):
        if X.shape != x_shape or Skip.shape != skip_shape or X.dtype != dtype or \
                Skip.dtype != dtype or Scale is not scale or B is not beta or Bias is not bias:
            return generic(X, Skip, Scale, B, Bias)
        sync_threads()
        out = np.empty(x_shape, dtype)
        total = np.empty(x_shape, dtype) if keep_sum else out
        args = (X if X.flags.c_contiguous else np.ascontiguousarray(X),
                Skip if Skip.flags.c_contiguous else np.ascontiguousarray(Skip),
                bias_row, has_bias, scale, beta_row, has_beta, eps, out, total, keep_sum)
        if _jit._parallel:
            _skip_layer_norm(*args)
        else:  # the plan's own constants, its arrays checked: the types are fixed
            (bound[0] or _jit.bind(bound, _skip_layer_norm.serial, args))(*args)
        return out, (total if keep_sum else None)

    def direct(known, out):  # the serial kernel; the sum into the second output, if named
        sync_threads()
        if _jit._parallel or len(known) < 3 or not (
                contiguous(known[0], x_shape, dtype) and
                contiguous(known[1], skip_shape, dtype) and constant_at(known, 2, scale) and
                constant_at(known, 3, beta) and constant_at(known, 4, bias) and
                planned(out, x_shape, dtype)):
            return None
        return _jit.direct(_skip_layer_norm.serial, (
            Input(0), Input(1), bias_row, has_bias, scale, beta_row, has_beta, eps, Output(),
            Output(index=1) if keep_sum else Output(), keep_sum), known, out)
    skip_layer_normalization_at.direct = direct
    return skip_layer_normalization_at


@specializer(lrn)
def _lrn_at(site: CallSite):
    """LRN planned for its shape: the planes' geometry and the attributes as floats once."""
    shape, dtype = site.shapes[0], site.dtypes[0]
    if shape is None or len(shape) < 3 or 0 in shape or dtype not in _FLOATS:
        return None
    a = site.attrs
    args = (float(a.get("alpha", 1e-4)), float(a.get("beta", 0.75)), float(a.get("bias", 1.0)),
            int(a.get("size", 1)))
    planes = (shape[0], shape[1], math.prod(shape[2:]))
    generic = site.generic

    def lrn_at(X):
        if X.shape != shape or X.dtype != dtype:
            return generic(X)
        sync_threads()
        if not X.flags.c_contiguous:
            X = np.ascontiguousarray(X)
        out = np.empty(shape, dtype)
        (_lrn if _jit._parallel else _lrn.serial)(X.reshape(planes), *args, out.reshape(planes))
        return out
    return lrn_at
