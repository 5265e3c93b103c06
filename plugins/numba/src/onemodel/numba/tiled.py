"""Direct convolution on register tiles, for float32 convolutions with constant weights whose
im2col columns and GEMM are small: no columns, no BLAS call. Each step of the inner loop takes
one tap (an input channel and a kernel position), broadcasts the input value under each of
three output pixels and multiplies it into 32 output channels' weights, four vectors of eight
(:mod:`._simd`): twelve vector accumulators stay in registers for the whole sum over the taps
(C * kh * kw of them). The weights are packed once at plan time, 32 output channels side by
side for each tap; the input is copied into zero-bordered planes, so the loop over the taps
reads no bounds. The three pixels are consecutive in the flat (image, row, column) order, so
small planes waste no lanes. The sums start at the bias; the results of 96 pixels at a time
are activated in one pass and stored to NCHW by 8x8 transposes. While a block's first tile
runs, the next block's weights are asked for (:mod:`._prefetch`): 1x1 convolutions over a few
pixels, whose weights come from memory, stream them once instead of once per image as BLAS
does. Convolutions of 8-24 outputs, whose blocks of 32 would be mostly padding, take blocks
of sixteen channels by six pixels (:func:`_tiles16`, 12-16 outputs) or of eight channels by
twelve pixels (:func:`_tiles8`) instead.

This is onnxruntime's NCHWc convolution kernel's shape (a block of output channels in a
vector, input values broadcast), kept to NCHW tensors at both ends. Chosen by :func:`fits`
where it measured faster than the columns and GEMM (and Winograd) on one thread; see the
constants below and docs/benchmarks.md, "Nineteenth round" and "Twentieth round"."""

from __future__ import annotations

import numpy as np

# _tiles compiles conv._activate_in_place into its own machine code; numba would keep that
# code cached after a change to conv.py alone, so the package's cache is dropped whenever
# any of its sources change (_cache.py)
from onemodel.tensors.ops.specialize import Input, Output

from ._jit import jit
from ._prefetch import prefetch
from ._simd import (
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
    transpose8x8,
)
from .conv import PreparedCall, U, _activate_in_place, bound_call

BLOCK = 32  # output channels per tile: four vectors of eight
MID_BLOCK = 16  # for 12-16 output channels: two vectors (_tiles16)
NARROW_BLOCK = 8  # for a few output channels: one vector (_tiles8)
NARROW_MAX = 24  # output channels at most for blocks of eight


# Where the tiles measured faster than the columns and GEMM (python benchmarks/tiled_conv.py,
# one thread): at least this many taps (C * kh * kw: a 3-channel image's 3x3 stem has 27,
# 0.75-0.81x since the results go out by transposes; they were stored one by one before,
# 1.2-1.6x), at most a quarter of each block's channels computed in vain, and bordered input
# planes that stay in L2 (ResNet-50's 7x7 stem at 1x3x224x224, 620 KiB of planes: 0.70x; a
# 2x512x8x8 convolution dilated by 4, whose bordered planes take 1 MiB: 1.07x).
MIN_TAPS = 27
MAX_PLANES_BYTES = 768 << 10
# 1x1 convolutions stay with BLAS (the tiles took 1.06-2.0x its time with the weights in
# cache: each tap reads another input plane), except over a few pixels with weights that come
# from memory in a model's run: BLAS reads them once per image, the tiles once, and ask for the
# next block's while a block's first pixels are summed. EfficientNet-B0 at 2x3x64x64, in its
# run (benchmarks/plan_steps.py's step loop): 192 -> 1152 channels over 2x2 planes 108-137 ->
# 57-60 us, 1152 -> 320 162 -> 101-109 us.
POINTWISE_MAX_PIXELS = 16
POINTWISE_MIN_WEIGHTS = 256 << 10


def fits(plan, xshape, wshape, group) -> bool:
    """Whether a float32 convolution of this plan goes by register tiles (given constant,
    immutable weights; the caller checks the dtype and the thread mode)."""
    _path, (n, m, oh, ow), s, pb, d, k, _chunk = plan
    if group != 1 or min(pb) < 0 or not host_has_fma():
        return False
    size = block(m)
    if xshape[1] * k[0] * k[1] < MIN_TAPS or size is None:
        return False
    if k == (1, 1):
        if size != BLOCK:
            return False
        return s == (1, 1) and pb == (0, 0) and n * oh * ow <= POINTWISE_MAX_PIXELS and \
            m * xshape[1] * 4 >= POINTWISE_MIN_WEIGHTS
    hp = _padded_size(xshape[2], oh, k[0], s[0], pb[0], d[0])
    wq = _padded_size(xshape[3], ow, k[1], s[1], pb[1], d[1])
    return n * xshape[1] * hp * wq * 4 <= MAX_PLANES_BYTES


