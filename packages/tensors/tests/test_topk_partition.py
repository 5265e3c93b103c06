"""TopK over long rows takes a partition instead of a full sort; it must pick exactly what a
stable sort picks: the k smallest (or largest) keys, ties to the lower index, in order. Random
rows full of ties, NaN, signed zeros and every integer kind, with the partition forced on."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.tensors.ops import OPS, gather

TOPK = OPS["TopK"].kernel


def _stable_topk(X, k, axis, largest):
    a = axis % X.ndim
    if not largest:
        key = X
    elif X.dtype.kind == "u":
        key = np.iinfo(X.dtype).max - X
    else:
        key = -X
    idx = np.take(np.argsort(key, axis=a, kind="stable"), range(k), axis=a)
    return np.take_along_axis(X, idx, axis=a), idx


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64,
                                   np.uint8, np.int8])
def test_the_partition_picks_what_a_stable_sort_picks(dtype, monkeypatch):
    monkeypatch.setattr(gather, "_PARTITION_MIN", 1)
    rng = np.random.default_rng(4)
    for trial in range(300):
        nd = int(rng.integers(1, 4))
        shape = tuple(int(v) for v in rng.integers(1, 10, nd))
        axis = int(rng.integers(-nd, nd))
        n = shape[axis % nd]
        k = int(rng.integers(1, n + 1))
        if np.dtype(dtype).kind == "f" and trial % 2:
            X = rng.standard_normal(shape).astype(dtype)
        else:  # few distinct values: ties everywhere
            X = rng.integers(0 if np.dtype(dtype).kind == "u" else -2, 3, shape).astype(dtype)
        if np.dtype(dtype).kind == "f" and trial % 3 == 0:
            X.flat[int(rng.integers(0, X.size))] = np.nan
            X.flat[int(rng.integers(0, X.size))] = -0.0
        for largest in (0, 1):
            want_v, want_i = _stable_topk(X, k, axis, largest)
            got_v, got_i = TOPK(X, np.array([k]), axis=axis, largest=largest)
            assert np.array_equal(got_i, want_i), (X, k, axis, largest)
            assert np.array_equal(got_v, want_v, equal_nan=True)
            assert got_i.dtype == np.int64


def test_a_long_row_takes_the_partition_and_agrees():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 8400)).astype(np.float32)
    x[0, 100:200] = x[0, 50]  # a run of ties around the k-th
    for k in (1, 300, 2100):
        for largest in (0, 1):
            want_v, want_i = _stable_topk(x, k, -1, largest)
            got_v, got_i = TOPK(x, np.array([k]), axis=-1, largest=largest)
            assert np.array_equal(got_i, want_i) and np.array_equal(got_v, want_v)
