"""Winograd F(2x2, 3x3) for stride-1, undilated 3x3 convolutions with constant weights: each
2x2 block of outputs from a 4x4 tile of the input in 16 products instead of 36 (Lavin and
Gray, "Fast Algorithms for Convolutional Neural Networks", 2016). The input's tiles are
transformed by numba into V (16, C, tiles), the weights once at plan time into U (16, M, C),
the 16 products U[i] @ V[i] are one batched BLAS call, and numba transforms the results back
into NCHW with bias and activation. Relative error 3-7e-7 against the direct sum in float32.

Chosen by :func:`fits` where it measured faster than the columns and one GEMM, on one
thread: 32 or more channels in and out, planes of 64 to 4096 outputs (8x8 to 64x64); 16 or
more channels over planes of 576 to 4096 outputs. Against
that path: 0.53-0.76x (1x128x14x14 -> 128 0.67 -> 0.36 ms, 1x64x56x56 -> 64 2.67 -> 1.68 ms,
1x128x28x28 -> 128 2.64 -> 1.72 ms, 2x64x16x16 -> 64 0.43 -> 0.28 ms); 7x7 planes lose
(products of 16 columns, 1.09x), 112x112 ones are even (0.77-1.08x); docs/benchmarks.md,
"Tenth round". The weights must be constants nothing can change in place
(``conv._immutable``): they are transformed once."""

from __future__ import annotations

import numpy as np

from numba import prange

from ._jit import jit

# _output compiles conv._activate_in_place into its own machine code; numba would keep that
# code cached after a change to conv.py alone, so the package's cache is dropped whenever
# any of its sources change (_cache.py)
from .conv import _PLANES_PER_TASK, U, _activate_in_place

MIN_CHANNELS = 32
MIN_PLANE = 64
MAX_PLANE = 4096
# 16-31 channels in or out: Winograd only over planes of 576 outputs (24x24) or more, where
# it measured 0.67-0.83x the columns and GEMM (benchmarks/planned_calls.py: 1x16x54x54 -> 64,
# SqueezeNet's first fire modules at 224x224); over 8x8 to 16x16 planes it lost (1.06-1.43x
# in scratch timings)
MIN_NARROW_CHANNELS = 16
MIN_NARROW_PLANE = 576
_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])


def fits(plan, xshape, wshape, group) -> bool:
    """Whether a convolution of this plan goes by Winograd (given constant weights)."""
    _path, (_n, m, oh, ow), s, _pb, d, k, _chunk = plan
    if group != 1 or k != (3, 3) or s != (1, 1) or d != (1, 1) or oh * ow > MAX_PLANE:
        return False
    if xshape[1] >= MIN_CHANNELS and m >= MIN_CHANNELS:
        return oh * ow >= MIN_PLANE
    return min(xshape[1], m) >= MIN_NARROW_CHANNELS and oh * ow >= MIN_NARROW_PLANE


def weights(w: np.ndarray) -> np.ndarray:
    """U (16, M, C) = G w G^T for every (output, input) channel pair, in w's dtype: one GEMM,
    kron(G, G) (16, 9) times the flat 3x3 windows, whose result is U's layout already (at
    plan time: an einsum took 46 ms for ResNet-50's 512 x 512 weights, this takes 5 ms)."""
    g = _G.astype(w.dtype)
    m, c = w.shape[:2]
    return np.dot(np.kron(g, g), w.reshape(m * c, 9).T).reshape(16, m, c)


