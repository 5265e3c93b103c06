"""Depthwise 3x3 convolutions on sixteen-lane rows (AVX-512), in NCHW as they lie.

Each plane is copied into a zero-bordered plane (its margins zeroed once), and an output row's
vector of sixteen pixels is the sum over the window's taps of the weight times the bordered
row it reads, shifted by the tap's column: plain loads, no per-pixel flags (the flat kernel's
``ok`` rows) and no masks. Eight output rows go at a time, eight sums in flight. The next
plane is copied into a second bordered plane before this one is computed, so its stores have
reached the cache when its loads come (a load that straddles two stores just made waits for
them). The border's zeros are multiplied by the weights as the reference does, so an infinite
weight gives NaN there as in the reference.

At stride 2 (:func:`rows2`) an output vector reads 32 bordered columns and two shuffles split
them into even and odd ones, as the strided pools do (``pool_strided``). Chosen where the CPU
has AVX-512 (``_simd.host_has_avx512``) for float32 3x3 depthwise convolutions without
dilation, over the planes :func:`kernel` admits; measured in docs/benchmarks.md,
"Twenty-sixth round"."""

from __future__ import annotations

import numpy as np

from ._jit import jit
from ._simd import (
    evens16,
    fma16,
    host_has_avx512,
    load16,
    load16_masked,
    next16,
    odds16,
    splat16,
    store16,
    store16_masked,
)
from .conv import U, _activate_in_place

ROWS = 8  # output rows at a time: eight sums in flight
# 3x3 windows over output rows this wide: against the plan's other kernels, one thread,
# Emerald Rapids, each kernel's whole call: 2x16x32x32 16.3 against 18.2 us, 2x48x16x16 13.9
# against 18.1, 2x96x16x16 27.9 against 35.8, 1x480x14x14 57.8 against 73.9; not wider
# (1x144x56x56 311.9 against 312.2, 1x32x112x112 299 against 289), narrower (2x144x8x8 19.2
# against 12.8: the lanes) nor 5x5 (1x672x14x14 183 against 149)
MIN_WIDTH = 14
MAX_WIDTH = 32


# at stride 2 (rows2), output rows this wide: 2x24x32x32 -> 16x16 17.7 -> 13.4 us, 2x96x32x32
# 63.9 -> 53.2, 2x16x31x31 (valid) 16.0 -> 13.7; over 8x8 outputs the lanes stay ahead (7.7
# against 11.9 us) and at 28x28 the taps kernel (220 against 241)
STRIDED_WIDTHS = (14, 16)


def kernel(plan, xshape, dtype, group):
    """The rows kernel for a depthwise convolution (one output per input channel), or None:
    float32, a 3x3 window without dilation, begin pads inside the window, on a CPU with
    AVX-512; at stride 1 (:func:`rows`) over output rows MIN_WIDTH to MAX_WIDTH wide, at
    stride 2 (:func:`rows2`) over STRIDED_WIDTHS."""
    _path, (_n, m, _oh, ow), s, pb, d, k, _chunk = plan
    c = xshape[1]
    if not (np.dtype(dtype) == np.float32 and group == c == m and tuple(k) == (3, 3) and
            tuple(d) == (1, 1) and 0 <= pb[0] < k[0] and 0 <= pb[1] < k[1] and
            host_has_avx512()):
        return None
    if tuple(s) == (1, 1) and MIN_WIDTH <= ow <= MAX_WIDTH:
        return rows
    if tuple(s) == (2, 2) and STRIDED_WIDTHS[0] <= ow <= STRIDED_WIDTHS[1]:
        return rows2
    return None


@jit()
def _copy_in(xf, src, h, wd, plane, pt, pl, wpad):
    """One input plane into the bordered plane (its border untouched)."""
    zero = np.float32(0)
    for r in range(h):
        at = (r + pt) * wpad + pl
        col = 0
        while col + 16 <= wd:
            store16(plane, U(at + col), load16(xf, U(src + r * wd + col)))
            col += 16
        if col < wd:
            store16_masked(plane, at + col, wd - col,
                           load16_masked(xf, src + r * wd + col, 0, wd - col, zero))


@jit()
def _plane(planes, p, size):
    """Plane ``p``'s bordered plane: two of them alternate (the next is copied while one is
    read)."""
    at = (p % 2) * size
    return planes[at:at + size]


@jit()
def _store_group(yf, o, ow, lanes, left, a0, a1, a2, a3, a4, a5, a6, a7):
    """A group's output rows from ``o`` (``ow`` apart), ``lanes`` pixels of each, its first
    ``left`` rows only (the others lie past the plane)."""
    store16_masked(yf, o, lanes, a0)
    if left > 1:
        store16_masked(yf, o + ow, lanes, a1)
    if left > 2:
        store16_masked(yf, o + 2 * ow, lanes, a2)
    if left > 3:
        store16_masked(yf, o + 3 * ow, lanes, a3)
    if left > 4:
        store16_masked(yf, o + 4 * ow, lanes, a4)
    if left > 5:
        store16_masked(yf, o + 5 * ow, lanes, a5)
    if left > 6:
        store16_masked(yf, o + 6 * ow, lanes, a6)
    if left > 7:
        store16_masked(yf, o + 7 * ow, lanes, a7)


