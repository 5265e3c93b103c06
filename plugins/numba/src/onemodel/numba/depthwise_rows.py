"""Depthwise convolutions at stride 1 on sixteen-lane rows (AVX-512), in NCHW as they lie.

Each plane is copied into a zero-bordered plane (its margins zeroed once), and an output row's
vector of sixteen pixels is the sum over the window's taps of the weight times the bordered
row it reads, shifted by the tap's column: plain loads, no per-pixel flags (the flat kernel's
``ok`` rows) and no masks. Eight output rows go at a time, eight sums in flight. The next
plane is copied into a second bordered plane before this one is computed, so its stores have
reached the cache when its loads come (a load that straddles two stores just made waits for
them). The border's zeros are multiplied by the weights as the reference does, so an infinite
weight gives NaN there as in the reference.

Chosen where the CPU has AVX-512 (``_simd.host_has_avx512``) for float32 depthwise
convolutions at stride 1 without dilation, over planes :func:`fits` admits; measured in
docs/benchmarks.md, "Twenty-sixth round"."""

from __future__ import annotations

from functools import cache

import numpy as np

from ._jit import jit
from ._simd import fma16, host_has_avx512, load16, load16_masked, splat16, store16, store16_masked
from .conv import U, _activate_in_place

ROWS = 8  # output rows at a time: eight sums in flight
# 3x3 windows over output rows this wide: against the plan's other kernels, one thread,
# Emerald Rapids, each kernel's whole call: 2x16x32x32 16.3 against 18.2 us, 2x48x16x16 13.9
# against 18.1, 2x96x16x16 27.9 against 35.8, 1x480x14x14 57.8 against 73.9; not wider
# (1x144x56x56 311.9 against 312.2, 1x32x112x112 299 against 289), narrower (2x144x8x8 19.2
# against 12.8: the lanes) nor 5x5 (1x672x14x14 183 against 149)
MIN_WIDTH = 14
MAX_WIDTH = 32


def fits(plan, xshape, dtype, group) -> bool:
    """Whether a depthwise convolution (one output per input channel) goes by these rows:
    float32, a 3x3 window at stride 1 without dilation, begin pads inside the window, output
    rows MIN_WIDTH to MAX_WIDTH wide, on a CPU with AVX-512."""
    _path, (_n, m, _oh, ow), s, pb, d, k, _chunk = plan
    c = xshape[1]
    return np.dtype(dtype) == np.float32 and group == c == m and tuple(k) == (3, 3) and \
        tuple(s) == (1, 1) and tuple(d) == (1, 1) and 0 <= pb[0] < k[0] and \
        0 <= pb[1] < k[1] and MIN_WIDTH <= ow <= MAX_WIDTH and host_has_avx512()


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


@cache
def rows(kh: int, kw: int):
    """The kernel of (kh, kw) windows, their loops unrolled: ``kernel(x, w, bias, has_bias,
    pt, pl, act, y)``. Only integers are closed over, so numba's on-disk cache keeps it."""

    @jit()
    def kernel(x, w, bias, has_bias, pt, pl, act, y):
        n_img, c, h, wd = x.shape
        oh, ow = y.shape[2], y.shape[3]
        xf = x.reshape(x.size)
        yf = y.reshape(y.size)
        wf = w.reshape(w.size)
        zero = np.float32(0)
        wpad = -(-(ow + kw - 1) // 16) * 16  # rows whole vectors apart
        hpad = -(-oh // ROWS) * ROWS + kh - 1
        size = hpad * wpad + 16
        planes = np.zeros(2 * size, np.float32)
        _copy_in(xf, 0, h, wd, planes[:size], pt, pl, wpad)
        for p in range(n_img * c):
            plane = planes[(p % 2) * size:(p % 2 + 1) * size]
            if p + 1 < n_img * c:
                _copy_in(xf, (p + 1) * h * wd, h, wd,
                         planes[((p + 1) % 2) * size:((p + 1) % 2 + 1) * size], pt, pl, wpad)
            ch = p % c
            wb = ch * kh * kw
            b = splat16(bias[ch] if has_bias else zero)
            dst = p * oh * ow
            for x0 in range(0, ow, 16):
                lanes = min(16, ow - x0)
                for y0 in range(0, oh, ROWS):
                    a0, a1, a2, a3, a4, a5, a6, a7 = b, b, b, b, b, b, b, b
                    for i in range(kh):
                        row = (y0 + i) * wpad + x0
                        for j in range(kw):
                            s = splat16(wf[U(wb + i * kw + j)])
                            at = row + j
                            a0 = fma16(s, load16(plane, U(at)), a0)
                            a1 = fma16(s, load16(plane, U(at + wpad)), a1)
                            a2 = fma16(s, load16(plane, U(at + 2 * wpad)), a2)
                            a3 = fma16(s, load16(plane, U(at + 3 * wpad)), a3)
                            a4 = fma16(s, load16(plane, U(at + 4 * wpad)), a4)
                            a5 = fma16(s, load16(plane, U(at + 5 * wpad)), a5)
                            a6 = fma16(s, load16(plane, U(at + 6 * wpad)), a6)
                            a7 = fma16(s, load16(plane, U(at + 7 * wpad)), a7)
                    o = dst + y0 * ow + x0
                    left = oh - y0  # rows of this group inside the output
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
        _activate_in_place(yf, 0, yf.shape[0], act, zero)
    return kernel
