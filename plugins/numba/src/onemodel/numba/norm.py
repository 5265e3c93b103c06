"""Normalizations (float32/float64): batch normalization with running statistics, layer and
RMS normalization over the last axis, and LRN across channels. One pass per row or plane with
float64 accumulators, where numpy makes a temporary per arithmetic step."""

from __future__ import annotations

import math

import numpy as np

from numba import prange

from . import _jit
from ._jit import jit, sync_threads


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


@jit(parallel=True)
def _layer_norm(x, scale, bias, has_bias, eps, rms, out, stats, mean_out, inv_out):
    """Rows of ``x`` normalized into ``out``; with ``stats``, each row's mean and inverse
    standard deviation stored in ``mean_out`` and ``inv_out`` (of the stash dtype)."""
    rows, width = x.shape
    for r in prange(rows):
        row = x[r]
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
        dst = out[r]
        for q in range(width):
            v = (row[q] - mean) * inv * scale[q]
            if has_bias:
                v += bias[q]
            dst[q] = v
        if stats:
            mean_out[r] = mean
            inv_out[r] = inv


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


def batch_normalization(X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9,
                        training_mode=0, out=None):
    sync_threads()
    if not X.flags.c_contiguous:
        X = np.ascontiguousarray(X)
    inv = 1.0 / np.sqrt(input_var.astype(np.float64) + epsilon)
    mul = (scale * inv.astype(X.dtype)).astype(X.dtype)
    add = (B - input_mean * mul).astype(X.dtype)
    if out is None:
        out = np.empty_like(X)
    _affine_planes(_planes(X), mul, add, _planes(out))
    return out


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


def rms_normalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1, out=None):
    sync_threads()
    shape = X.shape
    nd = len(shape)
    a = axis + nd if axis < 0 else axis
    rows, width = math.prod(shape[:a]), math.prod(shape[a:])
    dtype = X.dtype
    if not X.flags.c_contiguous:
        X = np.ascontiguousarray(X)
    sc = _param(scale, shape[a:], width, dtype)
    if out is None:
        out = np.empty(shape, dtype)
    flat = out.reshape(rows, width)
    _layer_norm(X.reshape(rows, width), sc, sc, False, float(epsilon), True, flat, False,
                _NO_STATS, _NO_STATS)
    return out


def lrn(X, *, alpha=1e-4, beta=0.75, bias=1.0, size=1):
    sync_threads()
    X = np.ascontiguousarray(X)
    out = np.empty_like(X)
    _lrn(_planes(X), float(alpha), float(beta), float(bias), int(size), _planes(out))
    return out