@jit(parallel=True)
def _input(x, pt, pl, th, tw, vf, s):
    """V[4i + j, c, tile] = (B^T d B)[i, j] (flat ``vf``, the 16 parts ``s`` apart) for the
    4x4 input tile d of every 2x2 output block (zero outside the image). Each plane is first
    split into the even and odd columns of its zero-padded plane, so a tile's four columns
    are runs that are contiguous along the tiles and the loop over a row of tiles
    vectorizes."""
    n, c, h, w = x.shape
    tiles = n * th * tw
    hp = 2 * th + 2
    we = tw + 1
    xf = x.reshape(x.size)
    planes = n * c
    for task in prange((planes + _PLANES_PER_TASK - 1) // _PLANES_PER_TASK):
        # padding positions are never written: they stay zero for every plane
        ev = np.zeros(hp * we, x.dtype)
        od = np.zeros(hp * we, x.dtype)
        for p in range(task * _PLANES_PER_TASK, min(planes, (task + 1) * _PLANES_PER_TASK)):
            img = p // c
            ch = p - img * c
            src = p * h * w
            for a in range(min(h, hp - pt)):
                r = (a + pt) * we
                s0 = src + a * w
                for b in range(min(w, 2 * we - pl)):
                    col = b + pl
                    if col % 2 == 0:
                        ev[U(r + col // 2)] = xf[U(s0 + b)]
                    else:
                        od[U(r + col // 2)] = xf[U(s0 + b)]
            base = ch * tiles + img * th * tw
            for ty in range(th):
                r0 = 2 * ty * we
                r1 = r0 + we
                r2 = r1 + we
                r3 = r2 + we
                o = base + ty * tw
                for tx in range(tw):
                    d00 = ev[U(r0 + tx)]
                    d01 = od[U(r0 + tx)]
                    d02 = ev[U(r0 + tx + 1)]
                    d03 = od[U(r0 + tx + 1)]
                    d10 = ev[U(r1 + tx)]
                    d11 = od[U(r1 + tx)]
                    d12 = ev[U(r1 + tx + 1)]
                    d13 = od[U(r1 + tx + 1)]
                    d20 = ev[U(r2 + tx)]
                    d21 = od[U(r2 + tx)]
                    d22 = ev[U(r2 + tx + 1)]
                    d23 = od[U(r2 + tx + 1)]
                    d30 = ev[U(r3 + tx)]
                    d31 = od[U(r3 + tx)]
                    d32 = ev[U(r3 + tx + 1)]
                    d33 = od[U(r3 + tx + 1)]
                    t00 = d00 - d20
                    t01 = d01 - d21
                    t02 = d02 - d22
                    t03 = d03 - d23
                    t10 = d10 + d20
                    t11 = d11 + d21
                    t12 = d12 + d22
                    t13 = d13 + d23
                    t20 = d20 - d10
                    t21 = d21 - d11
                    t22 = d22 - d12
                    t23 = d23 - d13
                    t30 = d10 - d30
                    t31 = d11 - d31
                    t32 = d12 - d32
                    t33 = d13 - d33
                    k = o + tx
                    vf[U(k)] = t00 - t02
                    vf[U(k + s)] = t01 + t02
                    vf[U(k + 2 * s)] = t02 - t01
                    vf[U(k + 3 * s)] = t01 - t03
                    vf[U(k + 4 * s)] = t10 - t12
                    vf[U(k + 5 * s)] = t11 + t12
                    vf[U(k + 6 * s)] = t12 - t11
                    vf[U(k + 7 * s)] = t11 - t13
                    vf[U(k + 8 * s)] = t20 - t22
                    vf[U(k + 9 * s)] = t21 + t22
                    vf[U(k + 10 * s)] = t22 - t21
                    vf[U(k + 11 * s)] = t21 - t23
                    vf[U(k + 12 * s)] = t30 - t32
                    vf[U(k + 13 * s)] = t31 + t32
                    vf[U(k + 14 * s)] = t32 - t31
                    vf[U(k + 15 * s)] = t31 - t33


@jit(parallel=True)
def _output(mf, s, bias, has_bias, act, th, tw, y):
    """y's 2x2 output blocks = A^T M A (+ bias, activation) from the 16 products M (flat
    ``mf``, each (M, tiles), ``s`` apart): a row of blocks into four scratch rows (the
    block's corners, vectorized along the tiles), then interleaved into the output's two
    rows (the last column and row dropped where the output's size is odd)."""
    n, m_out, oh, ow = y.shape
    tiles = n * th * tw
    yf = y.reshape(y.size)
    zero = np.zeros(1, y.dtype)[0]
    planes = n * m_out
    for task in prange((planes + _PLANES_PER_TASK - 1) // _PLANES_PER_TASK):
        q = np.empty(4 * tw, y.dtype)
        for p in range(task * _PLANES_PER_TASK, min(planes, (task + 1) * _PLANES_PER_TASK)):
            img = p // m_out
            mo = p - img * m_out
            b = bias[mo] if has_bias else zero
            dst = p * oh * ow
            for ty in range(th):
                k0 = mo * tiles + img * th * tw + ty * tw
                for tx in range(tw):
                    k = k0 + tx
                    a0 = mf[U(k)] + mf[U(k + 4 * s)] + mf[U(k + 8 * s)]
                    a1 = mf[U(k + s)] + mf[U(k + 5 * s)] + mf[U(k + 9 * s)]
                    a2 = mf[U(k + 2 * s)] + mf[U(k + 6 * s)] + mf[U(k + 10 * s)]
                    a3 = mf[U(k + 3 * s)] + mf[U(k + 7 * s)] + mf[U(k + 11 * s)]
                    b0 = mf[U(k + 4 * s)] - mf[U(k + 8 * s)] - mf[U(k + 12 * s)]
                    b1 = mf[U(k + 5 * s)] - mf[U(k + 9 * s)] - mf[U(k + 13 * s)]
                    b2 = mf[U(k + 6 * s)] - mf[U(k + 10 * s)] - mf[U(k + 14 * s)]
                    b3 = mf[U(k + 7 * s)] - mf[U(k + 11 * s)] - mf[U(k + 15 * s)]
                    q[U(tx)] = a0 + a1 + a2 + b
                    q[U(tw + tx)] = a1 - a2 - a3 + b
                    q[U(2 * tw + tx)] = b0 + b1 + b2 + b
                    q[U(3 * tw + tx)] = b1 - b2 - b3 + b
                r = dst + 2 * ty * ow
                for j in range(ow):
                    yf[U(r + j)] = q[U((j % 2) * tw + j // 2)]
                _activate_in_place(yf, r, ow, act, zero)
                if 2 * ty + 1 < oh:
                    r += ow
                    for j in range(ow):
                        yf[U(r + j)] = q[U((2 + j % 2) * tw + j // 2)]
                    _activate_in_place(yf, r, ow, act, zero)


def _stride(count: int) -> int:
    """A stride of at least ``count`` elements between the 16 parts of V and M that is never
    a multiple of 4 KiB: parts a power of two apart (16x16 planes of 64 channels: 16 KiB)
    fall in the same cache sets, which measured 1.3-1.9x slower than the GEMM path."""
    return (count // 32 + 1) * 32 + 16


def run(X, u, bias, has_bias, act, plan, y, pick):
    """The convolution of C-contiguous X with the transformed weights ``u`` into ``y``."""
    n, c = X.shape[0], X.shape[1]
    m, oh, ow = plan[1][1], plan[1][2], plan[1][3]
    pb = plan[3]
    th, tw = (oh + 1) // 2, (ow + 1) // 2
    tiles = n * th * tw
    sv, sm = _stride(c * tiles), _stride(m * tiles)
    v = np.empty(16 * sv, X.dtype)
    pick(_input)(X, pb[0], pb[1], th, tw, v, sv)
    products = np.empty(16 * sm, X.dtype)
    np.matmul(u, v.reshape(16, sv)[:, :c * tiles].reshape(16, c, tiles),
              out=products.reshape(16, sm)[:, :m * tiles].reshape(16, m, tiles))
    pick(_output)(products, sm, bias, has_bias, act, th, tw, y)
    return y
