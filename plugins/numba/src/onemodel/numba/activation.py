"""Elementwise functions numpy computes slowly or in several passes: Erf and exact Gelu with
libm's erf per element, and Softmax/LogSoftmax over the last axis in one pass per row."""

from __future__ import annotations

import math

import numpy as np

from numba import prange

from ._jit import jit, sync_threads

_SQRT1_2 = 1 / math.sqrt(2)


@jit(parallel=True)
def _erf(x, out):
    for q in prange(x.size):
        out[q] = math.erf(x[q])


@jit(parallel=True)
def _gelu(x, out):
    for q in prange(x.size):
        v = np.float64(x[q])
        out[q] = 0.5 * v * (1.0 + math.erf(v * _SQRT1_2))


@jit(parallel=True)
def _softmax(x, log, out):
    rows, width = x.shape
    for r in prange(rows):
        row = x[r]
        dst = out[r]
        top = -np.inf
        for q in range(width):
            if row[q] > top or row[q] != row[q]:
                top = row[q]
        total = 0.0
        for q in range(width):
            total += math.exp(row[q] - top)
        if log:
            shift = top + math.log(total)
            for q in range(width):
                dst[q] = row[q] - shift
        else:
            for q in range(width):
                dst[q] = math.exp(row[q] - top) / total


def _flat(X):
    X = np.ascontiguousarray(X)
    return X, X.reshape(-1)


def erf(X):
    sync_threads()
    X, flat = _flat(X)
    out = np.empty_like(X)
    _erf(flat, out.reshape(-1))
    return out


def gelu(X, *, approximate="none"):
    sync_threads()
    X, flat = _flat(X)
    out = np.empty_like(X)
    _gelu(flat, out.reshape(-1))
    return out


def _softmax_call(x, log):
    sync_threads()
    x = np.ascontiguousarray(x)
    width = x.shape[-1]
    out = np.empty_like(x)
    if x.size:
        _softmax(x.reshape(-1, width), log, out.reshape(-1, width))
    return out


def softmax(input, *, axis=-1):
    return _softmax_call(input, False)


def log_softmax(input, *, axis=-1):
    return _softmax_call(input, True)
