"""The software prefetch (``onemodel.numba._prefetch``) and the skinny product that uses it:
a prefetch compiles for every dtype and index kind, and changes no value; the product's
blocks near the end of the weights (whose prefetch would reach past them) and rows short
enough to be prefetched give the same values as BLAS."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from onemodel.numba import conv
from onemodel.numba._prefetch import prefetch


@numba.njit(cache=False)
def _sum_after_prefetching(a):
    total = 0.0
    for i in range(a.size):
        prefetch(a, i)
        total += a[i]
    prefetch(a, np.int32(0))
    return total


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int64])
def test_prefetch_reads_nothing_into_the_program(dtype):
    a = (np.arange(1000) % 97).astype(dtype)
    assert _sum_after_prefetching(a) == float(a.astype(np.float64).sum())


@pytest.mark.parametrize("m", [1, 3, 4, 5, 17, 33, 130])
@pytest.mark.parametrize("k", [1, 7, 64, 320, 385])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 9])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_skinny_product_equals_blas(m, k, n, dtype):
    """Rows of 1-385 elements: float32 rows up to 384 elements are prefetched (1536 bytes),
    float64 up to 192; any m, so the last blocks prefetch past the weights' end."""
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    w = rng.standard_normal((m, k)).astype(dtype)
    xt = rng.standard_normal((n, k)).astype(dtype)
    out = np.full(m * n, np.nan, dtype)
    conv._skinny_gemm.serial(w, xt, out, n, 1)
    want = w.astype(np.float64) @ xt.astype(np.float64).T
    tol = 1e-4 if dtype == np.float32 else 1e-10
    assert np.allclose(out.reshape(m, n), want, rtol=tol, atol=tol * k)
