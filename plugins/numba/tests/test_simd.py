"""The eight-lane float32 vectors (``onemodel.numba._simd``) against numpy: loads and stores
at unaligned offsets, broadcasts, fused multiply-adds rounded once, and the 8x8 transpose
between runs of any stride; anything but a 1-D C-contiguous float32 array (a strided view
would be read as if contiguous) is refused when the kernel is typed."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from onemodel.numba._simd import fma8, load8, splat8, store8, transpose8x8


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
