"""Matrix products: MatMul (numpy semantics, batched and 1-D) and Gemm."""

from __future__ import annotations

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
    if out.dtype.kind in _NATIVE_KINDS and out.dtype.isbuiltin:
        return np.matmul(a, b, out=out)
    out[...] = np.matmul(a, b)
    return out


@defop("MatMul", shape=_matmul_shape, grad=_matmul_grad, writes_out=True)
def matmul(A, B, *, out=None):
    if out is None:
        return np.matmul(A, B)
    return _product_into(A, B, out)


@specializer(matmul.kernel)
def _matmul_at(site: CallSite):
    """A dtype numpy multiplies natively: ``np.matmul`` straight into ``out`` (numpy checks
    the shapes itself)."""
    dtype = site.dtypes[0]
    if dtype is None or dtype.kind not in _NATIVE_KINDS or not dtype.isbuiltin:
        return None
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


@defop("Gemm", shape=_gemm_shape, grad=_gemm_grad, writes_out=True)
def gemm(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, out=None):
    a = A.T if transA else A
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

    def gemm_call(A, B, C=None, out=None):
        y = np.matmul(A.T if trans_a else A, B.T if trans_b else B, out=out)
        if scale is not None:
            y *= scale
        if C is not None:
            y += C if weight is None else C * weight
        return y
    return gemm_call
