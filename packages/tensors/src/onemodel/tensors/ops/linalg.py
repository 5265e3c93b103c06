"""Matrix products: MatMul (numpy semantics, batched and 1-D) and Gemm."""

from __future__ import annotations

import math

import numpy as np

from ..dtype import FLOATING, NUMERIC
from ..errors import ShapeError
from ..symbolic import may_equal
from ._grad import call, unbroadcast
from .base import TensorSpec, broadcast_shapes, defop, same_dtype
from .specialize import CallSite, specializer


def _matmul_shape(specs):
    a, b = specs
    dt = same_dtype(specs, NUMERIC)
    sa, sb = a.shape, b.shape
    if not sa or not sb:
        raise ShapeError("MatMul inputs must have at least one axis")
    a2 = ((1,) + sa) if len(sa) == 1 else sa
    b2 = (sb + (1,)) if len(sb) == 1 else sb
    if not may_equal(a2[-1], b2[-2]):  # symbolic ones: checked when the plan binds sizes
        raise ShapeError(f"inner dimensions {a2[-1]} and {b2[-2]} differ")
    out = broadcast_shapes(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
    if len(sa) == 1:
        out = out[:-2] + out[-1:]
    if len(sb) == 1:
        out = out[:-1]
    return TensorSpec(out, dt)


def _matmul_grad(ctx, g):
    a, b = ctx.inputs
    a2 = a.reshape(1, -1) if a.ndim == 1 else a
    b2 = b.reshape(-1, 1) if b.ndim == 1 else b
    if a.ndim == 1:
        g = g.unsqueeze(-2)
    if b.ndim == 1:
        g = g.unsqueeze(-1)
    ga = unbroadcast(g @ b2.mT, a2.shape).reshape(*a.shape)
    gb = unbroadcast(a2.mT @ g, b2.shape).reshape(*b.shape)
    return ga, gb


# dtype kinds numpy's matmul computes natively, the same loop with or without out=
_NATIVE_KINDS = frozenset("fiu")


def _product_into(a, b, out):
    """``a @ b`` written into ``out``; a dtype numpy does not multiply natively is computed as
    without out= and copied, so the result is the same either way."""
    try:
        if out.dtype.kind in _NATIVE_KINDS and out.dtype.isbuiltin:
            return np.matmul(a, b, out=out)
        out[...] = np.matmul(a, b)
    except ValueError as exc:  # numpy's words for a mismatch: name the shapes
        raise ShapeError(f"MatMul: out= of shape {list(out.shape)} cannot hold A "
                         f"{list(np.shape(a))} @ B {list(np.shape(b))} ({exc})") from exc
    return out


@defop("MatMul", shape=_matmul_shape, grad=_matmul_grad, writes_out=True)
def matmul(A, B, *, out=None):
    if out is None:
        return np.matmul(A, B)
    return _product_into(A, B, out)


# A product of 2-3 rows by a weight matrix this large runs as one matrix-vector product per
# row: OpenBLAS's sgemm packs all of B on every call, so on 2 rows of a (576, 1024) float32
# weight it took 254 us against 83 us for two sgemv calls (the CPU times of a paired
# measurement, docs/benchmarks.md, "Fifth round"); from 4 rows on, or with a weight that stays
# in cache (256 x 256: 4 us against 8), the one product wins.
_ROWWISE_MAX_ROWS = 3
_ROWWISE_MIN_BYTES = 1 << 20


def _rowwise(a_shape, b_shape, dtype, trans_b=False):
    """Whether ``a @ b`` (b: 2-D, read transposed with ``trans_b``) runs row by row."""
    if len(b_shape) != 2 or not a_shape or dtype.kind != "f" or trans_b:
        return False
    rows = math.prod(a_shape[:-1])
    return 2 <= rows <= _ROWWISE_MAX_ROWS and \
        b_shape[0] * b_shape[1] * dtype.itemsize >= _ROWWISE_MIN_BYTES


def _rows_into(a, b, out, rows):
    """``a @ b`` for ``rows`` rows of ``a``: one matrix-vector product per row into ``out``."""
    a2 = a.reshape(rows, a.shape[-1])
    o2 = out.reshape((rows, out.shape[-1]), copy=False)  # never write into a copy
    for i in range(rows):
        np.dot(a2[i], b, out=o2[i])
    return out


# the dtypes np.dot hands to BLAS: for them np.dot is np.matmul's product without the ufunc
# machinery's set-up (0.7 against 2.0 us on (2, 5, 32) @ (32, 32), docs/benchmarks.md)
_BLAS_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@specializer(matmul.kernel)
def _matmul_at(site: CallSite):
    """A dtype numpy multiplies natively: ``np.matmul`` straight into ``out`` (numpy checks
    the shapes itself), or row by row for 2-3 rows by a large 2-D weight."""
    dtype = site.dtypes[0]
    if dtype is None or dtype.kind not in _NATIVE_KINDS or not dtype.isbuiltin:
        return None
    a_shape, b_shape, out_shape = site.shapes[0], site.shapes[1], site.out_shapes[0]
    if _rowwise(a_shape, b_shape, dtype) and site.dtypes[1] == dtype:
        rows = math.prod(a_shape[:-1])

        def matmul_rows(A, B, out=None):
            if A.shape != a_shape or B.shape != b_shape or A.dtype != dtype or \
                    B.dtype != dtype or (out is not None and (
                        out.shape != out_shape or out.dtype != dtype or
                        not out.flags.carray)):  # np.dot writes only such an out (the 2-D
                return site.generic(A, B, out=out)  # view kept of one made read-only too)
            return _rows_into(A, B, np.empty(out_shape, dtype) if out is None else out, rows)
        return matmul_rows
    if dtype in _BLAS_DTYPES and site.dtypes[1] == dtype and len(b_shape) == 2 and \
            len(a_shape) >= 2:
        # the rows of A (its leading axes together) by a 2-D B: one np.dot on 2-D views
        flat = len(a_shape) > 2
        a2 = (math.prod(a_shape[:-1]), a_shape[-1])
        o2 = (a2[0], b_shape[1])
        last = [(None, None)]  # (a given out, its 2-D view): a plan hands the same buffer

        def matmul_dot(A, B, out=None):
            if A.shape != a_shape or B.shape != b_shape or A.dtype != dtype or \
                    B.dtype != dtype or (out is not None and (
                        out.shape != out_shape or out.dtype != dtype or
                        not out.flags.carray)):  # np.dot writes only such an out (the 2-D
                return site.generic(A, B, out=out)  # view kept of one made read-only too)
            if out is None:
                out = np.empty(out_shape, dtype)
                if flat:
                    np.dot(A.reshape(a2), B, out=out.reshape(o2))
                else:
                    np.dot(A, B, out=out)
                return out
            if flat:
                given, view = last[0]  # one tuple: read and written whole, so threads agree
                if given is not out:
                    view = out.reshape(o2, copy=False)  # never write into a copy
                    last[0] = (out, view)
                np.dot(A.reshape(a2), B, out=view)
            else:
                np.dot(A, B, out=out)
            return out
        return matmul_dot
    return lambda A, B, out=None: np.matmul(A, B, out=out)


def _gemm_shape(specs, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    a, b = specs[0], specs[1]
    dt = same_dtype(specs, FLOATING)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ShapeError("Gemm inputs A and B must be 2-D")
    m, k = a.shape[::-1] if transA else a.shape
    k2, n = b.shape[::-1] if transB else b.shape
    if not may_equal(k, k2):
        raise ShapeError(f"inner dimensions {k} and {k2} differ")
    if len(specs) > 2 and specs[2] is not None:
        broadcast_shapes(specs[2].shape, (m, n))
    return TensorSpec((m, n), dt)


def _gemm_grad(ctx, g):
    # Y = alpha * A' @ B' + beta * C with A' = A.T if transA, B' = B.T if transB. Each gradient
    # is one Gemm whose trans flags read the operands as they are stored, so it comes out
    # contiguous and costs a single op.
    a, b = ctx.inputs[0], ctx.inputs[1]
    c = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    alpha, beta = ctx.attrs["alpha"], ctx.attrs["beta"]
    ta, tb = ctx.attrs["transA"], ctx.attrs["transB"]
    ga = gb = gc = None
    if a.requires_grad:  # dA' = g @ B'^T
        if ta:  # dA = (g @ B'^T)^T = B' @ g^T
            ga = call("Gemm", b, g, alpha=alpha, transA=tb, transB=1)
        else:
            ga = call("Gemm", g, b, alpha=alpha, transB=1 - tb)
    if b.requires_grad:  # dB' = A'^T @ g
        if tb:  # dB = g^T @ A'
            gb = call("Gemm", g, a, alpha=alpha, transA=1, transB=ta)
        else:
            gb = call("Gemm", a, g, alpha=alpha, transA=1 - ta)
    if c is not None and c.requires_grad:
        gs = g * beta if beta != 1.0 else g
        if c.ndim == 1 and c.shape[0] == g.shape[1] != 1:
            gc = gs.sum(axis=0)  # the usual bias: one reduction
        else:
            gc = unbroadcast(gs, c.shape)
    return ga, gb, gc


# float32 A @ B.T (a Linear layer's forward: B is the (out, in) weight) with few rows against
# many columns runs faster in OpenBLAS as (B @ A.T).T, copied back: 64x784 by 256x784 389 ->
# 289 us, 16x128 by 128x128 13.8 -> 9.0, 8x512 by 1000x512 431 -> 205; not with as many rows as
# columns (256x256 by 256x256 354 -> 441), under 8 rows, or in float64 (1.03-1.19x slower)
_WIDE_MIN_ROWS = 8
_WIDE_RATIO = 4


def _wide_transposed(a, b_t) -> bool:
    """Whether ``a @ b_t.T`` is computed as ``(b_t @ a.T).T`` (see above)."""
    return a.dtype == np.float32 and b_t.dtype == np.float32 and a.ndim == 2 and \
        b_t.ndim == 2 and a.shape[0] >= _WIDE_MIN_ROWS and \
        _WIDE_RATIO * a.shape[0] <= b_t.shape[0]


@defop("Gemm", shape=_gemm_shape, grad=_gemm_grad, writes_out=True)
def gemm(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, out=None):
    a = A.T if transA else A
    if transB and out is None and _wide_transposed(a, B):
        y = np.ascontiguousarray(np.dot(B, a.T).T)
    else:
        b = B.T if transB else B
        y = a @ b if out is None else _product_into(a, b, out)
    if alpha != 1.0:
        y *= np.asarray(alpha, y.dtype)
    if C is not None:
        y += C * np.asarray(beta, y.dtype) if beta != 1.0 else C
    return y


@specializer(gemm.kernel)
def _gemm_at(site: CallSite):
    """A dtype numpy multiplies natively: the transposes, scalings and bias as the generic
    kernel does them, decided once (numpy checks the shapes itself)."""
    dtype = site.dtypes[0]
    if dtype is None or dtype.kind not in _NATIVE_KINDS or not dtype.isbuiltin:
        return None
    trans_a, trans_b = site.attrs.get("transA", 0), site.attrs.get("transB", 0)
    alpha, beta = site.attrs.get("alpha", 1.0), site.attrs.get("beta", 1.0)
    scale = None if alpha == 1.0 else np.asarray(alpha, dtype)
    weight = None if beta == 1.0 else np.asarray(beta, dtype)
    a_shape, b_shape, out_shape = site.shapes[0], site.shapes[1], site.out_shapes[0]
    rowwise = not trans_a and _rowwise(a_shape, b_shape, dtype, trans_b) and \
        site.dtypes[1] == dtype
    product = np.dot if dtype in _BLAS_DTYPES and site.dtypes[1] == dtype else np.matmul

    def gemm_call(A, B, C=None, out=None):
        if rowwise and A.shape == a_shape and B.shape == b_shape and A.dtype == dtype and \
                B.dtype == dtype:
            y = _rows_into(A, B, np.empty(out_shape, dtype) if out is None else out,
                           a_shape[0])
        else:
            y = product(A.T if trans_a else A, B.T if trans_b else B, out=out)
        if scale is not None:
            y *= scale
        if C is not None:
            y += C if weight is None else C * weight
        return y
    return gemm_call
