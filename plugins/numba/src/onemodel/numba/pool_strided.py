"""MaxPool of float32 NCHW planes along a column stride of two, on sixteen-lane vectors.

A 3x3 (or 2x2) window at stride 2 reads its taps two columns apart. The NCHW kernel
(``pool._max_pool_fixed``) reduces each window's rows in one sweep, which vectorizes, and then
takes those strided taps one output at a time; over the small odd planes of SqueezeNet and
GoogLeNet even the sweep stays scalar (a 31-wide row is all remainder for LLVM's 64-wide
vectorized loop). Here each output row goes 32 input columns at a time, in registers: the
window's rows reduced in two vectors (masked loads stand for the padding and the row's end,
reading -inf there), split into their even and odd columns by two shuffles, and
``out[q] = max(even[q], odd[q], even[q + 1])`` (without the last term for a 2-wide window),
stored by a masked store.

The maxima are single ``vmaxps`` instructions, which drop a NaN; the loaded rows are summed
beside them, and a row whose sum holds a NaN (a NaN read, or inf - inf: a false alarm) is
done again with NaN-aware maxima (``_simd.max16``), as the NCHW kernel does. The order of the
comparisons is the NCHW kernel's, row by row and then tap by tap, so ties (-0.0 and 0.0) and
NaN come out as there: NaN wins and stays, as in np.maximum.

Chosen where the CPU has AVX-512 (``_simd.host_has_avx512``) for float32 MaxPools of column
stride two, window width two or three and no dilation (:func:`takes`), except over planes
narrower than :data:`MIN_WIDTH_OVER_LANES`, where ``pool_lanes`` takes those it fits;
measured in docs/benchmarks.md, "Twenty-sixth round"."""

from __future__ import annotations

from functools import cache

import numpy as np

from numba import prange

from ._jit import jit
from ._simd import (
    add16,
    evens16,
    has_nan16,
    host_has_avx512,
    larger16,
    load16_masked,
    max16,
    next16,
    odds16,
    splat16,
    store16_masked,
)

# planes narrower than this go by pool_lanes where it fits them, planned on one thread:
# 3x3/2 over 2x256x7x7 7.7 against 11.4 us, 2x128x9x9 6.5 against 7.8, 2x128x11x11 9.8
# against 9.7, 1x256x13x13 13.7 against 11.3, 2x128x15x15 18.1 against 12.9
MIN_WIDTH_OVER_LANES = 11


def takes(dtype, kernel_shape, strides, dilations) -> bool:
    """Whether :func:`max_pool_kernel` computes a MaxPool of these attributes (the strides and
    dilations as the plan resolved them)."""
    return np.dtype(dtype) == np.float32 and len(kernel_shape) == 2 and \
        kernel_shape[1] in (2, 3) and tuple(strides)[1:] == (2,) and \
        tuple(dilations) == (1, 1) and host_has_avx512()


@jit()
def _window_rows(x, at, w, rows, lo, hi, total, careful):
    """The maximum over the ``rows`` rows ``w`` apart of the 16 elements from ``at`` (lanes
    ``lo <= l < hi`` read, -inf elsewhere) and ``total`` plus their sum, a NaN there where one
    was read. ``careful``: NaN-aware maxima. The kernel passes ``rows`` and ``careful`` as
    constants where it can, which LLVM folds in once this is inlined (the window's rows
    unrolled, one kind of maximum)."""
    lowest = np.float32(-np.inf)
    m = splat16(lowest)
    for i in range(rows):
        v = load16_masked(x, at + i * w, lo, hi, lowest)
        m = max16(m, v) if careful else larger16(m, v)
        total = add16(total, v)
    return m, total


@jit()
def _output_row(x, out, first, rows, w, pl, ow, base, kw, careful):
    """One output row written from the window rows that start at ``first`` (column 0 of the
    padded row); it returns whether a NaN was read (then, unless ``careful``, the row must be
    done again carefully)."""
    # a: padded columns c0 .. c0 + 15, read where 0 <= c0 + l - pl < w; b: the next 16
    a, total = _window_rows(x, first, w, rows, pl, w + pl, splat16(np.float32(0)), careful)
    c0 = 0
    q = 0
    while q < ow:
        if c0 + 16 - pl < w:
            b, total = _window_rows(x, first + c0 + 16, w, rows, pl - c0 - 16,
                                    w + pl - c0 - 16, total, careful)
        else:  # a row of at most 16 columns
            b = splat16(np.float32(-np.inf))
        even = evens16(a, b)
        odd = odds16(a, b)
        m = max16(even, odd) if careful else larger16(even, odd)
        c0 += 32
        if c0 - pl < w:  # the next 32 columns' first vector
            a, total = _window_rows(x, first + c0, w, rows, pl - c0, w + pl - c0, total,
                                    careful)
        else:
            a = splat16(np.float32(-np.inf))
        if kw == 3:  # its lane 0 is the last output's third tap
            nxt = next16(even, a)
            m = max16(m, nxt) if careful else larger16(m, nxt)
        store16_masked(out, base + q, min(16, ow - q), m)
        q += 16
    return has_nan16(total)


@cache
def max_pool_kernel(kh: int, kw: int):
    """The kernel of (``kh``, ``kw``) windows, ``kw`` 2 or 3, at column stride 2, called as
    ``kernel(x, out, h, w, oh, ow, pl, h0, lo_h, hi_h)`` on flat planes: ``pl`` the begin pad
    of the columns, ``h0``, ``lo_h``, ``hi_h`` the window rows of each output row (``pool``'s
    tables: the rows ``h0[y] + lo_h[y]`` to ``h0[y] + hi_h[y]`` lie inside the image). Rows
    whose window lies whole inside the image pass ``kh`` as a constant (its rows unrolled).
    Only the integers are closure constants: numba's on-disk cache keys a closure by its
    constants, and a function among them (another kernel) would miss it in every process."""

    @jit(parallel=True)
    def kernel(x, out, h, w, oh, ow, pl, h0, lo_h, hi_h):
        planes = out.shape[0] // (oh * ow)
        for p in prange(planes):
            for y in range(oh):
                first = p * h * w + (h0[y] + lo_h[y]) * w - pl
                rows = hi_h[y] - lo_h[y]
                base = p * oh * ow + y * ow
                if rows == kh:
                    nan = _output_row(x, out, first, kh, w, pl, ow, base, kw, False)
                else:
                    nan = _output_row(x, out, first, rows, w, pl, ow, base, kw, False)
                if nan:
                    _output_row(x, out, first, rows, w, pl, ow, base, kw, True)
    return kernel
