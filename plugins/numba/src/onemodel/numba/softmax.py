"""Softmax and LogSoftmax (float32/float64) over one axis, one row at a time: the row's max,
its exponentials and their sum, and the scaling in three passes over a row that stays in
cache, with no temporaries (the reference makes five full-size passes and three arrays).

numba has no vector ``exp`` (no SVML here), and a scalar libm call per element is slower than
numpy's SIMD exp, so float32 rows use an exp written in plain arithmetic that vectorizes:
Cody-Waite range reduction, Cephes' degree-7 polynomial (relative error about 2e-7 on the
reduced range) and the power of two built from its exponent bits. Another axis than the last
is moved last by one copy and back by another."""

from __future__ import annotations

import math

import numpy as np

from numba import prange
from onemodel.tensors.ops.specialize import CallSite, specializer

from . import _jit
from ._jit import jit, sync_threads

# the kernels below compile _vecmath's exp_reduced into their own machine code, and numba's
# on-disk cache revalidates that code by this file's time stamp only: when it changes, this
# file must change too, or a cache filled before would keep the old arithmetic
from ._vecmath import _BIAS, _EXP_LOW, _FIELD, _ZERO, exp_reduced

F = np.float32
# the exp's reduction and polynomial are exp32's (_vecmath.exp_reduced); the kernels write
# 2**n as float32 bits into a scratch row, measured 25% faster on long rows than exp32
_LOWEST = _EXP_LOW  # log of the smallest normal float32: exp below it is taken as 0


@jit()
def _row_max(row):
    """The row's maximum, NaN ignored (the callers count NaN on their own). LLVM keeps a float
    max reduction scalar even under fast-math flags, so eight independent running maxima
    (unrolled by hand) hide the comparison's latency."""
    n = row.shape[0]
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = row[0]
    full = n - n % 8
    for q in range(0, full, 8):
        v = row[q]
        m0 = v if v > m0 else m0
        v = row[q + 1]
        m1 = v if v > m1 else m1
        v = row[q + 2]
        m2 = v if v > m2 else m2
        v = row[q + 3]
        m3 = v if v > m3 else m3
        v = row[q + 4]
        m4 = v if v > m4 else m4
        v = row[q + 5]
        m5 = v if v > m5 else m5
        v = row[q + 6]
        m6 = v if v > m6 else m6
        v = row[q + 7]
        m7 = v if v > m7 else m7
    for q in range(full, n):
        v = row[q]
        m0 = v if v > m0 else m0
    m0 = m1 if m1 > m0 else m0
    m2 = m3 if m3 > m2 else m2
    m4 = m5 if m5 > m4 else m4
    m6 = m7 if m7 > m6 else m6
    m0 = m2 if m2 > m0 else m0
    m4 = m6 if m6 > m4 else m4
    return m4 if m4 > m0 else m0


@jit(fastmath={"reassoc"})
def _scale_sum(dst, pw):
    """dst *= pw, returning the sum in float64 (a long float32 sum's rounding would show);
    reassociation lets the sum run in vector lanes."""
    total = 0.0
    for q in range(dst.shape[0]):
        e = dst[q] * pw[q]
        dst[q] = e
        total += e
    return total


@jit(fastmath={"reassoc"})
def _exp_sum(row, m, dst):
    """dst = exp(row - m) by libm, returning its float64 sum (lanes by reassociation)."""
    total = 0.0
    for q in range(row.shape[0]):
        e = math.exp(row[q] - m)
        dst[q] = e
        total += e
    return total


