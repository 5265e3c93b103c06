"""Products by constant weights packed once into panels of 24 columns, on register tiles
(:mod:`._simd`): Y (M, N) = A (M, K) B (K, N) for float32 MatMul by a file's weights.

Why: OpenBLAS packs B on every call and, on the real suite's transformer and ConvNeXt shapes
(a few dozen to a few thousand rows by 96-3072), ran at 15-50 GMAC/s on one thread; onnxruntime
packs its weights once at load. Here B is packed at plan time: each panel is its 24 columns
for every k, contiguous, so a tile's weights are one sequential stream. A tile keeps four rows
by 24 columns of Y in twelve vector registers over all of K: per k, three loads of the panel,
four broadcasts of A and twelve fused multiply-adds. Rows go in blocks of at most
:data:`BLOCK_BYTES` of A, so a block stays in L2 while every panel passes over it.

Chosen by :func:`fits` where it measured faster than BLAS and the skinny product
(``python benchmarks/planned_calls.py``; docs/benchmarks.md, "Twentieth round")."""

from __future__ import annotations

import numpy as np

from ._jit import jit
from ._prefetch import prefetch_l1
from ._simd import (
    add16,
    fma8,
    fma16,
    host_has_avx512,
    host_has_fma,
    load8,
    load16,
    splat8,
    splat16,
    store8,
    store16,
)
from .conv import U

WIDTH = 24  # columns per panel: three vectors of eight
# on sixteen lanes (AVX-512, product16): two vectors; four rows by two make eight sums, as
# many as two multiply-add units of four cycles' latency keep busy
WIDE_WIDTH = 32
K_BLOCK = 256  # product16's K per pass: 32 KiB of a panel, in L1
BLOCK_BYTES = 256 << 10  # A's rows per block: at most this many bytes of them
# product16's one- and two-row tiles read the panels as one stream, asked into L1 this many
# floats ahead (_prefetch.prefetch_l1), two k at a time into two sets of sums: paired with the
# plain tiles (15 pairs, medians), 1 x 784 x 256 11.99 -> 9.72 us (BLAS 12.09), 2 x 784 x 256
# 13.51 -> 11.78, 3 x 784 x 256 21.31 -> 19.11; weights from memory (1 x 2048 x 1000) as before
ROW_AHEAD = 1024


def width() -> int:
    """Columns per panel for this CPU: :data:`WIDE_WIDTH` where the kernels take sixteen lanes
    (:func:`._simd.host_has_avx512`), else :data:`WIDTH`."""
    return WIDE_WIDTH if host_has_avx512() else WIDTH


def kernel(panel_width: int):
    """The product over panels of ``panel_width`` columns."""
    return product16 if panel_width == WIDE_WIDTH else product