# On sixteen lanes (_tiles_wide) the tiles beat Winograd for convolutions of at most this many
# output channels, whose products are too narrow for the batched GEMM, or of at most this many
# input channels, whose transforms cost more than the products they save (one thread, Emerald
# Rapids, Tiled.run against _Winograd.run, best of 5 of 200 calls: DenseNet's 2x128x8x8 -> 32
# 64.5 against 82.0 us, 2x128x16x16 -> 32 241 against 359; SqueezeNet's 1x16x55x55 -> 64 390
# against 579, 1x64x13x13 -> 256 324 against 381; ResNet's 1x64x56x56 -> 64 1607 against
# 2860, 2x64x16x16 -> 64 243-286 against 264-461, 1x64x28x28 -> 64 338 against 333); with 96
# input channels and more Winograd stays ahead (1x96x13x13 -> 128 280 against 246,
# 1x128x28x28 -> 128 1449 against 1043).
WIDE_OVER_WINOGRAD_MAX_OUTPUTS = 32
WIDE_OVER_WINOGRAD_MAX_INPUTS = 64


def beats_winograd(plan, xshape, wshape, group) -> bool:
    """Whether a float32 convolution that Winograd would take goes by the sixteen-lane tiles
    instead (:data:`WIDE_OVER_WINOGRAD_MAX_OUTPUTS`, :data:`WIDE_OVER_WINOGRAD_MAX_INPUTS`)."""
    m = plan[1][1]
    return host_has_avx512() and (m <= WIDE_OVER_WINOGRAD_MAX_OUTPUTS or
                                  xshape[1] <= WIDE_OVER_WINOGRAD_MAX_INPUTS) and \
        block(m) == BLOCK and fits(plan, xshape, wshape, group)