@jit(parallel=True)
def _softmax_f32(x, out, log):
    """out[r] = softmax(x[r]) (or log-softmax with ``log``) for float32 rows, in blocks of
    rows that share one scratch row."""
    rows, width = x.shape
    block = 16
    for b in prange((rows + block - 1) // block):
        pw = np.empty(width, np.float32)  # 2**n per element, written as float32 bits
        pw_bits = pw.view(np.int32)
        for r in range(b * block, min(rows, (b + 1) * block)):
            _softmax_row_f32(x[r], out[r], log, pw, pw_bits)


@jit()
def _softmax_row_f32(row, dst, log, pw, pw_bits):
    width = row.shape[0]
    m = _row_max(row)
    bad = 0
    for q in range(width):
        v = row[q]
        bad += v != v
    if bad or not (abs(m) < np.inf):  # NaN or an infinite max: every entry is NaN
        for q in range(width):
            dst[q] = np.nan
        return
    for q in range(width):
        v = row[q] - m
        low = v < _LOWEST
        v = _LOWEST if low else v
        n, p = exp_reduced(v)
        dst[q] = _ZERO if low else p
        pw_bits[q] = np.int32((n + _BIAS) * _FIELD)  # exact in float32 (see exp32)
    total = _scale_sum(dst, pw)
    if log:
        logs = F(math.log(total))
        for q in range(width):
            dst[q] = (row[q] - m) - logs
    else:
        inv = F(1.0 / total)
        for q in range(width):
            dst[q] *= inv


# rows at most this wide take the block kernel: measured 2.4-3.3x faster on rows of 5-32 and
# 1.35x at 64 (docs/benchmarks.md, "Sixth round"); wider rows fill the vectors on their own
SHORT_ROW = 64
_SHORT_BLOCK = 64  # rows per task of the block kernel
U = np.uint64


@jit(parallel=True)
def _softmax_short_f32(x, out, log):
    """Softmax of short float32 rows, a block of rows at a time: each row's maximum and its
    shift into ``out``, then the exp over the whole block in one flat pass (one long loop
    that vectorizes, where per row a 5- or 17-wide loop runs mostly in its scalar
    remainder), then each row's sum and scaling. ``log`` is not taken (the row kernel does
    LogSoftmax); it is here so both kernels are called alike."""
    rows, width = x.shape
    for b in prange((rows + _SHORT_BLOCK - 1) // _SHORT_BLOCK):
        r0 = b * _SHORT_BLOCK
        nr = min(rows, r0 + _SHORT_BLOCK) - r0
        n = nr * width
        xf = x[r0:r0 + nr].reshape(n)
        of = out[r0:r0 + nr].reshape(n)
        pw = np.empty(n, np.float32)  # 2**n per element, written as float32 bits
        pw_bits = pw.view(np.int32)
        bad = np.zeros(nr, np.bool_)
        for r in range(nr):
            base = r * width
            m = xf[U(base)]
            nan = 0
            for q in range(width):
                v = xf[U(base + q)]
                m = v if v > m else m
                nan += v != v
            bad[r] = nan > 0 or not (abs(m) < np.inf)  # the row is NaN, as in the row kernel
            for q in range(width):
                of[U(base + q)] = xf[U(base + q)] - m
        for k in range(n):
            v = of[U(k)]
            low = v < _LOWEST
            v = _LOWEST if low else v
            e, p = exp_reduced(v)
            of[U(k)] = _ZERO if low else p
            pw_bits[U(k)] = np.int32((e + _BIAS) * _FIELD)
        for k in range(n):
            of[U(k)] *= pw[U(k)]
        for r in range(nr):
            base = r * width
            if bad[r]:
                for q in range(width):
                    of[U(base + q)] = np.nan
                continue
            total = 0.0  # float64, as the row kernel's sum
            for q in range(width):
                total += of[U(base + q)]
            inv = F(1.0 / total)
            for q in range(width):
                of[U(base + q)] *= inv


def rows_kernel(dtype, width: int, log: bool):
    """The dual kernel for rows of ``width`` (softmax, or log-softmax with ``log``)."""
    if dtype != np.float32:
        return _softmax_f64
    return _softmax_short_f32 if width <= SHORT_ROW and not log else _softmax_f32


@jit(parallel=True)
def _softmax_f64(x, out, log):
    """The float64 rows: libm's exp per element, sums in float64."""
    rows, width = x.shape
    for r in prange(rows):
        row = x[r]
        dst = out[r]
        m = _row_max(row)
        bad = 0
        for q in range(width):
            v = row[q]
            bad += v != v
        if bad or not (abs(m) < np.inf):
            for q in range(width):
                dst[q] = np.nan
            continue
        total = _exp_sum(row, m, dst)
        if log:
            logs = math.log(total)
            for q in range(width):
                dst[q] = (row[q] - m) - logs
        else:
            inv = 1.0 / total
            for q in range(width):
                dst[q] *= inv


def _run(X, axis, log, out):
    sync_threads()
    nd = X.ndim
    a = axis + nd if axis < 0 else axis
    if a == nd - 1:  # the usual case: rows along the last axis, written straight into out
        if not X.flags.c_contiguous:
            X = np.ascontiguousarray(X)
        if out is None:
            out = np.empty(X.shape, X.dtype)
        dst = out
    else:
        X = np.ascontiguousarray(np.moveaxis(X, a, -1))
        dst = np.empty(X.shape, X.dtype)
    if dst.size:
        width = X.shape[-1]
        x2 = X.reshape(-1, width)
        kernel = rows_kernel(X.dtype, width, log)
        (kernel if _jit._parallel else kernel.serial)(x2, dst.reshape(-1, width), log)
    if dst is out:
        return out
    back = np.moveaxis(dst, -1, a)
    if out is None:
        return np.ascontiguousarray(back)
    out[...] = back
    return out


def softmax(input, *, axis=-1, out=None):
    """ONNX Softmax (opset 13 semantics: over one axis) for float32/float64, into ``out``
    when given."""
    return _run(input, axis, False, out)


def log_softmax(input, *, axis=-1, out=None):
    """ONNX LogSoftmax (opset 13 semantics: over one axis) for float32/float64, into ``out``
    when given."""
    return _run(input, axis, True, out)


def _rows_at(site: CallSite, log: bool):
    """Softmax (LogSoftmax) planned for its shape, over the last axis or one followed only
    by size-1 axes (the same rows in memory): a call checks its input and runs the row kernel
    straight into the output. Other axes keep the generic call (its copies dominate)."""
    shape, dtype = site.shapes[0], site.dtypes[0]
    if shape is None or not shape or 0 in shape or dtype not in (np.float32, np.float64):
        return None
    nd = len(shape)
    axis = site.attrs.get("axis", -1)
    if not -nd <= axis < nd or any(d != 1 for d in shape[axis % nd + 1:]):
        return None
    width = shape[axis % nd]
    flat = (math.prod(shape) // width, width)
    dtype = np.dtype(dtype)
    kernel = rows_kernel(dtype, width, log)
    generic = site.generic

    bound = [None]  # the serial kernel's machine code (_jit.entry), bound at the first call

    def softmax_at(input, out=None):
        if input.shape != shape or input.dtype != dtype or (out is not None and (
                out.shape != shape or out.dtype != dtype or not out.flags.carray)):
            return generic(input, out=out)
        sync_threads()
        if not input.flags.c_contiguous:
            input = np.ascontiguousarray(input)
        if out is None:
            out = np.empty(shape, dtype)
        x, y = input.reshape(flat), out.reshape(flat)
        if _jit._parallel:
            kernel(x, y, log)
        else:
            (bound[0] or _jit.bind(bound, kernel.serial, (x, y, log)))(x, y, log)
        return out
    return softmax_at


@specializer(softmax)
def _softmax_at(site: CallSite):
    """Softmax planned for its shape (see :func:`_rows_at`)."""
    return _rows_at(site, False)


@specializer(log_softmax)
def _log_softmax_at(site: CallSite):
    """LogSoftmax planned for its shape (see :func:`_rows_at`)."""
    return _rows_at(site, True)