@jit()
def rows(x, w, bias, has_bias, pt, pl, act, y):
    """y = act(depthwise(x, w) + bias) for C-contiguous float32 ``x`` (N, C, H, W), ``w``
    (C, 1, 3, 3) and ``y`` (N, C, OH, OW) at stride 1; ``pt``, ``pl``: the begin pads."""
    n_img, c, h, wd = x.shape
    oh, ow = y.shape[2], y.shape[3]
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    wf = w.reshape(w.size)
    zero = np.float32(0)
    # the bordered plane holds what the output groups read and the whole input (its size,
    # not the pads' rule, keeps the copy inside), rows whole vectors apart
    wpad = -(-max(ow + 2, wd + pl) // 16) * 16
    hpad = max(-(-oh // ROWS) * ROWS + 2, h + pt)
    size = hpad * wpad + 16
    planes = np.zeros(2 * size, np.float32)
    _copy_in(xf, 0, h, wd, _plane(planes, 0, size), pt, pl, wpad)
    for p in range(n_img * c):
        plane = _plane(planes, p, size)
        if p + 1 < n_img * c:
            _copy_in(xf, (p + 1) * h * wd, h, wd, _plane(planes, p + 1, size), pt, pl, wpad)
        ch = p % c
        b = splat16(bias[ch] if has_bias else zero)
        dst = p * oh * ow
        for x0 in range(0, ow, 16):
            for y0 in range(0, oh, ROWS):
                a0, a1, a2, a3, a4, a5, a6, a7 = b, b, b, b, b, b, b, b
                for i in range(3):
                    row = (y0 + i) * wpad + x0
                    for j in range(3):
                        s = splat16(wf[U(ch * 9 + i * 3 + j)])
                        at = row + j
                        a0 = fma16(s, load16(plane, U(at)), a0)
                        a1 = fma16(s, load16(plane, U(at + wpad)), a1)
                        a2 = fma16(s, load16(plane, U(at + 2 * wpad)), a2)
                        a3 = fma16(s, load16(plane, U(at + 3 * wpad)), a3)
                        a4 = fma16(s, load16(plane, U(at + 4 * wpad)), a4)
                        a5 = fma16(s, load16(plane, U(at + 5 * wpad)), a5)
                        a6 = fma16(s, load16(plane, U(at + 6 * wpad)), a6)
                        a7 = fma16(s, load16(plane, U(at + 7 * wpad)), a7)
                _store_group(yf, dst + y0 * ow + x0, ow, min(16, ow - x0), oh - y0,
                             a0, a1, a2, a3, a4, a5, a6, a7)
    _activate_in_place(yf, 0, yf.shape[0], act, zero)


@jit()
def rows2(x, w, bias, has_bias, pt, pl, act, y):
    """:func:`rows` at stride 2: an output vector's sixteen pixels read the bordered row's 33
    columns from twice its first; two shuffles split the first 32 into even and odd columns,
    so the taps are ``even[q]``, ``odd[q]`` and ``even[q + 1]`` (the strided pools'
    shuffles, ``pool_strided``)."""
    n_img, c, h, wd = x.shape
    oh, ow = y.shape[2], y.shape[3]
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    wf = w.reshape(w.size)
    zero = np.float32(0)
    # as in rows; a block's third vector (16 columns past its 32) reads inside it too
    wpad = max(32 * -(-ow // 16) + 16, -(-(wd + pl) // 16) * 16)
    hpad = max(2 * (-(-oh // ROWS) * ROWS) + 2, h + pt)
    size = hpad * wpad + 16
    planes = np.zeros(2 * size, np.float32)
    _copy_in(xf, 0, h, wd, _plane(planes, 0, size), pt, pl, wpad)
    for p in range(n_img * c):
        plane = _plane(planes, p, size)
        if p + 1 < n_img * c:
            _copy_in(xf, (p + 1) * h * wd, h, wd, _plane(planes, p + 1, size), pt, pl, wpad)
        ch = p % c
        b = splat16(bias[ch] if has_bias else zero)
        dst = p * oh * ow
        for x0 in range(0, ow, 16):
            for y0 in range(0, oh, ROWS):
                a0, a1, a2, a3, a4, a5, a6, a7 = b, b, b, b, b, b, b, b
                for i in range(3):
                    w0 = splat16(wf[U(ch * 9 + i * 3)])
                    w1 = splat16(wf[U(ch * 9 + i * 3 + 1)])
                    w2 = splat16(wf[U(ch * 9 + i * 3 + 2)])
                    at = (2 * y0 + i) * wpad + 2 * x0
                    a0 = _taps3(plane, at, w0, w1, w2, a0)
                    a1 = _taps3(plane, at + 2 * wpad, w0, w1, w2, a1)
                    a2 = _taps3(plane, at + 4 * wpad, w0, w1, w2, a2)
                    a3 = _taps3(plane, at + 6 * wpad, w0, w1, w2, a3)
                    a4 = _taps3(plane, at + 8 * wpad, w0, w1, w2, a4)
                    a5 = _taps3(plane, at + 10 * wpad, w0, w1, w2, a5)
                    a6 = _taps3(plane, at + 12 * wpad, w0, w1, w2, a6)
                    a7 = _taps3(plane, at + 14 * wpad, w0, w1, w2, a7)
                _store_group(yf, dst + y0 * ow + x0, ow, min(16, ow - x0), oh - y0,
                             a0, a1, a2, a3, a4, a5, a6, a7)
    _activate_in_place(yf, 0, yf.shape[0], act, zero)


@jit()
def _taps3(plane, at, w0, w1, w2, acc):
    """acc + w0 * even + w1 * odd + w2 * (even moved one lane on) of the bordered row's 33
    columns from ``at``."""
    v0 = load16(plane, U(at))
    v1 = load16(plane, U(at + 16))
    even = evens16(v0, v1)
    acc = fma16(w0, even, acc)
    acc = fma16(w1, odds16(v0, v1), acc)
    return fma16(w2, next16(even, load16(plane, U(at + 32))), acc)
