"""Products of two float32 operands as they are stored, each packed a panel at a time on the
fly: Y (M, N) = A @ B (+ a bias row), A and B read through their strides, so a transposed
operand costs no copy of its own. The eager Gemm takes them: a training step's weights change
every step, so :mod:`.panels`' packing once at plan time does not apply.

Why: OpenBLAS ran a Linear layer's products slower than PyTorch's own at one thread (the MLP
784-256-256-10 at batch 64: 694 against 536 us a step, ``x @ W.T`` of 64 x 784 by 256 x 784
270 against 188 us). Here each panel of 32 columns of B is copied (or, for ``B = W.T``,
transposed by 8x8 register blocks) into a contiguous K x 32 buffer that stays in L1 and L2,
and the register tiles of :func:`.panels.product16` run over it: eight rows by two vectors,
sixteen sums in flight, then single rows. Sixteen-lane (AVX-512) CPUs only; elsewhere BLAS."""

from __future__ import annotations

import numpy as np

from ._jit import jit
from ._simd import (
    add16,
    fma16,
    load16,
    load16_masked,
    splat16,
    store16,
    transpose8x8,
)
from .conv import U
from .conv_rows import _store_pair

WIDTH = 32  # columns per panel: two vectors of sixteen
K_BLOCK = 256  # K per pass: 32 KiB of a panel, in L1 while every row tile passes over it


@jit()
def _pack_panel(bf, sbk, sbn, col, width, k, bp):
    """bp[q * WIDTH + c] = B[q, col + c] for q < k, c < width (B[q, n] at bf[q * sbk + n *
    sbn]); columns from ``width`` to WIDTH are zero. Rows of B contiguous (``sbn == 1``):
    copied a row at a time; columns contiguous (``sbk == 1``, B a transposed (N, K) matrix):
    transposed in 8x8 blocks; other strides: element by element."""
    zero = np.float32(0)
    if sbn == 1:
        for q in range(k):
            o = q * sbk + col
            store16(bp, U(q * WIDTH), load16_masked(bf, o, 0, width, zero))
            store16(bp, U(q * WIDTH + 16), load16_masked(bf, o + 16, 0, width - 16, zero))
        return
    q8 = 0
    if sbk == 1:
        q8 = k // 8 * 8
        c8 = width // 8 * 8
        for q in range(0, q8, 8):
            for c in range(0, c8, 8):
                transpose8x8(bf, (col + c) * sbn + q, sbn, bp, q * WIDTH + c, WIDTH)
            for c in range(c8, WIDTH):
                for t in range(8):
                    bp[U((q + t) * WIDTH + c)] = bf[U((col + c) * sbn + q + t)] \
                        if c < width else zero
    for q in range(q8, k):
        for c in range(WIDTH):
            bp[U(q * WIDTH + c)] = bf[U(q * sbk + (col + c) * sbn)] if c < width else zero


@jit()
def _rows_of(af, sam, sak, m, k, at):
    """at[i * k + q] = A[i, q] (A[i, q] at ``af[i * sam + q * sak]``) for i < m, q < k: a
    transposed A (``sam == 1``) in 8x8 blocks, the edges element by element."""
    m8 = m // 8 * 8 if sam == 1 else 0
    k8 = k // 8 * 8 if sam == 1 else 0
    for q in range(0, k8, 8):
        for i in range(0, m8, 8):
            transpose8x8(af, q * sak + i, sak, at, i * k + q, k)
    for i in range(m):
        for q in range(k8 if i < m8 else 0, k):
            at[U(i * k + q)] = af[U(i * sam + q * sak)]


@jit()
def _put_columns(yf, ts, i, rows, col, width, m):
    """The tile ``ts`` (``rows`` rows of :data:`WIDTH` sums: rows i.., columns col..) into
    ``yf`` transposed, (n, m) in C order: eight rows by eight columns at a time by 8x8
    transposes, the rest element by element."""
    c8 = width // 8 * 8 if rows == 8 else 0
    for c0 in range(0, c8, 8):
        transpose8x8(ts, c0, WIDTH, yf, (col + c0) * m + i, m)
    for r in range(rows):
        for t in range(c8, width):
            yf[U((col + t) * m + i + r)] = ts[U(r * WIDTH + t)]


