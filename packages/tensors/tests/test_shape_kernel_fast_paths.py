"""The reference kernels of Split, Unsqueeze, Slice and ReduceMean take direct ways (slices, a
reshape, the sum and division of np.mean) for speed; these tests hold them to the numpy calls
they replaced, bit for bit, with the same strides (views stay views), over dtypes, shapes, axes,
clamped and huge Slice bounds, and empty tensors."""

from __future__ import annotations

import itertools
import warnings

import ml_dtypes
import numpy as np
import pytest

from onemodel.tensors.errors import ShapeError
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.reduction import _axes
from onemodel.tensors.ops.shape import _slice_index, _split_sizes

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_,
          ml_dtypes.bfloat16]
SHAPES = [(5,), (3, 7), (2, 3, 65), (4, 0, 3), (1, 1, 300)]


def _data(shape, dtype, seed=0):
    return np.asarray(np.random.default_rng(seed).standard_normal(shape) * 100).astype(dtype)


def _same(got, want):
    assert type(got) is type(want)
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes() or np.array_equal(got, want, equal_nan=True)
    assert got.strides == want.strides or got.size <= 1


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_reduce_mean_is_np_mean(dtype):
    for shape in [(), *SHAPES]:
        x = _data(shape, dtype)
        nd = len(shape)
        axsets = [None, np.array([], np.int64)] + [
            np.array(c) for r in (1, 2) for c in itertools.combinations(range(-nd, nd), r)
            if len({a % nd for a in c}) == r]
        for axes, keepdims, noop in itertools.product(axsets, (0, 1), (0, 1)):
            ax = _axes(x, axes, noop)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # the mean of an empty slice
                want = x.copy() if ax == () else np.mean(
                    x, axis=ax, keepdims=bool(keepdims)).astype(x.dtype, copy=False)
                got = OPS["ReduceMean"].kernel(x, axes, keepdims=keepdims,
                                               noop_with_empty_axes=noop)
            _same(got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_unsqueeze_is_expand_dims(dtype):
    for shape in [(), *SHAPES]:
        x = _data(shape, dtype)
        for axes in ([0], [-1], [0, 2], [len(shape)], np.array(0), [1, -1], [-3, 0]):
            ax = np.asarray(axes).reshape(-1)
            m = len(shape) + len(ax)
            if any(not -m <= a < m for a in ax) or len({a % m for a in ax}) != len(ax):
                continue
            got = OPS["Unsqueeze"].kernel(x, np.asarray(axes))
            _same(got, np.expand_dims(x, tuple(sorted(int(a) % m for a in ax))))
            assert np.shares_memory(got, x) or x.size == 0
    with pytest.raises(ShapeError, match="repeat"):
        OPS["Unsqueeze"].kernel(np.zeros((2, 3)), np.array([1, 1]))


@pytest.mark.parametrize("dtype", [np.float32, np.int64, ml_dtypes.bfloat16])
def test_slice_is_the_onnx_clamped_index(dtype):
    rng = np.random.default_rng(3)
    huge = [2**63 - 1, -2**63, 10**9, -10**9]
    for shape in SHAPES:
        x, nd = _data(shape, dtype), len(shape)
        for _ in range(150):
            k = int(rng.integers(1, nd + 1))
            axes = rng.permutation(nd)[:k] - (nd if rng.random() < 0.5 else 0)
            steps = (np.array([int(rng.choice([-3, -2, -1, 1, 2, 3])) for _ in range(k)])
                     if rng.random() < 0.6 else None)
            starts, ends = (np.array([int(rng.choice(huge)) if rng.random() < p
                                      else int(rng.integers(-8, 9)) for _ in range(k)])
                            for p in (0.1, 0.2))
            if rng.random() < 0.2:
                axes = None  # the first k axes
            want = x[_slice_index(x.shape, starts.tolist(), ends.tolist(),
                                  None if axes is None else axes.tolist(),
                                  None if steps is None else steps.tolist())]
            _same(OPS["Slice"].kernel(x, starts, ends, axes, steps), want)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_split_is_np_split(dtype):
    for shape in SHAPES:
        x, nd = _data(shape, dtype), len(shape)
        for a in range(-nd, nd):
            d = shape[a]
            calls = [([0] if d == 0 else [d], {})]
            calls += [(_split_sizes(d, None, n), {"num_outputs": n}) for n in (1, 2, 3) if d]
            calls += [([1, d - 3, 2], {})] if d >= 3 else []
            for sizes, attrs in calls:
                want = tuple(np.split(x, np.cumsum(sizes)[:-1], axis=a % nd))
                for got in (OPS["Split"].kernel(x, np.array(sizes), axis=a),
                            OPS["Split"].kernel(x, None, axis=a, **attrs) if attrs else None):
                    if got is None:
                        continue
                    assert len(got) == len(want)
                    for g, w in zip(got, want):
                        _same(g, w)
