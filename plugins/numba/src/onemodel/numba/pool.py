"""Pooling over 2-D NCHW planes (float32/float64), forward and backward: one pass over each
window with the padding handled by index ranges, where numpy builds a padded copy and one
strided view per window position."""

from __future__ import annotations

import numpy as np

from numba import prange
from onemodel.tensors.ops.nn import _pool_setup

from ._jit import jit, sync_threads


@jit()
def _span(o, s, off, d, size, n):
    """The taps t in [0, n) whose input index o * s + off + t * d lies in [0, size): [lo, hi)."""
    lo = 0
    while lo < n and o * s + off + lo * d < 0:
        lo += 1
    hi = n
    while hi > lo and o * s + off + (hi - 1) * d >= size:
        hi -= 1
    return lo, hi


@jit(parallel=True)
def _max_pool(x, kh, kw, sh, sw, ph, pw, dh, dw, out):
    n_img, ch, oh, ow = out.shape
    h, w = x.shape[2], x.shape[3]
    for t in prange(n_img * ch):
        src = x[t // ch, t % ch]
        dst = out[t // ch, t % ch]
        for y in range(oh):
            ilo, ihi = _span(y, sh, -ph, dh, h, kh)
            for xo in range(ow):
                jlo, jhi = _span(xo, sw, -pw, dw, w, kw)
                best = -np.inf
                for i in range(ilo, ihi):
                    row = src[y * sh - ph + i * dh]
                    for j in range(jlo, jhi):
                        v = row[xo * sw - pw + j * dw]
                        if v > best or v != v:
                            best = v
                            if v != v:
                                break
                dst[y, xo] = best


@jit(parallel=True)
def _avg_pool(x, kh, kw, sh, sw, ph, pw, dh, dw, h_cnt, w_cnt, out):
    """``h_cnt``/``w_cnt``: the index range [-pad, size + pad) that counts toward the divisor
    (the image itself, or with count_include_pad the explicit padding too)."""
    n_img, ch, oh, ow = out.shape
    h, w = x.shape[2], x.shape[3]
    for t in prange(n_img * ch):
        src = x[t // ch, t % ch]
        dst = out[t // ch, t % ch]
        for y in range(oh):
            ilo, ihi = _span(y, sh, -ph, dh, h, kh)
            clo, chi = _span(y, sh, -ph - h_cnt[0], dh, h_cnt[1] - h_cnt[0], kh)
            for xo in range(ow):
                jlo, jhi = _span(xo, sw, -pw, dw, w, kw)
                dlo, dhi = _span(xo, sw, -pw - w_cnt[0], dw, w_cnt[1] - w_cnt[0], kw)
                acc = 0.0
                for i in range(ilo, ihi):
                    row = src[y * sh - ph + i * dh]
                    for j in range(jlo, jhi):
                        acc += row[xo * sw - pw + j * dw]
                count = (chi - clo) * (dhi - dlo)
                dst[y, xo] = acc / count


@jit(parallel=True)
def _max_pool_grad(x, dy, kh, kw, sh, sw, ph, pw, dh, dw, dx):
    """Each window's gradient goes to its first maximum (taps in row-major order)."""
    n_img, ch, oh, ow = dy.shape
    h, w = x.shape[2], x.shape[3]
    for t in prange(n_img * ch):
        src = x[t // ch, t % ch]
        g = dy[t // ch, t % ch]
        dst = dx[t // ch, t % ch]
        dst[:, :] = 0
        for y in range(oh):
            ilo, ihi = _span(y, sh, -ph, dh, h, kh)
            for xo in range(ow):
                jlo, jhi = _span(xo, sw, -pw, dw, w, kw)
                best = -np.inf
                for i in range(ilo, ihi):
                    row = src[y * sh - ph + i * dh]
                    for j in range(jlo, jhi):
                        v = row[xo * sw - pw + j * dw]
                        if v > best or v != v:
                            best = v
                if best != best:
                    continue  # a NaN maximum: no tap equals it, as in the reference
                if best == -np.inf:
                    # padding (-inf) ties too: the first tap overall takes it, lost if it is
                    # padding
                    if ilo == 0 and jlo == 0 and ihi > 0 and jhi > 0:
                        dst[y * sh - ph, xo * sw - pw] += g[y, xo]
                    continue
                done = False
                for i in range(ilo, ihi):
                    iy = y * sh - ph + i * dh
                    for j in range(jlo, jhi):
                        ix = xo * sw - pw + j * dw
                        if src[iy, ix] == best:
                            dst[iy, ix] += g[y, xo]
                            done = True
                            break
                    if done:
                        break


@jit(parallel=True)
def _avg_pool_grad(dy, kh, kw, sh, sw, ph, pw, dh, dw, h_cnt, w_cnt, dx):
    n_img, ch, oh, ow = dy.shape
    h, w = dx.shape[2], dx.shape[3]
    for t in prange(n_img * ch):
        g = dy[t // ch, t % ch]
        dst = dx[t // ch, t % ch]
        dst[:, :] = 0
        for y in range(oh):
            ilo, ihi = _span(y, sh, -ph, dh, h, kh)
            clo, chi = _span(y, sh, -ph - h_cnt[0], dh, h_cnt[1] - h_cnt[0], kh)
            for xo in range(ow):
                jlo, jhi = _span(xo, sw, -pw, dw, w, kw)
                dlo, dhi = _span(xo, sw, -pw - w_cnt[0], dw, w_cnt[1] - w_cnt[0], kw)
                share = g[y, xo] / ((chi - clo) * (dhi - dlo))
                for i in range(ilo, ihi):
                    iy = y * sh - ph + i * dh
                    for j in range(jlo, jhi):
                        dst[iy, xo * sw - pw + j * dw] += share


@jit(parallel=True)
def _global(x, is_max, out):
    planes, length = x.shape
    for t in prange(planes):
        row = x[t]
        if is_max:
            best = row[0]
            for q in range(1, length):
                v = row[q]
                if v > best or v != v:
                    best = v
                    if v != v:
                        break
            out[t] = best
        else:
            acc = 0.0
            for q in range(length):
                acc += row[q]
            out[t] = acc / length


def _setup(X, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode):
    k, s, pb, _pe, d, out_sp, pe_explicit = _pool_setup(X, kernel_shape, strides, pads,
                                                        dilations, auto_pad, ceil_mode)
    return k, s, pb, d, out_sp, pe_explicit


def _count_ranges(X, pb, pe_explicit, count_include_pad):
    h, w = X.shape[2], X.shape[3]
    if count_include_pad:
        return (np.array([-pb[0], h + pe_explicit[0]]), np.array([-pb[1], w + pe_explicit[1]]))
    return np.array([0, h]), np.array([0, w])


def max_pool(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=(), pads=None,
             storage_order=0, strides=None):
    sync_threads()
    X = np.ascontiguousarray(X)
    k, s, pb, d, out_sp, _ = _setup(X, kernel_shape, strides, pads, dilations, auto_pad,
                                    ceil_mode)
    out = np.empty((*X.shape[:2], *out_sp), X.dtype)
    _max_pool(X, k[0], k[1], s[0], s[1], pb[0], pb[1], d[0], d[1], out)
    return out


def average_pool(X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=(), pads=None, strides=None):
    sync_threads()
    X = np.ascontiguousarray(X)
    k, s, pb, d, out_sp, pe_explicit = _setup(X, kernel_shape, strides, pads, dilations,
                                              auto_pad, ceil_mode)
    hc, wc = _count_ranges(X, pb, pe_explicit, count_include_pad)
    out = np.empty((*X.shape[:2], *out_sp), X.dtype)
    _avg_pool(X, k[0], k[1], s[0], s[1], pb[0], pb[1], d[0], d[1], hc, wc, out)
    return out


def max_pool_grad(X, dY, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=(),
                  pads=None, storage_order=0, strides=None):
    sync_threads()
    X = np.ascontiguousarray(X)
    dY = np.ascontiguousarray(dY)
    k, s, pb, d, _, _ = _setup(X, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode)
    dx = np.empty(X.shape, dY.dtype)
    _max_pool_grad(X, dY, k[0], k[1], s[0], s[1], pb[0], pb[1], d[0], d[1], dx)
    return dx


def average_pool_grad(X, dY, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0,
                      dilations=None, kernel_shape=(), pads=None, strides=None):
    sync_threads()
    dY = np.ascontiguousarray(dY)
    k, s, pb, d, _, pe_explicit = _setup(X, kernel_shape, strides, pads, dilations, auto_pad,
                                         ceil_mode)
    hc, wc = _count_ranges(X, pb, pe_explicit, count_include_pad)
    dx = np.empty(X.shape, dY.dtype)
    _avg_pool_grad(dY, k[0], k[1], s[0], s[1], pb[0], pb[1], d[0], d[1], hc, wc, dx)
    return dx


def _rows(X):
    return X.reshape(X.shape[0] * X.shape[1], int(np.prod(X.shape[2:], dtype=np.int64)))


def global_average_pool(X):
    sync_threads()
    X = np.ascontiguousarray(X)
    out = np.empty(X.shape[:2], X.dtype)
    _global(_rows(X), False, out.reshape(-1))
    return out.reshape(*X.shape[:2], *([1] * (X.ndim - 2)))


def global_max_pool(X):
    sync_threads()
    X = np.ascontiguousarray(X)
    out = np.empty(X.shape[:2], X.dtype)
    _global(_rows(X), True, out.reshape(-1))
    return out.reshape(*X.shape[:2], *([1] * (X.ndim - 2)))