@jit()
def product16(af, sam, sak, bf, sbk, sbn, m, n, k, yf, c, has_bias, transposed):
    """yf (m, n, C order) = A @ B (+ ``c``, an (n,) row, where ``has_bias``): A[i, q] at
    ``af[i * sam + q * sak]``, B[q, j] at ``bf[q * sbk + j * sbn]``, every array 1-D float32.
    Per panel of :data:`WIDTH` columns, K in even blocks of at most :data:`K_BLOCK` (784: four
    of 196, not three of 256 and one of 16); the sums wait in
    ``acc`` between blocks and go to ``yf`` after the last. With ``transposed``, yf is (n, m)
    = (A @ B).T, and ``c`` an (m,) column: ``x @ W.T`` for few rows x is computed as ``W @
    x.T``, so the panels pack x (64 x 784 by 256 x 784: 50K elements, not 200K) and W is read
    as rows."""
    zero = np.float32(0)
    ts = np.empty(8 * WIDTH, np.float32)  # a tile on its way to a transposed yf
    if sak != 1 and m >= 8:  # A's rows apart (a weight's gradient, g.T @ x): made rows first
        at = np.empty(m * k, np.float32)
        _rows_of(af, sam, sak, m, k, at)
        af, sam, sak = at, k, 1
    bp = np.empty(k * WIDTH, np.float32)
    blocks = (k + K_BLOCK - 1) // K_BLOCK
    kb = (k + blocks - 1) // max(blocks, 1)
    acc = np.empty(m * WIDTH if blocks > 1 else WIDTH, np.float32)
    for col in range(0, n, WIDTH):
        width = min(WIDTH, n - col)
        _pack_panel(bf, sbk, sbn, col, width, k, bp)
        z0 = splat16(zero)
        z1 = z0
        if has_bias and not transposed:
            z0 = load16_masked(c, col, 0, width, zero)
            z1 = load16_masked(c, col + 16, 0, width - 16, zero)
        for k0 in range(0, k, kb):
            k1 = min(k, k0 + kb)
            first = k0 == 0
            last = k1 == k
            i = 0
            while i + 8 <= m:  # eight rows by two vectors: sixteen sums in flight
                r0 = i * WIDTH
                e00, e01, e10, e11 = z0, z1, z0, z1
                e20, e21, e30, e31 = z0, z1, z0, z1
                e40, e41, e50, e51 = z0, z1, z0, z1
                e60, e61, e70, e71 = z0, z1, z0, z1
                if first and has_bias and transposed:  # a bias per row
                    e00 = splat16(c[U(i)])
                    e10 = splat16(c[U(i + 1)])
                    e20 = splat16(c[U(i + 2)])
                    e30 = splat16(c[U(i + 3)])
                    e40 = splat16(c[U(i + 4)])
                    e50 = splat16(c[U(i + 5)])
                    e60 = splat16(c[U(i + 6)])
                    e70 = splat16(c[U(i + 7)])
                    e01, e11, e21, e31, e41, e51, e61, e71 = e00, e10, e20, e30, e40, e50, e60, e70
                if not first:  # the sums so far
                    e00 = load16(acc, U(r0 + 0))
                    e01 = load16(acc, U(r0 + 16))
                    e10 = load16(acc, U(r0 + 32))
                    e11 = load16(acc, U(r0 + 48))
                    e20 = load16(acc, U(r0 + 64))
                    e21 = load16(acc, U(r0 + 80))
                    e30 = load16(acc, U(r0 + 96))
                    e31 = load16(acc, U(r0 + 112))
                    e40 = load16(acc, U(r0 + 128))
                    e41 = load16(acc, U(r0 + 144))
                    e50 = load16(acc, U(r0 + 160))
                    e51 = load16(acc, U(r0 + 176))
                    e60 = load16(acc, U(r0 + 192))
                    e61 = load16(acc, U(r0 + 208))
                    e70 = load16(acc, U(r0 + 224))
                    e71 = load16(acc, U(r0 + 240))
                a0 = i * sam
                a1, a2, a3 = a0 + sam, a0 + 2 * sam, a0 + 3 * sam
                a4, a5, a6, a7 = a0 + 4 * sam, a0 + 5 * sam, a0 + 6 * sam, a0 + 7 * sam
                for q in range(k0, k1):
                    bo = q * WIDTH
                    aq = q * sak
                    b0 = load16(bp, U(bo))
                    b1 = load16(bp, U(bo + 16))
                    s = splat16(af[U(a0 + aq)])
                    e00 = fma16(s, b0, e00)
                    e01 = fma16(s, b1, e01)
                    s = splat16(af[U(a1 + aq)])
                    e10 = fma16(s, b0, e10)
                    e11 = fma16(s, b1, e11)
                    s = splat16(af[U(a2 + aq)])
                    e20 = fma16(s, b0, e20)
                    e21 = fma16(s, b1, e21)
                    s = splat16(af[U(a3 + aq)])
                    e30 = fma16(s, b0, e30)
                    e31 = fma16(s, b1, e31)
                    s = splat16(af[U(a4 + aq)])
                    e40 = fma16(s, b0, e40)
                    e41 = fma16(s, b1, e41)
                    s = splat16(af[U(a5 + aq)])
                    e50 = fma16(s, b0, e50)
                    e51 = fma16(s, b1, e51)
                    s = splat16(af[U(a6 + aq)])
                    e60 = fma16(s, b0, e60)
                    e61 = fma16(s, b1, e61)
                    s = splat16(af[U(a7 + aq)])
                    e70 = fma16(s, b0, e70)
                    e71 = fma16(s, b1, e71)
                if last and transposed:
                    store16(ts, U(0), e00)
                    store16(ts, U(16), e01)
                    store16(ts, U(32), e10)
                    store16(ts, U(48), e11)
                    store16(ts, U(64), e20)
                    store16(ts, U(80), e21)
                    store16(ts, U(96), e30)
                    store16(ts, U(112), e31)
                    store16(ts, U(128), e40)
                    store16(ts, U(144), e41)
                    store16(ts, U(160), e50)
                    store16(ts, U(176), e51)
                    store16(ts, U(192), e60)
                    store16(ts, U(208), e61)
                    store16(ts, U(224), e70)
                    store16(ts, U(240), e71)
                    _put_columns(yf, ts, i, 8, col, width, m)
                elif last:
                    o = i * n + col
                    _store_pair(yf, o, width, e00, e01)
                    _store_pair(yf, o + n, width, e10, e11)
                    _store_pair(yf, o + 2 * n, width, e20, e21)
                    _store_pair(yf, o + 3 * n, width, e30, e31)
                    _store_pair(yf, o + 4 * n, width, e40, e41)
                    _store_pair(yf, o + 5 * n, width, e50, e51)
                    _store_pair(yf, o + 6 * n, width, e60, e61)
                    _store_pair(yf, o + 7 * n, width, e70, e71)
                else:
                    store16(acc, U(r0 + 0), e00)
                    store16(acc, U(r0 + 16), e01)
                    store16(acc, U(r0 + 32), e10)
                    store16(acc, U(r0 + 48), e11)
                    store16(acc, U(r0 + 64), e20)
                    store16(acc, U(r0 + 80), e21)
                    store16(acc, U(r0 + 96), e30)
                    store16(acc, U(r0 + 112), e31)
                    store16(acc, U(r0 + 128), e40)
                    store16(acc, U(r0 + 144), e41)
                    store16(acc, U(r0 + 160), e50)
                    store16(acc, U(r0 + 176), e51)
                    store16(acc, U(r0 + 192), e60)
                    store16(acc, U(r0 + 208), e61)
                    store16(acc, U(r0 + 224), e70)
                    store16(acc, U(r0 + 240), e71)
                i += 8
            while i < m:  # the last M % 8 rows, one at a time: two k a step, two sets of sums
                r0 = i * WIDTH
                c00, c01 = z0, z1
                if first and has_bias and transposed:
                    c00 = splat16(c[U(i)])
                    c01 = c00
                if not first:
                    c00 = load16(acc, U(r0))
                    c01 = load16(acc, U(r0 + 16))
                d00 = splat16(zero)
                d01 = d00
                a0 = i * sam
                q = k0
                while q + 2 <= k1:
                    bo = q * WIDTH
                    s = splat16(af[U(a0 + q * sak)])
                    c00 = fma16(s, load16(bp, U(bo)), c00)
                    c01 = fma16(s, load16(bp, U(bo + 16)), c01)
                    s = splat16(af[U(a0 + (q + 1) * sak)])
                    d00 = fma16(s, load16(bp, U(bo + 32)), d00)
                    d01 = fma16(s, load16(bp, U(bo + 48)), d01)
                    q += 2
                if q < k1:
                    bo = q * WIDTH
                    s = splat16(af[U(a0 + q * sak)])
                    c00 = fma16(s, load16(bp, U(bo)), c00)
                    c01 = fma16(s, load16(bp, U(bo + 16)), c01)
                c00 = add16(c00, d00)
                c01 = add16(c01, d01)
                if last and transposed:
                    store16(ts, U(0), c00)
                    store16(ts, U(16), c01)
                    _put_columns(yf, ts, i, 1, col, width, m)
                elif last:
                    _store_pair(yf, i * n + col, width, c00, c01)
                else:
                    store16(acc, U(r0), c00)
                    store16(acc, U(r0 + 16), c01)
                i += 1
