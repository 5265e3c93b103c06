"""Elementwise functions numpy computes slowly or in several passes: Erf and exact Gelu in one
pass, float64 with libm's erf per element, float32 with the vectorizing ``_vecmath.erf32``; and
Relu's gradient in one pass (numpy: a mask, its cast and a multiply, two temporaries)."""

from __future__ import annotations

import math

import numpy as np

from numba import prange

from ._jit import jit, sync_threads

# the kernels below compile _vecmath's erf32 and erfc32_pos into their own machine code, and
# numba's on-disk cache revalidates that code by this file's time stamp only: when those
# functions change (fma polynomial steps came in the fourteenth round), this file must change
# too, or a cache filled before would keep the old arithmetic (the same values to a few ulp)
from ._vecmath import erf32, erfc32_pos

_SQRT1_2 = 1 / math.sqrt(2)
_SQRT1_2_F32 = np.float32(_SQRT1_2)
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)


@jit(parallel=True)
def _erf(x, out):
    for q in prange(x.size):
        out[q] = math.erf(x[q])


@jit(parallel=True)
def _erf_f32(x, out):
    for q in prange(x.size):
        out[q] = erf32(x[q])


@jit(parallel=True)
def _gelu_f32(x, out):
    """Below -1, 1 + erf(v/sqrt(2)) cancels (a few ulp of erf near -1 became a 14x error at
    -5.6), so the tail is 0.5 * v * erfc(-v/sqrt(2)) with a relative-error erfc."""
    for q in prange(x.size):
        v = x[q]
        main = _HALF * v * (_ONE + erf32(v * _SQRT1_2_F32))
        tail = _HALF * v * erfc32_pos(-v * _SQRT1_2_F32)
        out[q] = tail if v < -_ONE else main


@jit(parallel=True)
def _gelu(x, out):
    for q in prange(x.size):
        v = np.float64(x[q])
        out[q] = 0.5 * v * (1.0 + math.erf(v * _SQRT1_2))


@jit(parallel=True)
def _relu_grad(y, dy, out):
    """out = dy * (y > 0), the reference's multiply by the 0/1 mask as a select: dy itself, or
    dy times zero (0, -0.0, or NaN for an infinite or NaN dy, as the multiply gives)."""
    zero = np.zeros(1, out.dtype)[0]
    for q in prange(y.size):
        g = dy[q]
        out[q] = g if y[q] > zero else g * zero


def _flat(X, out):
    if not X.flags.c_contiguous:
        X = np.ascontiguousarray(X)
    if out is None:
        out = np.empty(X.shape, X.dtype)
    return X.reshape(-1), out


def erf(X, *, out=None):
    sync_threads()
    flat, out = _flat(X, out)
    (_erf_f32 if flat.dtype == np.float32 else _erf)(flat, out.reshape(-1))
    return out


def gelu(X, *, approximate="none", out=None):
    sync_threads()
    flat, out = _flat(X, out)
    (_gelu_f32 if flat.dtype == np.float32 else _gelu)(flat, out.reshape(-1))
    return out


def relu_grad(Y, dY):
    """ReluGrad of float32/float64 Y and dY of one shape and dtype (see support.relu_grad)."""
    sync_threads()
    out = np.empty(dY.shape, dY.dtype)
    _relu_grad(np.ascontiguousarray(Y).reshape(-1), np.ascontiguousarray(dY).reshape(-1),
               out.reshape(-1))
    return out