def pack(b: np.ndarray, panel_width: int = WIDTH) -> np.ndarray:
    """(K, N) -> flat (panels, K, panel_width), read-only: each panel's columns side by side
    for every k; columns past N are zero (computed, never stored)."""
    k, n = b.shape
    panels = -(-n // panel_width)
    padded = np.zeros((k, panels * panel_width), np.float32)
    padded[:, :n] = b
    packed = np.ascontiguousarray(
        padded.reshape(k, panels, panel_width).transpose(1, 0, 2)).ravel()
    packed.flags.writeable = False
    return packed


def pack_row(c: np.ndarray | None, n: int, panel_width: int = WIDTH) -> np.ndarray:
    """A bias row of ``n`` (or none: zeros) as :func:`product` takes it: padded with zeros to
    whole panels, read-only."""
    row = np.zeros(-(-n // panel_width) * panel_width, np.float32)
    if c is not None:
        row[:n] = c
    row.flags.writeable = False
    return row


@jit()
def _relu_rows(yf, start, stop):
    """yf[start:stop] = max(yf, 0) in place; NaN stays NaN (FusedGemm's Relu)."""
    zero = np.float32(0)
    for i in range(start, stop):
        v = yf[U(i)]
        yf[U(i)] = zero if v < zero else v


@jit()
def product(a, bp, n, y, cp, relu):
    """y = a @ b + c for C-contiguous float32 ``a`` (M, K) and ``y`` (M, N), ``bp`` the packed
    ``b`` (:func:`pack`), ``cp`` the bias row (:func:`pack_row`; zeros for a plain product);
    with ``relu``, max(y, 0) (NaN stays), over each row block while it is in cache
    (:func:`_relu_rows`: a FusedGemm's activation without a call of its own).
    Four rows at a time, then two, then the last one: each tile reads the panel once; a panel
    past N is summed whole and only its columns inside N stored. The tile's sums start from
    the bias (a FusedMatMul's bias costs no pass of its own: Whisper's merged Q, K and V,
    2x16x32 -> 96, 4.70 -> 3.46 us a step); from zeros, the sums are the plain product's."""
    m, k = a.shape
    af = a.reshape(a.size)
    yf = y.reshape(y.size)
    panels = (n + WIDTH - 1) // WIDTH
    block = max(4, (BLOCK_BYTES // (4 * k)) // 4 * 4)
    res = np.empty(4 * WIDTH, np.float32)  # a partial panel's tile
    for i0 in range(0, m, block):
        i1 = min(m, i0 + block)
        for j in range(panels):
            pb = j * k * WIDTH
            col = j * WIDTH
            full = col + WIDTH <= n
            z0, z1, z2 = load8(cp, U(col)), load8(cp, U(col + 8)), load8(cp, U(col + 16))
            i = i0
            while i < i1:
                four = i + 4 <= i1
                two = not four and i + 2 <= i1
                a0 = i * k
                a1, a2, a3 = a0, a0, a0
                if four:
                    a1, a2, a3 = a0 + k, a0 + 2 * k, a0 + 3 * k
                elif two:
                    a1 = a0 + k
                c00, c01, c02 = z0, z1, z2
                c10, c11, c12 = z0, z1, z2
                c20, c21, c22 = z0, z1, z2
                c30, c31, c32 = z0, z1, z2
                if four:
                    for q in range(k):
                        bo = pb + q * WIDTH
                        b0 = load8(bp, U(bo))
                        b1 = load8(bp, U(bo + 8))
                        b2 = load8(bp, U(bo + 16))
                        s = splat8(af[U(a0 + q)])
                        c00 = fma8(s, b0, c00)
                        c01 = fma8(s, b1, c01)
                        c02 = fma8(s, b2, c02)
                        s = splat8(af[U(a1 + q)])
                        c10 = fma8(s, b0, c10)
                        c11 = fma8(s, b1, c11)
                        c12 = fma8(s, b2, c12)
                        s = splat8(af[U(a2 + q)])
                        c20 = fma8(s, b0, c20)
                        c21 = fma8(s, b1, c21)
                        c22 = fma8(s, b2, c22)
                        s = splat8(af[U(a3 + q)])
                        c30 = fma8(s, b0, c30)
                        c31 = fma8(s, b1, c31)
                        c32 = fma8(s, b2, c32)
                elif two:  # two of the last M % 4 rows: the panel read once for both
                    for q in range(k):
                        bo = pb + q * WIDTH
                        b0 = load8(bp, U(bo))
                        b1 = load8(bp, U(bo + 8))
                        b2 = load8(bp, U(bo + 16))
                        s = splat8(af[U(a0 + q)])
                        c00 = fma8(s, b0, c00)
                        c01 = fma8(s, b1, c01)
                        c02 = fma8(s, b2, c02)
                        s = splat8(af[U(a1 + q)])
                        c10 = fma8(s, b0, c10)
                        c11 = fma8(s, b1, c11)
                        c12 = fma8(s, b2, c12)
                else:  # the last row
                    for q in range(k):
                        bo = pb + q * WIDTH
                        s = splat8(af[U(a0 + q)])
                        c00 = fma8(s, load8(bp, U(bo)), c00)
                        c01 = fma8(s, load8(bp, U(bo + 8)), c01)
                        c02 = fma8(s, load8(bp, U(bo + 16)), c02)
                rows = 4 if four else (2 if two else 1)
                if full:
                    o = i * n + col
                    store8(yf, U(o), c00)
                    store8(yf, U(o + 8), c01)
                    store8(yf, U(o + 16), c02)
                    if rows > 1:
                        o += n
                        store8(yf, U(o), c10)
                        store8(yf, U(o + 8), c11)
                        store8(yf, U(o + 16), c12)
                    if four:
                        o += n
                        store8(yf, U(o), c20)
                        store8(yf, U(o + 8), c21)
                        store8(yf, U(o + 16), c22)
                        o += n
                        store8(yf, U(o), c30)
                        store8(yf, U(o + 8), c31)
                        store8(yf, U(o + 16), c32)
                else:  # the last panel: through res, its columns inside N
                    store8(res, U(0), c00)
                    store8(res, U(8), c01)
                    store8(res, U(16), c02)
                    store8(res, U(24), c10)
                    store8(res, U(32), c11)
                    store8(res, U(40), c12)
                    store8(res, U(48), c20)
                    store8(res, U(56), c21)
                    store8(res, U(64), c22)
                    store8(res, U(72), c30)
                    store8(res, U(80), c31)
                    store8(res, U(88), c32)
                    for r in range(rows):
                        for t in range(n - col):
                            yf[U((i + r) * n + col + t)] = res[U(r * WIDTH + t)]
                i += rows
        if relu:
            _relu_rows(yf, i0 * n, i1 * n)


@jit()
def product16(a, bp, n, y, cp, relu):
    """:func:`product` on sixteen lanes (AVX-512) over panels of :data:`WIDE_WIDTH` columns
    (``pack(b, WIDE_WIDTH)``, ``pack_row(c, n, WIDE_WIDTH)``; ``relu`` as there): eight rows
    by two vectors per tile (sixteen sums in flight: with four rows' eight, 64 x 784 x 256
    took 177 us, with eight 144), then four, two, and the last one. K goes in blocks of
    :data:`K_BLOCK`, whose part of a panel (32 KiB) stays in L1 while every tile of the row
    block passes over it; the sums
    wait in ``acc`` between blocks and go to ``y`` after the last. A whole panel of K = 784
    read from L2 by every tile took 240 us for 64 x 784 x 256 where BLAS took 212. The first
    tile of a row block over a part of the panel asks for the panel :data:`ROW_AHEAD` floats
    ahead: weights streamed from memory (ConvNeXt's 32 x 384 x 1536, 2.4 MB) came at 5.2 GB/s
    without (452 us a call), 6.0 with (394 us)."""
    m, k = a.shape
    af = a.reshape(a.size)
    yf = y.reshape(y.size)
    panels = (n + WIDE_WIDTH - 1) // WIDE_WIDTH
    block = max(4, (BLOCK_BYTES // (4 * k)) // 4 * 4)
    acc = np.empty(min(block, m + 3) * WIDE_WIDTH, np.float32)  # a row block's sums, one panel
    for i0 in range(0, m, block):
        i1 = min(m, i0 + block)
        for j in range(panels):
            pb = j * k * WIDE_WIDTH
            col = j * WIDE_WIDTH
            z0, z1 = load16(cp, U(col)), load16(cp, U(col + 16))
            for k0 in range(0, k, K_BLOCK):
                k1 = min(k, k0 + K_BLOCK)
                first = k0 == 0
                i = i0
                while i + 8 <= i1:  # eight rows by two vectors: sixteen sums in flight
                    r0 = (i - i0) * WIDE_WIDTH
                    a0 = i * k
                    e00, e01 = z0, z1
                    e10, e11 = z0, z1
                    e20, e21 = z0, z1
                    e30, e31 = z0, z1
                    e40, e41 = z0, z1
                    e50, e51 = z0, z1
                    e60, e61 = z0, z1
                    e70, e71 = z0, z1
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
                    lead = i == i0  # the first tile over this part of the panel
                    for q in range(k0, k1):
                        bo = pb + q * WIDE_WIDTH
                        if lead:  # (the loop is unswitched on it)
                            prefetch_l1(bp, U(bo + ROW_AHEAD))
                            prefetch_l1(bp, U(bo + ROW_AHEAD + 16))
                        b0 = load16(bp, U(bo))
                        b1 = load16(bp, U(bo + 16))
                        s = splat16(af[U(a0 + 0 * k + q)])
                        e00 = fma16(s, b0, e00)
                        e01 = fma16(s, b1, e01)
                        s = splat16(af[U(a0 + 1 * k + q)])
                        e10 = fma16(s, b0, e10)
                        e11 = fma16(s, b1, e11)
                        s = splat16(af[U(a0 + 2 * k + q)])
                        e20 = fma16(s, b0, e20)
                        e21 = fma16(s, b1, e21)
                        s = splat16(af[U(a0 + 3 * k + q)])
                        e30 = fma16(s, b0, e30)
                        e31 = fma16(s, b1, e31)
                        s = splat16(af[U(a0 + 4 * k + q)])
                        e40 = fma16(s, b0, e40)
                        e41 = fma16(s, b1, e41)
                        s = splat16(af[U(a0 + 5 * k + q)])
                        e50 = fma16(s, b0, e50)
                        e51 = fma16(s, b1, e51)
                        s = splat16(af[U(a0 + 6 * k + q)])
                        e60 = fma16(s, b0, e60)
                        e61 = fma16(s, b1, e61)
                        s = splat16(af[U(a0 + 7 * k + q)])
                        e70 = fma16(s, b0, e70)
                        e71 = fma16(s, b1, e71)
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
                while i < i1:
                    four = i + 4 <= i1
                    two = not four and i + 2 <= i1
                    rows = 4 if four else (2 if two else 1)
                    r0 = (i - i0) * WIDE_WIDTH
                    a0 = i * k
                    a1, a2, a3 = a0, a0, a0
                    if four:
                        a1, a2, a3 = a0 + k, a0 + 2 * k, a0 + 3 * k
                    elif two:
                        a1 = a0 + k
                    c00, c01, c10, c11 = z0, z1, z0, z1
                    c20, c21, c30, c31 = z0, z1, z0, z1
                    if not first:  # the sums so far (rows past the tile's are not read)
                        c00 = load16(acc, U(r0))
                        c01 = load16(acc, U(r0 + 16))
                        if rows > 1:
                            c10 = load16(acc, U(r0 + 32))
                            c11 = load16(acc, U(r0 + 48))
                        if four:
                            c20 = load16(acc, U(r0 + 64))
                            c21 = load16(acc, U(r0 + 80))
                            c30 = load16(acc, U(r0 + 96))
                            c31 = load16(acc, U(r0 + 112))
                    if four:
                        lead = i == i0  # the first tile over this part of the panel
                        for q in range(k0, k1):
                            bo = pb + q * WIDE_WIDTH
                            if lead:  # (the loop is unswitched on it)
                                prefetch_l1(bp, U(bo + ROW_AHEAD))
                                prefetch_l1(bp, U(bo + ROW_AHEAD + 16))
                            b0 = load16(bp, U(bo))
                            b1 = load16(bp, U(bo + 16))
                            s = splat16(af[U(a0 + q)])
                            c00 = fma16(s, b0, c00)
                            c01 = fma16(s, b1, c01)
                            s = splat16(af[U(a1 + q)])
                            c10 = fma16(s, b0, c10)
                            c11 = fma16(s, b1, c11)
                            s = splat16(af[U(a2 + q)])
                            c20 = fma16(s, b0, c20)
                            c21 = fma16(s, b1, c21)
                            s = splat16(af[U(a3 + q)])
                            c30 = fma16(s, b0, c30)
                            c31 = fma16(s, b1, c31)
                    elif two:  # two of the last M % 4 rows: the panel read once for both
                        # two k at a time into two sets of sums, as the last row's below
                        d00 = splat16(np.float32(0))
                        d01, d10, d11 = d00, d00, d00
                        q = k0
                        while q + 2 <= k1:
                            bo = pb + q * WIDE_WIDTH
                            prefetch_l1(bp, U(bo + ROW_AHEAD))
                            prefetch_l1(bp, U(bo + ROW_AHEAD + 16))
                            prefetch_l1(bp, U(bo + ROW_AHEAD + 32))
                            prefetch_l1(bp, U(bo + ROW_AHEAD + 48))
                            b0 = load16(bp, U(bo))
                            b1 = load16(bp, U(bo + 16))
                            s = splat16(af[U(a0 + q)])
                            c00 = fma16(s, b0, c00)
                            c01 = fma16(s, b1, c01)
                            s = splat16(af[U(a1 + q)])
                            c10 = fma16(s, b0, c10)
                            c11 = fma16(s, b1, c11)
                            b0 = load16(bp, U(bo + 32))
                            b1 = load16(bp, U(bo + 48))
                            s = splat16(af[U(a0 + q + 1)])
                            d00 = fma16(s, b0, d00)
                            d01 = fma16(s, b1, d01)
                            s = splat16(af[U(a1 + q + 1)])
                            d10 = fma16(s, b0, d10)
                            d11 = fma16(s, b1, d11)
                            q += 2
                        if q < k1:
                            bo = pb + q * WIDE_WIDTH
                            b0 = load16(bp, U(bo))
                            b1 = load16(bp, U(bo + 16))
                            s = splat16(af[U(a0 + q)])
                            c00 = fma16(s, b0, c00)
                            c01 = fma16(s, b1, c01)
                            s = splat16(af[U(a1 + q)])
                            c10 = fma16(s, b0, c10)
                            c11 = fma16(s, b1, c11)
                        c00 = add16(c00, d00)
                        c01 = add16(c01, d01)
                        c10 = add16(c10, d10)
                        c11 = add16(c11, d11)
                    else:  # the last row (a single row's product: one stream of bp)
                        # two k at a time into two pairs of sums: four chains of fused
                        # multiply-adds in flight, not two
                        d00 = splat16(np.float32(0))
                        d01 = d00
                        q = k0
                        while q + 2 <= k1:
                            bo = pb + q * WIDE_WIDTH
                            prefetch_l1(bp, U(bo + ROW_AHEAD))
                            prefetch_l1(bp, U(bo + ROW_AHEAD + 16))
                            prefetch_l1(bp, U(bo + ROW_AHEAD + 32))
                            prefetch_l1(bp, U(bo + ROW_AHEAD + 48))
                            s = splat16(af[U(a0 + q)])
                            c00 = fma16(s, load16(bp, U(bo)), c00)
                            c01 = fma16(s, load16(bp, U(bo + 16)), c01)
                            s = splat16(af[U(a0 + q + 1)])
                            d00 = fma16(s, load16(bp, U(bo + 32)), d00)
                            d01 = fma16(s, load16(bp, U(bo + 48)), d01)
                            q += 2
                        if q < k1:
                            bo = pb + q * WIDE_WIDTH
                            s = splat16(af[U(a0 + q)])
                            c00 = fma16(s, load16(bp, U(bo)), c00)
                            c01 = fma16(s, load16(bp, U(bo + 16)), c01)
                        c00 = add16(c00, d00)
                        c01 = add16(c01, d01)
                    store16(acc, U(r0), c00)
                    store16(acc, U(r0 + 16), c01)
                    if rows > 1:
                        store16(acc, U(r0 + 32), c10)
                        store16(acc, U(r0 + 48), c11)
                    if four:
                        store16(acc, U(r0 + 64), c20)
                        store16(acc, U(r0 + 80), c21)
                        store16(acc, U(r0 + 96), c30)
                        store16(acc, U(r0 + 112), c31)
                    i += rows
            if col + WIDE_WIDTH <= n:  # the row block's sums to y
                for r in range(i1 - i0):
                    o = (i0 + r) * n + col
                    store16(yf, U(o), load16(acc, U(r * WIDE_WIDTH)))
                    store16(yf, U(o + 16), load16(acc, U(r * WIDE_WIDTH + 16)))
            else:  # the last panel: its columns inside N
                for r in range(i1 - i0):
                    for t in range(n - col):
                        yf[U((i0 + r) * n + col + t)] = acc[U(r * WIDE_WIDTH + t)]
        if relu:
            _relu_rows(yf, i0 * n, i1 * n)


# Where the panels measured faster than BLAS, and than the skinny product on few rows (python
# benchmarks/planned_calls.py, one thread): 0.33-0.98x BLAS from 4 rows (4 x 768 x 768 to
# 4096 x 1024 x 1024), the weights in cache or from memory, 0.40-0.93x the skinny product on
# 4-32 rows. With the two-row tile, one to three rows too (docs/benchmarks.md, "Twenty-second
# round"): 2 x 576 -> 1024 29.5 against the skinny product's 36.4 us warm, 136 against 229
# with the cache flushed (BLAS 135 and 262); 1 x 2048 -> 1000 100 against BLAS's 98 warm,
# 312 against 367 flushed. Products of fewer than 16 columns keep BLAS: their one panel is
# mostly padding (1000 x 32 x 8: 1.54x).
MIN_ROWS = 1
MIN_COLUMNS = 16
# narrower products (a classifier head of ten classes) on a few rows go by panels too: their
# one panel's padding costs less than BLAS's call and the bias pass after it. A planned Gemm
# with its bias, paired (15 pairs, medians, Emerald Rapids): 1 x 256 x 10 1.75 -> 1.25 us,
# 4 x 256 x 10 2.04 -> 1.43, 8 x 256 x 10 2.19 -> 1.98, 1 x 512 x 8 1.71 -> 1.58; not at 64
# rows (6.09 -> 7.00) nor for two columns (2 x 1024 x 2: 2.30 -> 2.58)
NARROW_MAX_ROWS = 8
NARROW_MIN_COLUMNS = 8


def fits(rows: int, k: int, n: int) -> bool:
    """Whether a float32 product of ``rows`` by constant (k, n) weights goes by panels (the
    caller checks the dtype, the weights' immutability and the thread mode)."""
    wide_enough = n >= MIN_COLUMNS or (n >= NARROW_MIN_COLUMNS and rows <= NARROW_MAX_ROWS)
    return host_has_fma() and rows >= MIN_ROWS and wide_enough and k >= 1
