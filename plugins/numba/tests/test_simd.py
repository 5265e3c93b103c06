"""The eight-lane float32 vectors (``onemodel.numba._simd``) against numpy: loads and stores
at unaligned offsets, broadcasts, and fused multiply-adds rounded once (as ``np.float64``
products rounded to float32 are, for these exactly representable operands); anything but a
1-D float32 array is refused when the kernel is typed."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from onemodel.numba._simd import fma8, load8, splat8, store8


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