def weights(w: np.ndarray, size: int = BLOCK) -> np.ndarray:
    """(M, C, kh, kw) -> flat (blocks, C * kh * kw, size): each tap's ``size`` output
    channels side by side; output channels past M are zero (computed, never stored)."""
    m = w.shape[0]
    taps = w[0].size
    blocks = -(-m // size)
    packed = np.zeros((blocks * size, taps), np.float32)
    packed[:m] = w.reshape(m, taps)
    return np.ascontiguousarray(packed.reshape(blocks, size, taps).transpose(0, 2, 1)).ravel()


def block(m: int) -> int | None:
    """Output channels per tile for M of them: 32, or for at most NARROW_MAX 16 or 8, the
    widest whose blocks leave at most a quarter of their channels unused; None when none
    fits."""
    for size in (BLOCK, MID_BLOCK, NARROW_BLOCK):
        blocks = -(-m // size)
        if 4 * (blocks * size - m) <= blocks * size and (size == BLOCK or m <= NARROW_MAX):
            return size
    return None


def _padded_size(size, out, k, s, p, d):
    """Length of the zero-bordered input along one axis: every tap of every output inside."""
    return max(size + p, (out - 1) * s + (k - 1) * d + 1)


CHUNK = 96  # output pixels per pass before they are stored: 12 KiB of results
# taps (C * kh * kw) from which _tiles_wide takes eight pixels a tile: a block's weights
# (taps x 32 floats) then pass 32 KiB and come from L2 for every tile, so each weight read
# serves eight pixels, not six (DenseNet's 2x128x8x8 -> 32 75 -> 55 us, 2x128x4x4 -> 256
# 154 -> 112); with the weights in L1 six measured faster (SqueezeNet's 2x16x15x15 -> 64,
# 144 taps: 51 against 56 us)
EIGHT_PIXELS_MIN_TAPS = 256


@jit()
def _bordered(xf, n, c, h, w, ph, pw, hp, wq):
    """The input's planes (``xf`` flat NCHW) copied into zero-bordered (hp, wq) planes."""
    planes = np.zeros(n * c * hp * wq, np.float32)  # the borders stay zero
    for img in range(n):
        for ch in range(c):
            for r in range(h):
                src = ((img * c + ch) * h + r) * w
                dst = ((img * c + ch) * hp + r + ph) * wq + pw
                for q in range(w):
                    planes[U(dst + q)] = xf[U(src + q)]
    return planes


@jit()
def _store_chunk(res, width, j0, j1, plane, m, m0, nch, act, yf):
    """A chunk's results, ``res`` (pixel j0..j1, ``width`` channels from m0), activated in
    place and stored to channels m0..m0 + nch of the flat NCHW ``yf``: by 8x8 transposes
    (eight pixels of one image by eight channels), the rest one by one."""
    _activate_in_place(res, 0, (j1 - j0) * width, act, np.float32(0.0))
    jj = j0
    while jj < j1:  # the chunk's pixels, a run within one image at a time
        img = jj // plane
        p = jj - img * plane
        run = min(j1 - jj, plane - p)
        r0 = (jj - j0) * width
        ob = (img * m + m0) * plane + p  # y[img, m0, p]
        k = 0
        while k + 8 <= run:
            o8 = 0
            while o8 + 8 <= nch:
                transpose8x8(res, U(r0 + k * width + o8), width, yf, U(ob + o8 * plane + k),
                             plane)
                o8 += 8
            for o in range(o8, nch):
                for r in range(8):
                    yf[U(ob + o * plane + k + r)] = res[U(r0 + (k + r) * width + o)]
            k += 8
        for r in range(k, run):
            for o in range(nch):
                yf[U(ob + o * plane + r)] = res[U(r0 + r * width + o)]
        jj += run


@jit()
def _padded_bias(bias, has_bias, m, size):
    """The bias in ``size`` floats, zeros past m (those channels are computed, never stored)."""
    bp = np.zeros(size, np.float32)
    if has_bias:
        for o in range(m):
            bp[U(o)] = bias[U(o)]
    return bp


@jit()
def _tiles(x, wp, xoff, pix_in, bias, has_bias, act, ph, pw, hp, wq, y):
    """y = act(conv(x) + bias) with the packed weights ``wp`` (:func:`weights`), the taps'
    offsets into the bordered planes ``xoff``, and each output pixel's offset into them
    (``pix_in``). Pixels are taken three at a time along the flat (image, row, column) order,
    so rows narrower than a tile waste nothing. The sums start at the bias; a chunk's results
    are activated in one pass and stored to NCHW by 8x8 transposes (eight pixels of an image
    by eight channels), the rest one by one."""
    n, c, h, w = x.shape
    m, oh, ow = y.shape[1], y.shape[2], y.shape[3]
    taps = xoff.shape[0]
    npix = pix_in.shape[0]
    blocks = (m + 31) // 32
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    planes = _bordered(xf, n, c, h, w, ph, pw, hp, wq)
    res = np.empty(CHUNK * 32, np.float32)
    plane = oh * ow
    bp = _padded_bias(bias, has_bias, m, blocks * 32)
    ahead = taps * 32  # the next block's weights, asked for while a block's first tile runs
    for blk in range(blocks):
        wb = blk * taps * 32
        b0 = load8(bp, U(blk * 32))
        b1 = load8(bp, U(blk * 32 + 8))
        b2 = load8(bp, U(blk * 32 + 16))
        b3 = load8(bp, U(blk * 32 + 24))
        nch = min(32, m - blk * 32)
        for j0 in range(0, npix, CHUNK):
            j1 = min(npix, j0 + CHUNK)
            j = j0
            while j + 3 <= j1:
                a00, a01, a02, a03 = b0, b1, b2, b3
                a10, a11, a12, a13 = b0, b1, b2, b3
                a20, a21, a22, a23 = b0, b1, b2, b3
                p0, p1, p2 = pix_in[U(j)], pix_in[U(j + 1)], pix_in[U(j + 2)]
                first = j == 0
                for t in range(taps):
                    xo = xoff[U(t)]
                    wo = wb + t * 32
                    w0 = load8(wp, U(wo))
                    w1 = load8(wp, U(wo + 8))
                    w2 = load8(wp, U(wo + 16))
                    w3 = load8(wp, U(wo + 24))
                    if first:  # (the loop is unswitched on it: no cost to the other tiles)
                        prefetch(wp, U(wo + ahead))
                        prefetch(wp, U(wo + ahead + 16))
                    v = splat8(planes[U(p0 + xo)])
                    a00 = fma8(v, w0, a00)
                    a01 = fma8(v, w1, a01)
                    a02 = fma8(v, w2, a02)
                    a03 = fma8(v, w3, a03)
                    v = splat8(planes[U(p1 + xo)])
                    a10 = fma8(v, w0, a10)
                    a11 = fma8(v, w1, a11)
                    a12 = fma8(v, w2, a12)
                    a13 = fma8(v, w3, a13)
                    v = splat8(planes[U(p2 + xo)])
                    a20 = fma8(v, w0, a20)
                    a21 = fma8(v, w1, a21)
                    a22 = fma8(v, w2, a22)
                    a23 = fma8(v, w3, a23)
                r0 = (j - j0) * 32
                store8(res, U(r0), a00)
                store8(res, U(r0 + 8), a01)
                store8(res, U(r0 + 16), a02)
                store8(res, U(r0 + 24), a03)
                store8(res, U(r0 + 32), a10)
                store8(res, U(r0 + 40), a11)
                store8(res, U(r0 + 48), a12)
                store8(res, U(r0 + 56), a13)
                store8(res, U(r0 + 64), a20)
                store8(res, U(r0 + 72), a21)
                store8(res, U(r0 + 80), a22)
                store8(res, U(r0 + 88), a23)
                j += 3
            if j + 2 == j1:  # two pixels left: one tile of two
                a00, a01, a02, a03 = b0, b1, b2, b3
                a10, a11, a12, a13 = b0, b1, b2, b3
                p0, p1 = pix_in[U(j)], pix_in[U(j + 1)]
                for t in range(taps):
                    xo = xoff[U(t)]
                    wo = wb + t * 32
                    w0 = load8(wp, U(wo))
                    w1 = load8(wp, U(wo + 8))
                    w2 = load8(wp, U(wo + 16))
                    w3 = load8(wp, U(wo + 24))
                    v = splat8(planes[U(p0 + xo)])
                    a00 = fma8(v, w0, a00)
                    a01 = fma8(v, w1, a01)
                    a02 = fma8(v, w2, a02)
                    a03 = fma8(v, w3, a03)
                    v = splat8(planes[U(p1 + xo)])
                    a10 = fma8(v, w0, a10)
                    a11 = fma8(v, w1, a11)
                    a12 = fma8(v, w2, a12)
                    a13 = fma8(v, w3, a13)
                r0 = (j - j0) * 32
                store8(res, U(r0), a00)
                store8(res, U(r0 + 8), a01)
                store8(res, U(r0 + 16), a02)
                store8(res, U(r0 + 24), a03)
                store8(res, U(r0 + 32), a10)
                store8(res, U(r0 + 40), a11)
                store8(res, U(r0 + 48), a12)
                store8(res, U(r0 + 56), a13)
            elif j < j1:  # one pixel left
                a00, a01, a02, a03 = b0, b1, b2, b3
                p0 = pix_in[U(j)]
                for t in range(taps):
                    wo = wb + t * 32
                    v = splat8(planes[U(p0 + xoff[U(t)])])
                    a00 = fma8(v, load8(wp, U(wo)), a00)
                    a01 = fma8(v, load8(wp, U(wo + 8)), a01)
                    a02 = fma8(v, load8(wp, U(wo + 16)), a02)
                    a03 = fma8(v, load8(wp, U(wo + 24)), a03)
                r0 = (j - j0) * 32
                store8(res, U(r0), a00)
                store8(res, U(r0 + 8), a01)
                store8(res, U(r0 + 16), a02)
                store8(res, U(r0 + 24), a03)
            _store_chunk(res, 32, j0, j1, plane, m, blk * 32, nch, act, yf)


@jit()
def _tiles_wide(x, wp, xoff, pix_in, bias, has_bias, act, ph, pw, hp, wq, y):
    """:func:`_tiles` on sixteen-lane vectors (AVX-512: :func:`._simd.host_has_avx512`), with
    the same packed weights: 32 output channels (two vectors) by six pixels per tile, twelve
    accumulators again, each multiply-add twice as wide, or by eight pixels, sixteen
    accumulators, where a block's weights are read from L2 (:data:`EIGHT_PIXELS_MIN_TAPS`);
    three, two, then one pixel at a time at a chunk's end."""
    n, c, h, w = x.shape
    m, oh, ow = y.shape[1], y.shape[2], y.shape[3]
    taps = xoff.shape[0]
    npix = pix_in.shape[0]
    blocks = (m + 31) // 32
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    planes = _bordered(xf, n, c, h, w, ph, pw, hp, wq)
    res = np.empty(CHUNK * 32, np.float32)
    plane = oh * ow
    bp = _padded_bias(bias, has_bias, m, blocks * 32)
    ahead = taps * 32  # the next block's weights, asked for while a block's first tile runs
    # eight pixels a tile where a block's weights pass L1 (EIGHT_PIXELS_MIN_TAPS), six else
    eight = taps >= EIGHT_PIXELS_MIN_TAPS
    for blk in range(blocks):
        wb = blk * taps * 32
        b0 = load16(bp, U(blk * 32))
        b1 = load16(bp, U(blk * 32 + 16))
        nch = min(32, m - blk * 32)
        for j0 in range(0, npix, CHUNK):
            j1 = min(npix, j0 + CHUNK)
            j = j0
            while eight and j + 8 <= j1:  # eight pixels: sixteen sums in flight
                a00, a01, a10, a11, a20, a21, a30, a31 = b0, b1, b0, b1, b0, b1, b0, b1
                a40, a41, a50, a51, a60, a61, a70, a71 = b0, b1, b0, b1, b0, b1, b0, b1
                p0, p1, p2, p3 = pix_in[U(j)], pix_in[U(j + 1)], pix_in[U(j + 2)], \
                    pix_in[U(j + 3)]
                p4, p5, p6, p7 = pix_in[U(j + 4)], pix_in[U(j + 5)], pix_in[U(j + 6)], \
                    pix_in[U(j + 7)]
                first = j == 0
                for t in range(taps):
                    xo = xoff[U(t)]
                    wo = wb + t * 32
                    w0 = load16(wp, U(wo))
                    w1 = load16(wp, U(wo + 16))
                    if first:  # (the loop is unswitched on it: no cost to the other tiles)
                        prefetch(wp, U(wo + ahead))
                        prefetch(wp, U(wo + ahead + 16))
                    v = splat16(planes[U(p0 + xo)])
                    a00 = fma16(v, w0, a00)
                    a01 = fma16(v, w1, a01)
                    v = splat16(planes[U(p1 + xo)])
                    a10 = fma16(v, w0, a10)
                    a11 = fma16(v, w1, a11)
                    v = splat16(planes[U(p2 + xo)])
                    a20 = fma16(v, w0, a20)
                    a21 = fma16(v, w1, a21)
                    v = splat16(planes[U(p3 + xo)])
                    a30 = fma16(v, w0, a30)
                    a31 = fma16(v, w1, a31)
                    v = splat16(planes[U(p4 + xo)])
                    a40 = fma16(v, w0, a40)
                    a41 = fma16(v, w1, a41)
                    v = splat16(planes[U(p5 + xo)])
                    a50 = fma16(v, w0, a50)
                    a51 = fma16(v, w1, a51)
                    v = splat16(planes[U(p6 + xo)])
                    a60 = fma16(v, w0, a60)
                    a61 = fma16(v, w1, a61)
                    v = splat16(planes[U(p7 + xo)])
                    a70 = fma16(v, w0, a70)
                    a71 = fma16(v, w1, a71)
                r0 = (j - j0) * 32
                store16(res, U(r0 + 0), a00)
                store16(res, U(r0 + 16), a01)
                store16(res, U(r0 + 32), a10)
                store16(res, U(r0 + 48), a11)
                store16(res, U(r0 + 64), a20)
                store16(res, U(r0 + 80), a21)
                store16(res, U(r0 + 96), a30)
                store16(res, U(r0 + 112), a31)
                store16(res, U(r0 + 128), a40)
                store16(res, U(r0 + 144), a41)
                store16(res, U(r0 + 160), a50)
                store16(res, U(r0 + 176), a51)
                store16(res, U(r0 + 192), a60)
                store16(res, U(r0 + 208), a61)
                store16(res, U(r0 + 224), a70)
                store16(res, U(r0 + 240), a71)
                j += 8
            while j + 6 <= j1:
                a00, a01, a10, a11, a20, a21 = b0, b1, b0, b1, b0, b1
                a30, a31, a40, a41, a50, a51 = b0, b1, b0, b1, b0, b1
                p0, p1, p2 = pix_in[U(j)], pix_in[U(j + 1)], pix_in[U(j + 2)]
                p3, p4, p5 = pix_in[U(j + 3)], pix_in[U(j + 4)], pix_in[U(j + 5)]
                first = j == 0
                for t in range(taps):
                    xo = xoff[U(t)]
                    wo = wb + t * 32
                    w0 = load16(wp, U(wo))
                    w1 = load16(wp, U(wo + 16))
                    if first:  # (the loop is unswitched on it: no cost to the other tiles)
                        prefetch(wp, U(wo + ahead))
                        prefetch(wp, U(wo + ahead + 16))
                    v = splat16(planes[U(p0 + xo)])
                    a00 = fma16(v, w0, a00)
                    a01 = fma16(v, w1, a01)
                    v = splat16(planes[U(p1 + xo)])
                    a10 = fma16(v, w0, a10)
                    a11 = fma16(v, w1, a11)
                    v = splat16(planes[U(p2 + xo)])
                    a20 = fma16(v, w0, a20)
                    a21 = fma16(v, w1, a21)
                    v = splat16(planes[U(p3 + xo)])
                    a30 = fma16(v, w0, a30)
                    a31 = fma16(v, w1, a31)
                    v = splat16(planes[U(p4 + xo)])
                    a40 = fma16(v, w0, a40)
                    a41 = fma16(v, w1, a41)
                    v = splat16(planes[U(p5 + xo)])
                    a50 = fma16(v, w0, a50)
                    a51 = fma16(v, w1, a51)
                r0 = (j - j0) * 32
                store16(res, U(r0), a00)
                store16(res, U(r0 + 16), a01)
                store16(res, U(r0 + 32), a10)
                store16(res, U(r0 + 48), a11)
                store16(res, U(r0 + 64), a20)
                store16(res, U(r0 + 80), a21)
                store16(res, U(r0 + 96), a30)
                store16(res, U(r0 + 112), a31)
                store16(res, U(r0 + 128), a40)
                store16(res, U(r0 + 144), a41)
                store16(res, U(r0 + 160), a50)
                store16(res, U(r0 + 176), a51)
                j += 6
            while j + 3 <= j1:  # up to seven left: three, three, one
                a00, a01, a10, a11, a20, a21 = b0, b1, b0, b1, b0, b1
                p0, p1, p2 = pix_in[U(j)], pix_in[U(j + 1)], pix_in[U(j + 2)]
                for t in range(taps):
                    xo = xoff[U(t)]
                    wo = wb + t * 32
                    w0 = load16(wp, U(wo))
                    w1 = load16(wp, U(wo + 16))
                    v = splat16(planes[U(p0 + xo)])
                    a00 = fma16(v, w0, a00)
                    a01 = fma16(v, w1, a01)
                    v = splat16(planes[U(p1 + xo)])
                    a10 = fma16(v, w0, a10)
                    a11 = fma16(v, w1, a11)
                    v = splat16(planes[U(p2 + xo)])
                    a20 = fma16(v, w0, a20)
                    a21 = fma16(v, w1, a21)
                r0 = (j - j0) * 32
                store16(res, U(r0), a00)
                store16(res, U(r0 + 16), a01)
                store16(res, U(r0 + 32), a10)
                store16(res, U(r0 + 48), a11)
                store16(res, U(r0 + 64), a20)
                store16(res, U(r0 + 80), a21)
                j += 3
            if j + 2 <= j1:
                a00, a01, a10, a11 = b0, b1, b0, b1
                p0, p1 = pix_in[U(j)], pix_in[U(j + 1)]
                for t in range(taps):
                    xo = xoff[U(t)]
                    wo = wb + t * 32
                    w0 = load16(wp, U(wo))
                    w1 = load16(wp, U(wo + 16))
                    v = splat16(planes[U(p0 + xo)])
                    a00 = fma16(v, w0, a00)
                    a01 = fma16(v, w1, a01)
                    v = splat16(planes[U(p1 + xo)])
                    a10 = fma16(v, w0, a10)
                    a11 = fma16(v, w1, a11)
                r0 = (j - j0) * 32
                store16(res, U(r0), a00)
                store16(res, U(r0 + 16), a01)
                store16(res, U(r0 + 32), a10)
                store16(res, U(r0 + 48), a11)
                j += 2
            if j < j1:
                a00, a01 = b0, b1
                p0 = pix_in[U(j)]
                for t in range(taps):
                    wo = wb + t * 32
                    v = splat16(planes[U(p0 + xoff[U(t)])])
                    a00 = fma16(v, load16(wp, U(wo)), a00)
                    a01 = fma16(v, load16(wp, U(wo + 16)), a01)
                r0 = (j - j0) * 32
                store16(res, U(r0), a00)
                store16(res, U(r0 + 16), a01)
            _store_chunk(res, 32, j0, j1, plane, m, blk * 32, nch, act, yf)


@jit()
def _tiles8(x, wp, xoff, pix_in, bias, has_bias, act, ph, pw, hp, wq, y):
    """:func:`_tiles` for convolutions of few output channels (8, 16, 24: a 3-channel stem's
    eight), whose blocks of 32 would be mostly padding: eight output channels (one vector)
    by twelve pixels per tile, the weights packed in blocks of eight; four pixels, then one
    at a time, at a chunk's end."""
    n, c, h, w = x.shape
    m, oh, ow = y.shape[1], y.shape[2], y.shape[3]
    taps = xoff.shape[0]
    npix = pix_in.shape[0]
    blocks = (m + 7) // 8
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    planes = _bordered(xf, n, c, h, w, ph, pw, hp, wq)
    res = np.empty(CHUNK * 8, np.float32)
    plane = oh * ow
    bp = _padded_bias(bias, has_bias, m, blocks * 8)
    for blk in range(blocks):
        wb = blk * taps * 8
        b = load8(bp, U(blk * 8))
        nch = min(8, m - blk * 8)
        for j0 in range(0, npix, CHUNK):
            j1 = min(npix, j0 + CHUNK)
            j = j0
            while j + 12 <= j1:
                a0, a1, a2, a3, a4, a5 = b, b, b, b, b, b
                a6, a7, a8, a9, a10, a11 = b, b, b, b, b, b
                p0, p1, p2 = pix_in[U(j)], pix_in[U(j + 1)], pix_in[U(j + 2)]
                p3, p4, p5 = pix_in[U(j + 3)], pix_in[U(j + 4)], pix_in[U(j + 5)]
                p6, p7, p8 = pix_in[U(j + 6)], pix_in[U(j + 7)], pix_in[U(j + 8)]
                p9, p10, p11 = pix_in[U(j + 9)], pix_in[U(j + 10)], pix_in[U(j + 11)]
                for t in range(taps):
                    xo = xoff[U(t)]
                    wv = load8(wp, U(wb + t * 8))
                    a0 = fma8(splat8(planes[U(p0 + xo)]), wv, a0)
                    a1 = fma8(splat8(planes[U(p1 + xo)]), wv, a1)
                    a2 = fma8(splat8(planes[U(p2 + xo)]), wv, a2)
                    a3 = fma8(splat8(planes[U(p3 + xo)]), wv, a3)
                    a4 = fma8(splat8(planes[U(p4 + xo)]), wv, a4)
                    a5 = fma8(splat8(planes[U(p5 + xo)]), wv, a5)
                    a6 = fma8(splat8(planes[U(p6 + xo)]), wv, a6)
                    a7 = fma8(splat8(planes[U(p7 + xo)]), wv, a7)
                    a8 = fma8(splat8(planes[U(p8 + xo)]), wv, a8)
                    a9 = fma8(splat8(planes[U(p9 + xo)]), wv, a9)
                    a10 = fma8(splat8(planes[U(p10 + xo)]), wv, a10)
                    a11 = fma8(splat8(planes[U(p11 + xo)]), wv, a11)
                r0 = (j - j0) * 8
                store8(res, U(r0), a0)
                store8(res, U(r0 + 8), a1)
                store8(res, U(r0 + 16), a2)
                store8(res, U(r0 + 24), a3)
                store8(res, U(r0 + 32), a4)
                store8(res, U(r0 + 40), a5)
                store8(res, U(r0 + 48), a6)
                store8(res, U(r0 + 56), a7)
                store8(res, U(r0 + 64), a8)
                store8(res, U(r0 + 72), a9)
                store8(res, U(r0 + 80), a10)
                store8(res, U(r0 + 88), a11)
                j += 12
            while j + 4 <= j1:
                a0, a1, a2, a3 = b, b, b, b
                p0, p1, p2, p3 = pix_in[U(j)], pix_in[U(j + 1)], pix_in[U(j + 2)], \
                    pix_in[U(j + 3)]
                for t in range(taps):
                    xo = xoff[U(t)]
                    wv = load8(wp, U(wb + t * 8))
                    a0 = fma8(splat8(planes[U(p0 + xo)]), wv, a0)
                    a1 = fma8(splat8(planes[U(p1 + xo)]), wv, a1)
                    a2 = fma8(splat8(planes[U(p2 + xo)]), wv, a2)
                    a3 = fma8(splat8(planes[U(p3 + xo)]), wv, a3)
                r0 = (j - j0) * 8
                store8(res, U(r0), a0)
                store8(res, U(r0 + 8), a1)
                store8(res, U(r0 + 16), a2)
                store8(res, U(r0 + 24), a3)
                j += 4
            while j < j1:
                a0 = b
                p0 = pix_in[U(j)]
                for t in range(taps):
                    a0 = fma8(splat8(planes[U(p0 + xoff[U(t)])]), load8(wp, U(wb + t * 8)), a0)
                store8(res, U((j - j0) * 8), a0)
                j += 1
            _store_chunk(res, 8, j0, j1, plane, m, blk * 8, nch, act, yf)


@jit()
def _tiles16(x, wp, xoff, pix_in, bias, has_bias, act, ph, pw, hp, wq, y):
    """:func:`_tiles` for convolutions of 12-16 output channels (a MobileNetV3's or MNASNet's
    3-channel stem): sixteen output channels (two vectors) by six pixels per tile, the
    weights packed in blocks of sixteen; each input value broadcast once for both vectors
    (eight loads a tap for twelve multiply-adds, where two blocks of :func:`_tiles8` take
    thirteen for twelve: MNASNet's and MobileNetV3's 2x3x64x64 stems, 16 outputs, 40.7 ->
    31.8 us); one pixel at a time at a chunk's end."""
    n, c, h, w = x.shape
    m, oh, ow = y.shape[1], y.shape[2], y.shape[3]
    taps = xoff.shape[0]
    npix = pix_in.shape[0]
    blocks = (m + 15) // 16
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    planes = _bordered(xf, n, c, h, w, ph, pw, hp, wq)
    res = np.empty(CHUNK * 16, np.float32)
    plane = oh * ow
    bp = _padded_bias(bias, has_bias, m, blocks * 16)
    for blk in range(blocks):
        wb = blk * taps * 16
        b0 = load8(bp, U(blk * 16))
        b1 = load8(bp, U(blk * 16 + 8))
        nch = min(16, m - blk * 16)
        for j0 in range(0, npix, CHUNK):
            j1 = min(npix, j0 + CHUNK)
            j = j0
            while j + 6 <= j1:
                a00, a01, a10, a11, a20, a21 = b0, b1, b0, b1, b0, b1
                a30, a31, a40, a41, a50, a51 = b0, b1, b0, b1, b0, b1
                p0, p1, p2 = pix_in[U(j)], pix_in[U(j + 1)], pix_in[U(j + 2)]
                p3, p4, p5 = pix_in[U(j + 3)], pix_in[U(j + 4)], pix_in[U(j + 5)]
                for t in range(taps):
                    xo = xoff[U(t)]
                    w0 = load8(wp, U(wb + t * 16))
                    w1 = load8(wp, U(wb + t * 16 + 8))
                    v = splat8(planes[U(p0 + xo)])
                    a00 = fma8(v, w0, a00)
                    a01 = fma8(v, w1, a01)
                    v = splat8(planes[U(p1 + xo)])
                    a10 = fma8(v, w0, a10)
                    a11 = fma8(v, w1, a11)
                    v = splat8(planes[U(p2 + xo)])
                    a20 = fma8(v, w0, a20)
                    a21 = fma8(v, w1, a21)
                    v = splat8(planes[U(p3 + xo)])
                    a30 = fma8(v, w0, a30)
                    a31 = fma8(v, w1, a31)
                    v = splat8(planes[U(p4 + xo)])
                    a40 = fma8(v, w0, a40)
                    a41 = fma8(v, w1, a41)
                    v = splat8(planes[U(p5 + xo)])
                    a50 = fma8(v, w0, a50)
                    a51 = fma8(v, w1, a51)
                r0 = (j - j0) * 16
                store8(res, U(r0), a00)
                store8(res, U(r0 + 8), a01)
                store8(res, U(r0 + 16), a10)
                store8(res, U(r0 + 24), a11)
                store8(res, U(r0 + 32), a20)
                store8(res, U(r0 + 40), a21)
                store8(res, U(r0 + 48), a30)
                store8(res, U(r0 + 56), a31)
                store8(res, U(r0 + 64), a40)
                store8(res, U(r0 + 72), a41)
                store8(res, U(r0 + 80), a50)
                store8(res, U(r0 + 88), a51)
                j += 6
            while j < j1:
                a00, a01 = b0, b1
                p0 = pix_in[U(j)]
                for t in range(taps):
                    v = splat8(planes[U(p0 + xoff[U(t)])])
                    a00 = fma8(v, load8(wp, U(wb + t * 16)), a00)
                    a01 = fma8(v, load8(wp, U(wb + t * 16 + 8)), a01)
                r0 = (j - j0) * 16
                store8(res, U(r0), a00)
                store8(res, U(r0 + 8), a01)
                j += 1
            _store_chunk(res, 16, j0, j1, plane, m, blk * 16, nch, act, yf)


class Tiled(PreparedCall):
    """A convolution's packed weights and tap offsets, made once at plan time; ``run`` does a
    call."""

    __slots__ = ("bound", "hp", "kernel", "pix_in", "wp", "wq", "xoff")

    def __init__(self, w: np.ndarray, plan, xshape):
        _path, (n, _m, oh, ow), s, pb, d, k, _chunk = plan
        c, h, wd = xshape[1], xshape[2], xshape[3]
        self.hp = hp = _padded_size(h, oh, k[0], s[0], pb[0], d[0])
        self.wq = wq = _padded_size(wd, ow, k[1], s[1], pb[1], d[1])
        size = block(w.shape[0]) or BLOCK
        self.wp = weights(w, size)
        self.kernel = {BLOCK: _tiles_wide if host_has_avx512() else _tiles,
                       MID_BLOCK: _tiles16, NARROW_BLOCK: _tiles8}[size]
        self.bound = [None]  # the kernel's machine code (_jit.entry), bound at the first call
        ch, i, j = np.meshgrid(np.arange(c), np.arange(k[0]), np.arange(k[1]), indexing="ij")
        self.xoff = ((ch * hp + i * d[0]) * wq + j * d[1]).astype(np.int64).ravel()
        img, oy, ox = np.meshgrid(np.arange(n), np.arange(oh), np.arange(ow), indexing="ij")
        self.pix_in = (img * (c * hp * wq) + oy * (s[0] * wq) + ox * s[1]).astype(np.int64).ravel()

    def run(self, X, bias, has_bias, act, plan, y):
        """The convolution of C-contiguous float32 ``X`` into ``y`` (C-contiguous)."""
        pb = plan[3]
        args = (X, self.wp, self.xoff, self.pix_in, bias, has_bias, act, pb[0], pb[1], self.hp,
                self.wq, y)
        return bound_call(self.bound, self.kernel, args, y)

    def direct(self, bias, has_bias, act, plan):
        pb = plan[3]
        return self.kernel, (Input(0), self.wp, self.xoff, self.pix_in, bias, has_bias, act,
                             pb[0], pb[1], self.hp, self.wq, Output())
