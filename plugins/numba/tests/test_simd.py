"""The eight-lane float32 vectors (``onemodel.numba._simd``) against numpy: loads and stores
at unaligned offsets, broadcasts, fused multiply-adds rounded once, and the 8x8 transpose
between runs of any stride; anything but a 1-D C-contiguous float32 array (a strided view
would be read as if contiguous) is refused when the kernel is typed. The sixteen-lane row
operations of the strided pools: masked loads and stores, the even/odd/next shuffles, the two
maxima and the NaN test. The clamp and sum the 1x1 tiles finish their sums with; the
product, lane selection and maximum over lanes of the attention rows."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from onemodel.numba._simd import (
    add8,
    add16,
    clamp8,
    clamp16,
    evens16,
    first8,
    fma8,
    has_nan16,
    hmax8,
    larger16,
    load8,
    load16,
    load16_masked,
    max16,
    mul8,
    next16,
    odds16,
    splat8,
    splat16,
    store8,
    store16,
    store16_masked,
    transpose8x8,
)


@numba.njit(cache=False)
def _axpy_by_vectors(a, x, y, out):
    """out[i:i + 8] = a * x[i:i + 8] + y[i:i + 8] for every whole vector from offset 3."""
    va = splat8(a)
    i = 3
    while i + 8 <= x.shape[0]:
        store8(out, i, fma8(va, load8(x, i), load8(y, i)))
        i += 8


def test_vectors_compute_what_numpy_computes():
    rng = np.random.default_rng(0)
    x = rng.integers(-1000, 1000, 43).astype(np.float32) / 8
    y = rng.integers(-1000, 1000, 43).astype(np.float32) / 4
    out = np.full(43, np.nan, np.float32)
    _axpy_by_vectors(np.float32(1.5), x, y, out)
    np.testing.assert_array_equal(out[3:43], (np.float32(1.5) * x + y)[3:43])
    assert np.isnan(out[:3]).all()  # nothing written outside the vectors


def test_fma_rounds_once():
    """(1 + 2^-12)^2 - 1 in float32: a separate product rounds 2^-24 away, the fused one
    keeps it."""
    e = np.float32(2.0 ** -12)
    x = np.full(11, 1 + e, np.float32)
    y = np.full(11, -1, np.float32)
    out = np.zeros(11, np.float32)
    _axpy_by_vectors(np.float32(1 + e), x, y, out)
    assert out[3] == np.float32(2 * e + e * e)
    assert np.float32(1 + e) * np.float32(1 + e) - 1 != out[3]


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_other_arrays_are_refused_when_typed(dtype):
    with pytest.raises(numba.core.errors.TypingError):
        _axpy_by_vectors(np.float32(1), np.zeros(16, dtype), np.zeros(16, dtype),
                         np.zeros(16, dtype))


def test_a_strided_view_is_refused_when_typed():
    x = np.zeros(32, np.float32)
    with pytest.raises(numba.core.errors.TypingError):
        _axpy_by_vectors(np.float32(1), x[::2], x[::2], np.zeros(16, np.float32))


@numba.njit(cache=False)
def _transposed(src, s0, sstride, dst, d0, dstride):
    transpose8x8(src, s0, sstride, dst, d0, dstride)


@pytest.mark.parametrize("s0, sstride, d0, dstride", [(0, 8, 0, 8), (3, 20, 5, 30), (1, 9, 0, 64)])
def test_transpose_moves_each_value_to_its_place(s0, sstride, d0, dstride):
    src = np.arange(600, dtype=np.float32)
    dst = np.full(600, -1, np.float32)
    _transposed(src, s0, sstride, dst, d0, dstride)
    want = np.full(600, -1, np.float32)
    for r in range(8):
        for c in range(8):
            want[d0 + c * dstride + r] = src[s0 + r * sstride + c]
    np.testing.assert_array_equal(dst, want)  # and nothing else written


@numba.njit(cache=False)
def _sixteen_lane_ops(x, at, lo, hi, n, out):
    """Each of the sixteen-lane row operations, stored in turn into rows of ``out``."""
    a = load16_masked(x, at, lo, hi, np.float32(-1.5))
    b = load16_masked(x, at + 16, 0, 16, np.float32(0))
    store16(out, 0, a)
    store16(out, 16, evens16(a, b))
    store16(out, 32, odds16(a, b))
    store16(out, 48, next16(a, b))
    store16(out, 64, larger16(a, b))
    store16(out, 80, max16(a, b))
    store16(out, 96, add16(a, b))
    store16_masked(out, 112, n, b)
    return has_nan16(a), has_nan16(b)


@pytest.mark.parametrize("at, lo, hi, n", [(0, 0, 16, 16), (-3, 3, 16, 5), (40, 2, 9, 0),
                                            (48, -4, 11, 1), (10, 0, 0, 15)])
def test_sixteen_lane_row_operations_compute_what_numpy_computes(at, lo, hi, n):
    """Masked loads read only their lanes (from before the array's start or up to its end),
    masked stores write only theirs; the shuffles move lanes where their names say; larger16 is
    vmaxps (b's NaN dropped, a's kept), max16 keeps every NaN."""
    x = np.arange(80, dtype=np.float32) - 30
    x[at + 17] = np.nan  # in b's lane 1
    out = np.full(128, 99.0, np.float32)
    nan_a, nan_b = _sixteen_lane_ops(x, at, lo, hi, n, out)
    lanes = np.arange(16)
    inside = (lanes >= lo) & (lanes < hi)
    a = np.where(inside, x[np.clip(at + lanes, 0, 79)], np.float32(-1.5))
    b = x[at + 16:at + 32]
    pairs = np.concatenate([a, b])
    np.testing.assert_array_equal(out[:16], a)
    np.testing.assert_array_equal(out[16:32], pairs[0::2])
    np.testing.assert_array_equal(out[32:48], pairs[1::2])
    np.testing.assert_array_equal(out[48:64], pairs[1:17])
    np.testing.assert_array_equal(out[64:80], np.where(b > a, b, a))
    np.testing.assert_array_equal(out[80:96], np.where((b > a) | np.isnan(b), b, a))
    np.testing.assert_array_equal(out[96:112], a + b)
    np.testing.assert_array_equal(out[112:128], np.where(lanes < n, b, np.float32(99.0)))
    assert (nan_a, nan_b) == (bool(np.isnan(a).any()), True)


@numba.njit(cache=False)
def _finished(x, y, lo, hi, out8, out16):
    """clamp(x + y, lo, hi) by the eight- and sixteen-lane operations, vector by vector."""
    l8, h8, l16, h16 = splat8(lo), splat8(hi), splat16(lo), splat16(hi)
    for i in range(0, x.shape[0], 8):
        store8(out8, i, clamp8(add8(load8(x, i), load8(y, i)), l8, h8))
    for i in range(0, x.shape[0], 16):
        store16(out16, i, clamp16(add16(load16(x, i), load16(y, i)), l16, h16))


@pytest.mark.parametrize("act", ["Relu", "Relu6", "none"])
def test_clamp_is_the_kernels_relu_and_relu6_bit_for_bit(act):
    """Clamped to (0, inf) the lanes are conv.py's Relu, to (0, 6) its Relu6, to (-inf, inf)
    untouched: NaN stays NaN, -0.0 stays -0.0 (``np.maximum(v, 0)`` would give +0.0), -inf
    becomes 0."""
    lo, hi = {"Relu": (0.0, np.inf), "Relu6": (0.0, 6.0), "none": (-np.inf, np.inf)}[act]
    x = np.array([1.5, -2.0, -0.0, 0.0, np.nan, -np.inf, np.inf, 7.5] * 4, np.float32)
    y = np.zeros(32, np.float32)
    y[::3] = np.float32(-0.0)
    y[8:16] = -x[8:16]  # sums of exactly zero, and inf - inf = NaN
    out8 = np.full(32, 7.0, np.float32)
    out16 = np.full(32, 7.0, np.float32)
    _finished(x, y, np.float32(lo), np.float32(hi), out8, out16)
    v = x + y
    want = v if act == "none" else np.where(v < 0, np.float32(0), v)
    if act == "Relu6":
        want = np.where(want > 6, np.float32(6), want)
    assert np.isnan(want).sum() == 6 and (np.signbit(want) & (want == 0)).any()
    np.testing.assert_array_equal(out8.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(out16.view(np.uint32), want.view(np.uint32))


@numba.njit(cache=False)
def _row_ops(x, y, n, out):
    """mul8 and first8 stored, and hmax8 of x's vector returned."""
    a = load8(x, 0)
    store8(out, 0, mul8(a, load8(y, 0)))
    store8(out, 8, first8(a, n, np.float32(-np.inf)))
    return hmax8(a)


@pytest.mark.parametrize("n", [0, 1, 5, 8])
def test_row_maximum_operations_compute_what_numpy_computes(n):
    """first8 keeps the first n lanes; hmax8 is the largest lane, NaN as soon as one lane is
    NaN wherever it lies, and -inf only for a vector of -inf."""
    x = np.array([0.5, -3.0, 7.25, -0.0, 2.0, np.inf, -1.0, 6.0], np.float32)
    y = np.array([2.0, 0.5, -1.0, 3.0, np.nan, 0.0, -0.0, 1.0], np.float32)
    out = np.zeros(16, np.float32)
    assert _row_ops(x, y, n, out) == np.inf
    np.testing.assert_array_equal(out[:8], x * y)
    np.testing.assert_array_equal(out[8:], np.where(np.arange(8) < n, x, -np.inf))
    for lane in range(8):
        z = x.copy()
        z[5] = 1.0
        z[lane] = np.nan
        assert np.isnan(_row_ops(z, y, n, out))
    z = np.full(8, -np.inf, np.float32)
    assert _row_ops(z, y, n, out) == -np.inf
    z[3] = -2.5
    assert _row_ops(z, y, n, out) == -2.5
