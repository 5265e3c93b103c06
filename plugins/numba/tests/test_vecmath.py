"""The float32 erf, tanh, exp and sigmoid of ``_vecmath`` (used by the fused and activation kernels) against
libm in float64, on a dense grid over their whole curved range, tiny and huge magnitudes, and
special values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numba import njit

from onemodel.numba._vecmath import erf32, exp32, sigmoid32, tanh32


@njit(error_model="numpy")
def _apply_erf(x, out):
    for i in range(x.size):
        out[i] = erf32(x[i])


@njit(error_model="numpy")
def _apply_tanh(x, out):
    for i in range(x.size):
        out[i] = tanh32(x[i])


def _grid() -> np.ndarray:
    mags = np.float32(10) ** np.linspace(-30, 2, 20001).astype(np.float32)
    return np.concatenate([np.linspace(-9, 9, 200001).astype(np.float32), mags, -mags,
                           np.array([0.0, -0.0, 4.0, -4.0, 7.9, -7.9, 1e30, -1e30], np.float32)])


@pytest.mark.parametrize("name", ["erf", "tanh"])
def test_float32_functions_match_libm(name):
    x = _grid()
    got = np.empty_like(x)
    (_apply_erf if name == "erf" else _apply_tanh)(x, got)
    fn = math.erf if name == "erf" else math.tanh
    want = np.array([fn(float(v)) for v in x])
    # a few float32 ulp: relative 5e-7 of the value, absolute below 1e-37 (denormal inputs)
    np.testing.assert_allclose(got, want, rtol=5e-7, atol=1e-37)
    assert np.array_equal(np.signbit(got[x == 0]), np.signbit(x[x == 0]))  # -0 stays -0


@pytest.mark.parametrize("apply", [_apply_erf, _apply_tanh], ids=["erf", "tanh"])
def test_special_values(apply):
    x = np.array([np.nan, np.inf, -np.inf], np.float32)
    got = np.empty_like(x)
    apply(x, got)
    assert np.isnan(got[0]) and got[1] == 1.0 and got[2] == -1.0


@njit(error_model="numpy")
def _apply_exp(x, out):
    for i in range(x.size):
        out[i] = exp32(x[i])


@njit(error_model="numpy")
def _apply_sigmoid(x, out):
    for i in range(x.size):
        out[i] = sigmoid32(x[i])


def test_exp_and_sigmoid_match_libm():
    """Relative 2e-7 wherever the result is a normal float32; exp's subnormal results are 0,
    results beyond float32's range inf, as at the edges (88.72 and -87.34) themselves. A
    sigmoid in float32's subnormal range is 0 (below -88.72, where exp(-x) overflows) or
    within two subnormal steps of the true value."""
    x = np.concatenate([np.linspace(-110, 100, 400001).astype(np.float32),
                        np.linspace(88.0, 88.8, 20001).astype(np.float32),
                        np.linspace(-88.0, -87.0, 20001).astype(np.float32)])
    got = np.empty_like(x)
    _apply_exp(x, got)
    want = np.exp(x.astype(np.float64))
    normal = (want >= np.finfo(np.float32).tiny) & (want <= np.finfo(np.float32).max)
    np.testing.assert_allclose(got[normal], want[normal], rtol=2e-7, atol=0)
    below = want < np.finfo(np.float32).tiny
    assert np.all((got[below] == 0) | (got[below] == np.finfo(np.float32).tiny))
    assert np.all(np.isposinf(got[want > np.finfo(np.float32).max]))
    _apply_sigmoid(x, got)
    want = 1 / (1 + np.exp(-x.astype(np.float64)))
    normal = want >= np.finfo(np.float32).tiny
    np.testing.assert_allclose(got[normal], want[normal], rtol=3e-7, atol=0)
    step = np.finfo(np.float32).smallest_subnormal
    tail = got[~normal]
    assert np.all((tail == 0) | (np.abs(tail - want[~normal]) <= 2 * step))
    assert np.all(tail[x[~normal] < -88.73] == 0) and np.any(tail != 0)


@pytest.mark.parametrize("apply, want", [(_apply_exp, [np.nan, np.inf, 0.0, 1.0]),
                                         (_apply_sigmoid, [np.nan, 1.0, 0.0, 0.5])],
                         ids=["exp", "sigmoid"])
def test_exp_and_sigmoid_special_values(apply, want):
    x = np.array([np.nan, np.inf, -np.inf, -0.0], np.float32)
    got = np.empty_like(x)
    apply(x, got)
    np.testing.assert_array_equal(got, np.array(want, np.float32))


def test_float32_gelu_keeps_its_relative_accuracy_in_the_negative_tail():
    """0.5 * x * (1 + erf(x / sqrt 2)) cancels below -1: a few ulp of erf near -1 became a 14x
    error at -5.6. The kernel takes erfc there; against float64 erfc it stays within 1e-4
    relative down to -13 (where the float32 result is still normal), and near the reference
    elsewhere."""
    from onemodel.numba.activation import gelu

    x = np.linspace(-13, 6, 40001).astype(np.float32)
    xd = x.astype(np.float64)
    want = 0.5 * xd * np.array([math.erfc(-v / math.sqrt(2)) for v in xd])
    got = gelu(x).astype(np.float64)
    tail = xd < -1
    assert np.max(np.abs(got - want)[tail] / np.abs(want[tail])) < 1e-4
    assert np.max(np.abs(got - want) / np.maximum(np.abs(want), 1.0)) < 1e-6
