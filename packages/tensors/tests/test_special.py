"""The vectorized erf against math.erf (an independent oracle) over a wide range, every float
dtype, and the special values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from onemodel.tensors import Tensor
from onemodel.tensors.ops._special import erf


def _oracle(x: np.ndarray) -> np.ndarray:
    return np.array([math.erf(float(v)) for v in x.reshape(-1)]).reshape(x.shape)


def _wide(dtype) -> np.ndarray:
    tiny = np.finfo(dtype).tiny
    mag = np.concatenate([np.geomspace(tiny, 40, 20000), np.linspace(0, 7, 20001),
                          [0.84375, 1.25, 1 / 0.35, 6.0, np.nextafter(6.0, 0)]])
    return np.concatenate([mag, -mag]).astype(dtype)


def test_float64_within_two_ulps_of_math_erf():
    x = _wide(np.float64)
    want = _oracle(x)
    ulps = np.abs(erf(x) - want) / np.spacing(np.maximum(np.abs(want), np.finfo(np.float64).tiny))
    assert ulps.max() <= 2


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_narrow_floats_within_one_ulp(dtype):
    x = _wide(dtype)
    want = _oracle(x).astype(dtype)
    got = erf(x)
    assert got.dtype == dtype
    ulps = np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(want).astype(dtype)).astype(
        np.float64).clip(np.finfo(dtype).tiny)
    assert ulps.max() <= 1


def test_special_values_shapes_and_strides():
    got = erf(np.array([np.inf, -np.inf, np.nan, 0.0, -0.0]))
    assert got[0] == 1 and got[1] == -1 and np.isnan(got[2])
    assert got[3] == 0 and np.signbit(got[4])
    assert erf(np.zeros((0, 3), np.float32)).shape == (0, 3)
    assert erf(np.float32(0.5)).dtype == np.float32
    rng = np.random.default_rng(0)
    x = rng.standard_normal((70, 1100)).astype(np.float32)[:, ::3]  # > one block, strided
    np.testing.assert_array_equal(erf(x), _oracle(x).astype(np.float32))


def test_the_erf_op_uses_it(isolated_registry):  # the reference kernel, not a plugin's
    x = np.linspace(-4, 4, 101, dtype=np.float32).reshape(1, 101)
    np.testing.assert_array_equal(Tensor.from_numpy(x).erf().numpy(), _oracle(x).astype(np.float32))
