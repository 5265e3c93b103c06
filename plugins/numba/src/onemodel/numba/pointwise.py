"""1x1 convolutions over small planes as a small matrix product on register tiles
(:mod:`._simd`): Y (M, pixels) = W (M, C) times X (C, pixels) for each image, plus the bias,
then the activation.

Why: MobileNet-style networks at small inputs run dozens of these, each of a few thousand to a
few hundred thousand multiply-adds (2x144x2x2 -> 24, 2x40x1x1 -> 240). The columns kernel's
dot products (``conv._small_conv``) and a BLAS call spend most of such a call around the
arithmetic: 1.2-3.9 us a call where the products take a fraction of one. Two tile shapes,
twelve vector sums kept in registers over the C input channels, whichever dimension is long
enough to fill the lanes:

- :func:`pixel_lanes`: eight pixels in a vector, four output channels by three vectors; each
  input channel's row is read as it lies in NCHW (when a plane is a multiple of eight
  pixels), the weights broadcast. Planes of another size are first gathered into (C, pixels
  of all the images) rows padded to eight.
- :func:`channel_lanes`: eight output channels in a vector (weights packed once into blocks
  of 32 channels, each one run in memory), 32 channels by three pixels; each input value
  broadcast. For wide outputs over a handful of pixels (1x1 and 2x2 planes), whose pixels
  would leave most lanes empty.

The bias starts the sums. The pixel lanes add a residual and apply a Relu in registers before
they store; other activations, and the channel lanes' outputs, are activated over the output
after. Chosen by :func:`fits` where it measured faster than the plan's other kernels (``python
benchmarks/tiled_conv.py``; docs/benchmarks.md, "Twentieth round")."""

from __future__ import annotations

import numpy as np

from ._jit import jit
from ._simd import (
    add8,
    add16,
    clamp8,
    clamp16,
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

# the kernels compile conv._activate_in_place into their own machine code; numba would keep
# that code cached after a change to conv.py alone, so the package's cache is dropped
# whenever any of its sources change (_cache.py)
from .conv import U, _activate_in_place, _clamp_bounds, _residual_in_place

PIXEL_LANES_ALWAYS = 16  # pixels in a plane
PIXEL_LANES_MAX_INPUT = 12 << 10  # floats in one image's input (C * pixels), not reached...
PIXEL_LANES_WIDE = 64  # ...unless there are this many output channels or more
PACK_MIN_OUTPUTS = 32  # output channels from which a tile's inputs are copied into a panel
# pixels in a plane from which only tiles that pack their inputs (PACK_MIN_OUTPUTS) are taken:
# rows read in place 4 KiB apart share L1 sets (2x8x32x32 -> 24: 1.2x BLAS, 2x32x32x32 -> 16:
# 1.9x); packed, 0.50-0.68x over 32x32 planes, 0.83-1.01x over 28x28 to 112x112 at 1x3x224x224
PIXEL_LANES_MAX_PLANE = 1024


def wide() -> bool:
    """Whether the kernels take sixteen lanes (``wide=True``): where the CPU has AVX-512 and
    numba keeps its vectors whole (:func:`._simd.host_has_avx512`)."""
    return host_has_avx512()


def fits(plan, xshape, wshape, group) -> bool:
    """Whether a float32 convolution of this plan is a small 1x1 product one of these
    kernels takes (given constant, immutable weights; the caller checks the dtype and the
    thread mode): where they measured faster than the plan's BLAS call or columns kernel
    (``python benchmarks/tiled_conv.py``, one thread).

    - Pixel lanes: planes of a multiple of eight pixels and a multiple of four output
      channels, over planes of at most 16 pixels, an image's input under 48 KiB, or 64 output
      channels or more (0.84-0.91x BLAS on DenseNet's and FCN's 1x1 convolutions over 8x8 and
      16x16 planes; with fewer outputs and a larger input, 0.95-1.09x: no gain to speak of);
      over planes of 1024 pixels or more, only with 32 output channels or more.
    - Channel lanes: planes of at most four pixels, or nine with 32 output channels or more
      (ten outputs over 3x3 planes: 1.22x; 7x7 planes 1.0-1.13x), however many multiply-adds:
      0.63-0.92x the register tiles (:mod:`.tiled`, which the caller would take instead) on
      the real suite's 2x2 planes past 512 K multiply-adds, 0.74-1.02x with the weights out
      of cache; SqueezeNet's 2x512x3x3 -> 64 0.56x the direct kernel."""
    return kernel(plan, xshape, group) is not None


def kernel(plan, xshape, group):
    """:func:`pixel_lanes`, :func:`channel_lanes` or None (:func:`fits`)."""
    _path, (_n, m, oh, ow), s, pb, _d, k, _chunk = plan
    if group != 1 or k != (1, 1) or s != (1, 1) or pb != (0, 0) or (oh, ow) != tuple(
            xshape[2:]) or not host_has_fma():
        return None
    c, plane = xshape[1], oh * ow
    if plane % 8 == 0:
        if m % 4:
            return None
        if plane >= PIXEL_LANES_MAX_PLANE:  # only with the tiles' inputs packed
            return pixel_lanes if m >= PACK_MIN_OUTPUTS else None
        if plane <= PIXEL_LANES_ALWAYS or c * plane < PIXEL_LANES_MAX_INPUT or \
                m >= PIXEL_LANES_WIDE:
            return pixel_lanes
        return None
    if plane <= 4 or (plane <= 9 and m >= 32):
        return channel_lanes
    return None


def packed_weights(w: np.ndarray, bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(M, C, 1, 1) weights -> the blocks :func:`channel_lanes` reads, and the bias padded to
    a multiple of eight (zeros without one). M is padded to eight with zero rows; each block
    of 32 output channels (8 past the last full 32) is stored channel-major, (C, 32) or
    (C, 8), the blocks one after another: a tile's weights are one run in memory, which the
    hardware prefetcher follows. Interleaved (C, M) rows read as a strided run took 1.5-2.7x
    as long with the weights out of cache (2x992x2x2 -> 128: 76.6 -> 35.9 us; 2x960x1x1 ->
    1280: 521 -> 192 us) and 1.0-1.7x in cache."""
    m, c = w.shape[0], w.shape[1]
    mpad = -(-m // 8) * 8
    rows = np.zeros((mpad, c), np.float32)
    rows[:m] = w.reshape(m, c)
    wp = np.empty(mpad * c, np.float32)
    mb = 0
    while mb < mpad:
        width = 32 if mb + 32 <= mpad else 8
        wp[mb * c:(mb + width) * c] = rows[mb:mb + width].T.ravel()
        mb += width
    bp = np.zeros(mpad, np.float32)
    if bias is not None:
        bp[:m] = bias
    return wp, bp


@jit()
def _rows_by_pixels(xf, x0, xstride, wf, bias, has_bias, c_in, m_out, vecs, of, o0, ostride,
                    panel, lo, hi, zf, has_z):
    """of[o0 + m * ostride + q] = bias[m] + sum over c of wf[m * c_in + c] *
    xf[x0 + c * xstride + q], for m < m_out and q < 8 * vecs: four output channels by three
    vectors of eight pixels per tile (two or one vector at the row's end, one channel at a
    time past the last four). Pixels outside, channels inside: a tile's C x 24 inputs stay in
    L1 while every output channel reads them (channels outside read all the inputs from L2
    once per four channels: DenseNet's 128 -> 128 over 16x16 planes 1.05 -> 0.90x BLAS)."""
    zero = np.float32(0.0)
    v = 0
    while v < vecs:
        nv = 3 if v + 3 <= vecs else (2 if v + 2 <= vecs else 1)
        q = 8 * v
        src, base, stride = xf, x0 + q, xstride
        if m_out >= PACK_MIN_OUTPUTS:
            # the tile's inputs, C rows of up to 24 pixels, copied into one contiguous panel:
            # rows read in place from planes of 16-256 pixels lie a power of two apart and
            # share a few L1 sets (2x128x16x16 -> 128: 0.90 -> 0.88x BLAS, 2x512x8x8 -> 128
            # 1.01 -> 0.90x); with fewer outputs the copy is not repaid (2x48x8x8 -> 8: 0.75 ->
            # 0.93x)
            for c in range(c_in):
                at = x0 + q + c * xstride
                for t in range(8 * nv):
                    panel[U(c * 24 + t)] = xf[U(at + t)]
            src, base, stride = panel, 0, 24
        m = 0
        while m < m_out:
            four = m + 4 <= m_out
            b0 = splat8(bias[m] if has_bias else zero)
            b1, b2, b3 = b0, b0, b0
            if four:
                b1 = splat8(bias[m + 1] if has_bias else zero)
                b2 = splat8(bias[m + 2] if has_bias else zero)
                b3 = splat8(bias[m + 3] if has_bias else zero)
            w0, w1, w2, w3 = m * c_in, (m + 1) * c_in, (m + 2) * c_in, (m + 3) * c_in
            ob = o0 + m * ostride + q
            if four and nv == 3:
                a00, a01, a02 = b0, b0, b0
                a10, a11, a12 = b1, b1, b1
                a20, a21, a22 = b2, b2, b2
                a30, a31, a32 = b3, b3, b3
                for c in range(c_in):
                    xc = base + c * stride
                    x0v = load8(src, U(xc))
                    x1v = load8(src, U(xc + 8))
                    x2v = load8(src, U(xc + 16))
                    s = splat8(wf[U(w0 + c)])
                    a00 = fma8(s, x0v, a00)
                    a01 = fma8(s, x1v, a01)
                    a02 = fma8(s, x2v, a02)
                    s = splat8(wf[U(w1 + c)])
                    a10 = fma8(s, x0v, a10)
                    a11 = fma8(s, x1v, a11)
                    a12 = fma8(s, x2v, a12)
                    s = splat8(wf[U(w2 + c)])
                    a20 = fma8(s, x0v, a20)
                    a21 = fma8(s, x1v, a21)
                    a22 = fma8(s, x2v, a22)
                    s = splat8(wf[U(w3 + c)])
                    a30 = fma8(s, x0v, a30)
                    a31 = fma8(s, x1v, a31)
                    a32 = fma8(s, x2v, a32)
                _put8(of, U(ob), a00, lo, hi, zf, has_z)
                _put8(of, U(ob + 8), a01, lo, hi, zf, has_z)
                _put8(of, U(ob + 16), a02, lo, hi, zf, has_z)
                ob += ostride
                _put8(of, U(ob), a10, lo, hi, zf, has_z)
                _put8(of, U(ob + 8), a11, lo, hi, zf, has_z)
                _put8(of, U(ob + 16), a12, lo, hi, zf, has_z)
                ob += ostride
                _put8(of, U(ob), a20, lo, hi, zf, has_z)
                _put8(of, U(ob + 8), a21, lo, hi, zf, has_z)
                _put8(of, U(ob + 16), a22, lo, hi, zf, has_z)
                ob += ostride
                _put8(of, U(ob), a30, lo, hi, zf, has_z)
                _put8(of, U(ob + 8), a31, lo, hi, zf, has_z)
                _put8(of, U(ob + 16), a32, lo, hi, zf, has_z)
            elif four and nv == 2:  # the row's last two vectors
                a00, a01 = b0, b0
                a10, a11 = b1, b1
                a20, a21 = b2, b2
                a30, a31 = b3, b3
                for c in range(c_in):
                    xc = base + c * stride
                    x0v = load8(src, U(xc))
                    x1v = load8(src, U(xc + 8))
                    s = splat8(wf[U(w0 + c)])
                    a00 = fma8(s, x0v, a00)
                    a01 = fma8(s, x1v, a01)
                    s = splat8(wf[U(w1 + c)])
                    a10 = fma8(s, x0v, a10)
                    a11 = fma8(s, x1v, a11)
                    s = splat8(wf[U(w2 + c)])
                    a20 = fma8(s, x0v, a20)
                    a21 = fma8(s, x1v, a21)
                    s = splat8(wf[U(w3 + c)])
                    a30 = fma8(s, x0v, a30)
                    a31 = fma8(s, x1v, a31)
                _put8(of, U(ob), a00, lo, hi, zf, has_z)
                _put8(of, U(ob + 8), a01, lo, hi, zf, has_z)
                ob += ostride
                _put8(of, U(ob), a10, lo, hi, zf, has_z)
                _put8(of, U(ob + 8), a11, lo, hi, zf, has_z)
                ob += ostride
                _put8(of, U(ob), a20, lo, hi, zf, has_z)
                _put8(of, U(ob + 8), a21, lo, hi, zf, has_z)
                ob += ostride
                _put8(of, U(ob), a30, lo, hi, zf, has_z)
                _put8(of, U(ob + 8), a31, lo, hi, zf, has_z)
            elif four:  # the row's last vector
                a00, a10, a20, a30 = b0, b1, b2, b3
                for c in range(c_in):
                    x0v = load8(src, U(base + c * stride))
                    a00 = fma8(splat8(wf[U(w0 + c)]), x0v, a00)
                    a10 = fma8(splat8(wf[U(w1 + c)]), x0v, a10)
                    a20 = fma8(splat8(wf[U(w2 + c)]), x0v, a20)
                    a30 = fma8(splat8(wf[U(w3 + c)]), x0v, a30)
                _put8(of, U(ob), a00, lo, hi, zf, has_z)
                _put8(of, U(ob + ostride), a10, lo, hi, zf, has_z)
                _put8(of, U(ob + 2 * ostride), a20, lo, hi, zf, has_z)
                _put8(of, U(ob + 3 * ostride), a30, lo, hi, zf, has_z)
            elif nv == 3:  # one of the last (m_out % 4) channels: three vectors
                a00, a01, a02 = b0, b0, b0
                for c in range(c_in):
                    xc = base + c * stride
                    s = splat8(wf[U(w0 + c)])
                    a00 = fma8(s, load8(src, U(xc)), a00)
                    a01 = fma8(s, load8(src, U(xc + 8)), a01)
                    a02 = fma8(s, load8(src, U(xc + 16)), a02)
                _put8(of, U(ob), a00, lo, hi, zf, has_z)
                _put8(of, U(ob + 8), a01, lo, hi, zf, has_z)
                _put8(of, U(ob + 16), a02, lo, hi, zf, has_z)
            else:  # one of the last channels, a vector at a time
                for t in range(nv):
                    a00 = b0
                    for c in range(c_in):
                        a00 = fma8(splat8(wf[U(w0 + c)]), load8(src, U(base + 8 * t + c * stride)),
                                   a00)
                    _put8(of, U(ob + 8 * t), a00, lo, hi, zf, has_z)
            m += 4 if four else 1
        v += nv


@jit()
def _rows_by_pixels16(xf, x0, xstride, wf, bias, has_bias, c_in, m_out, vecs, of, o0, ostride,
                      panel, lo, hi, zf, has_z):
    """:func:`_rows_by_pixels` on sixteen-lane vectors (AVX-512): ``vecs`` vectors of sixteen
    pixels. With eight output channels or more, eight channels by two vectors per tile
    (sixteen sums in flight: DenseNet's 2x256x16x16 -> 128 256 -> 228 us, 2x512x8x8 -> 128
    145 -> 127, against four channels by three vectors); with fewer, four channels by three
    vectors (48 pixels), two at the row's end. A last single vector goes eight output
    channels at a time (four sums would wait on the multiply-adds' latency: DenseNet's
    2x128x4x4 planes), then four, then one channel at a time; the inputs packed into a panel
    from PACK_MIN_OUTPUTS output channels, as there."""
    zero = np.float32(0.0)
    pairs = m_out >= 8  # tiles of eight channels by two vectors
    v = 0
    while v < vecs:
        if pairs:
            nv = 2 if v + 2 <= vecs else 1
        else:
            nv = 3 if v + 3 <= vecs else (2 if v + 2 <= vecs else 1)
        q = 16 * v
        src, base, stride = xf, x0 + q, xstride
        if m_out >= PACK_MIN_OUTPUTS:
            for c in range(c_in):
                at = x0 + q + c * xstride
                for t in range(16 * nv):
                    panel[U(c * 48 + t)] = xf[U(at + t)]
            src, base, stride = panel, 0, 48
        m = 0
        while nv == 1 and m + 8 <= m_out:  # one vector: eight channels, eight sums in flight
            w0 = m * c_in
            a0 = splat16(bias[m] if has_bias else zero)
            a1 = splat16(bias[m + 1] if has_bias else zero)
            a2 = splat16(bias[m + 2] if has_bias else zero)
            a3 = splat16(bias[m + 3] if has_bias else zero)
            a4 = splat16(bias[m + 4] if has_bias else zero)
            a5 = splat16(bias[m + 5] if has_bias else zero)
            a6 = splat16(bias[m + 6] if has_bias else zero)
            a7 = splat16(bias[m + 7] if has_bias else zero)
            for c in range(c_in):
                x0v = load16(src, U(base + c * stride))
                a0 = fma16(splat16(wf[U(w0 + c)]), x0v, a0)
                a1 = fma16(splat16(wf[U(w0 + c_in + c)]), x0v, a1)
                a2 = fma16(splat16(wf[U(w0 + 2 * c_in + c)]), x0v, a2)
                a3 = fma16(splat16(wf[U(w0 + 3 * c_in + c)]), x0v, a3)
                a4 = fma16(splat16(wf[U(w0 + 4 * c_in + c)]), x0v, a4)
                a5 = fma16(splat16(wf[U(w0 + 5 * c_in + c)]), x0v, a5)
                a6 = fma16(splat16(wf[U(w0 + 6 * c_in + c)]), x0v, a6)
                a7 = fma16(splat16(wf[U(w0 + 7 * c_in + c)]), x0v, a7)
            ob = o0 + m * ostride + q
            _put16(of, U(ob), a0, lo, hi, zf, has_z)
            _put16(of, U(ob + ostride), a1, lo, hi, zf, has_z)
            _put16(of, U(ob + 2 * ostride), a2, lo, hi, zf, has_z)
            _put16(of, U(ob + 3 * ostride), a3, lo, hi, zf, has_z)
            _put16(of, U(ob + 4 * ostride), a4, lo, hi, zf, has_z)
            _put16(of, U(ob + 5 * ostride), a5, lo, hi, zf, has_z)
            _put16(of, U(ob + 6 * ostride), a6, lo, hi, zf, has_z)
            _put16(of, U(ob + 7 * ostride), a7, lo, hi, zf, has_z)
            m += 8
        while nv == 2 and m + 8 <= m_out:  # eight channels by two vectors: sixteen sums
            w0 = m * c_in
            b = splat16(bias[m + 0] if has_bias else zero)
            e00, e01 = b, b
            b = splat16(bias[m + 1] if has_bias else zero)
            e10, e11 = b, b
            b = splat16(bias[m + 2] if has_bias else zero)
            e20, e21 = b, b
            b = splat16(bias[m + 3] if has_bias else zero)
            e30, e31 = b, b
            b = splat16(bias[m + 4] if has_bias else zero)
            e40, e41 = b, b
            b = splat16(bias[m + 5] if has_bias else zero)
            e50, e51 = b, b
            b = splat16(bias[m + 6] if has_bias else zero)
            e60, e61 = b, b
            b = splat16(bias[m + 7] if has_bias else zero)
            e70, e71 = b, b
            for c in range(c_in):
                xc = base + c * stride
                x0v = load16(src, U(xc))
                x1v = load16(src, U(xc + 16))
                s = splat16(wf[U(w0 + 0 * c_in + c)])
                e00 = fma16(s, x0v, e00)
                e01 = fma16(s, x1v, e01)
                s = splat16(wf[U(w0 + 1 * c_in + c)])
                e10 = fma16(s, x0v, e10)
                e11 = fma16(s, x1v, e11)
                s = splat16(wf[U(w0 + 2 * c_in + c)])
                e20 = fma16(s, x0v, e20)
                e21 = fma16(s, x1v, e21)
                s = splat16(wf[U(w0 + 3 * c_in + c)])
                e30 = fma16(s, x0v, e30)
                e31 = fma16(s, x1v, e31)
                s = splat16(wf[U(w0 + 4 * c_in + c)])
                e40 = fma16(s, x0v, e40)
                e41 = fma16(s, x1v, e41)
                s = splat16(wf[U(w0 + 5 * c_in + c)])
                e50 = fma16(s, x0v, e50)
                e51 = fma16(s, x1v, e51)
                s = splat16(wf[U(w0 + 6 * c_in + c)])
                e60 = fma16(s, x0v, e60)
                e61 = fma16(s, x1v, e61)
                s = splat16(wf[U(w0 + 7 * c_in + c)])
                e70 = fma16(s, x0v, e70)
                e71 = fma16(s, x1v, e71)
            ob = o0 + m * ostride + q
            _put16(of, U(ob + 0 * ostride), e00, lo, hi, zf, has_z)
            _put16(of, U(ob + 0 * ostride + 16), e01, lo, hi, zf, has_z)
            _put16(of, U(ob + 1 * ostride), e10, lo, hi, zf, has_z)
            _put16(of, U(ob + 1 * ostride + 16), e11, lo, hi, zf, has_z)
            _put16(of, U(ob + 2 * ostride), e20, lo, hi, zf, has_z)
            _put16(of, U(ob + 2 * ostride + 16), e21, lo, hi, zf, has_z)
            _put16(of, U(ob + 3 * ostride), e30, lo, hi, zf, has_z)
            _put16(of, U(ob + 3 * ostride + 16), e31, lo, hi, zf, has_z)
            _put16(of, U(ob + 4 * ostride), e40, lo, hi, zf, has_z)
            _put16(of, U(ob + 4 * ostride + 16), e41, lo, hi, zf, has_z)
            _put16(of, U(ob + 5 * ostride), e50, lo, hi, zf, has_z)
            _put16(of, U(ob + 5 * ostride + 16), e51, lo, hi, zf, has_z)
            _put16(of, U(ob + 6 * ostride), e60, lo, hi, zf, has_z)
            _put16(of, U(ob + 6 * ostride + 16), e61, lo, hi, zf, has_z)
            _put16(of, U(ob + 7 * ostride), e70, lo, hi, zf, has_z)
            _put16(of, U(ob + 7 * ostride + 16), e71, lo, hi, zf, has_z)
            m += 8
        while m < m_out:
            four = m + 4 <= m_out
            b0 = splat16(bias[m] if has_bias else zero)
            b1, b2, b3 = b0, b0, b0
            if four:
                b1 = splat16(bias[m + 1] if has_bias else zero)
                b2 = splat16(bias[m + 2] if has_bias else zero)
                b3 = splat16(bias[m + 3] if has_bias else zero)
            w0, w1, w2, w3 = m * c_in, (m + 1) * c_in, (m + 2) * c_in, (m + 3) * c_in
            ob = o0 + m * ostride + q
            if four and nv == 3:
                a00, a01, a02 = b0, b0, b0
                a10, a11, a12 = b1, b1, b1
                a20, a21, a22 = b2, b2, b2
                a30, a31, a32 = b3, b3, b3
                for c in range(c_in):
                    xc = base + c * stride
                    x0v = load16(src, U(xc))
                    x1v = load16(src, U(xc + 16))
                    x2v = load16(src, U(xc + 32))
                    s = splat16(wf[U(w0 + c)])
                    a00 = fma16(s, x0v, a00)
                    a01 = fma16(s, x1v, a01)
                    a02 = fma16(s, x2v, a02)
                    s = splat16(wf[U(w1 + c)])
                    a10 = fma16(s, x0v, a10)
                    a11 = fma16(s, x1v, a11)
                    a12 = fma16(s, x2v, a12)
                    s = splat16(wf[U(w2 + c)])
                    a20 = fma16(s, x0v, a20)
                    a21 = fma16(s, x1v, a21)
                    a22 = fma16(s, x2v, a22)
                    s = splat16(wf[U(w3 + c)])
                    a30 = fma16(s, x0v, a30)
                    a31 = fma16(s, x1v, a31)
                    a32 = fma16(s, x2v, a32)
                _put16(of, U(ob), a00, lo, hi, zf, has_z)
                _put16(of, U(ob + 16), a01, lo, hi, zf, has_z)
                _put16(of, U(ob + 32), a02, lo, hi, zf, has_z)
                ob += ostride
                _put16(of, U(ob), a10, lo, hi, zf, has_z)
                _put16(of, U(ob + 16), a11, lo, hi, zf, has_z)
                _put16(of, U(ob + 32), a12, lo, hi, zf, has_z)
                ob += ostride
                _put16(of, U(ob), a20, lo, hi, zf, has_z)
                _put16(of, U(ob + 16), a21, lo, hi, zf, has_z)
                _put16(of, U(ob + 32), a22, lo, hi, zf, has_z)
                ob += ostride
                _put16(of, U(ob), a30, lo, hi, zf, has_z)
                _put16(of, U(ob + 16), a31, lo, hi, zf, has_z)
                _put16(of, U(ob + 32), a32, lo, hi, zf, has_z)
            elif four and nv == 2:  # the row's last two vectors
                a00, a01 = b0, b0
                a10, a11 = b1, b1
                a20, a21 = b2, b2
                a30, a31 = b3, b3
                for c in range(c_in):
                    xc = base + c * stride
                    x0v = load16(src, U(xc))
                    x1v = load16(src, U(xc + 16))
                    s = splat16(wf[U(w0 + c)])
                    a00 = fma16(s, x0v, a00)
                    a01 = fma16(s, x1v, a01)
                    s = splat16(wf[U(w1 + c)])
                    a10 = fma16(s, x0v, a10)
                    a11 = fma16(s, x1v, a11)
                    s = splat16(wf[U(w2 + c)])
                    a20 = fma16(s, x0v, a20)
                    a21 = fma16(s, x1v, a21)
                    s = splat16(wf[U(w3 + c)])
                    a30 = fma16(s, x0v, a30)
                    a31 = fma16(s, x1v, a31)
                _put16(of, U(ob), a00, lo, hi, zf, has_z)
                _put16(of, U(ob + 16), a01, lo, hi, zf, has_z)
                ob += ostride
                _put16(of, U(ob), a10, lo, hi, zf, has_z)
                _put16(of, U(ob + 16), a11, lo, hi, zf, has_z)
                ob += ostride
                _put16(of, U(ob), a20, lo, hi, zf, has_z)
                _put16(of, U(ob + 16), a21, lo, hi, zf, has_z)
                ob += ostride
                _put16(of, U(ob), a30, lo, hi, zf, has_z)
                _put16(of, U(ob + 16), a31, lo, hi, zf, has_z)
            elif four:  # the row's last vector
                a00, a10, a20, a30 = b0, b1, b2, b3
                for c in range(c_in):
                    x0v = load16(src, U(base + c * stride))
                    a00 = fma16(splat16(wf[U(w0 + c)]), x0v, a00)
                    a10 = fma16(splat16(wf[U(w1 + c)]), x0v, a10)
                    a20 = fma16(splat16(wf[U(w2 + c)]), x0v, a20)
                    a30 = fma16(splat16(wf[U(w3 + c)]), x0v, a30)
                _put16(of, U(ob), a00, lo, hi, zf, has_z)
                _put16(of, U(ob + ostride), a10, lo, hi, zf, has_z)
                _put16(of, U(ob + 2 * ostride), a20, lo, hi, zf, has_z)
                _put16(of, U(ob + 3 * ostride), a30, lo, hi, zf, has_z)
            else:  # one of the last (m_out % 4) channels, a vector at a time
                for t in range(nv):
                    a00 = b0
                    for c in range(c_in):
                        a00 = fma16(splat16(wf[U(w0 + c)]),
                                    load16(src, U(base + 16 * t + c * stride)), a00)
                    _put16(of, U(ob + 16 * t), a00, lo, hi, zf, has_z)
            m += 4 if four else 1
        v += nv


@jit()
def _rows(xf, x0, xstride, wf, bias, has_bias, c_in, m_out, pixels, of, o0, ostride, panel,
          wide, lo, hi, zf, has_z):
    """The rows of ``pixels`` (a multiple of eight) output pixels: by :func:`_rows_by_pixels16`
    while sixteen are left when ``wide``, the rest by :func:`_rows_by_pixels`; each sum
    stored by :func:`_put8` or :func:`_put16`."""
    done = 0
    if wide and pixels >= 16:
        _rows_by_pixels16(xf, x0, xstride, wf, bias, has_bias, c_in, m_out, pixels // 16, of,
                          o0, ostride, panel, lo, hi, zf, has_z)
        done = pixels // 16 * 16
    if done < pixels:
        _rows_by_pixels(xf, x0 + done, xstride, wf, bias, has_bias, c_in, m_out,
                        (pixels - done) // 8, of, o0 + done, ostride, panel, lo, hi, zf, has_z)


@jit()
def _put8(of, at, v, lo, hi, zf, has_z):
    """of[at:at + 8] = v, plus zf[at:at + 8] where ``has_z`` (a residual), clamped to ``lo``
    and ``hi`` (conv.py's ``_clamp_bounds``: a Relu or Relu6, or nothing): the output finished in
    registers. A pass over the whole output after the products read and wrote it again from
    L2 (2x64x16x16 -> 128 with a Relu: 4.4 us of 58)."""
    if has_z:
        v = add8(v, load8(zf, at))
    store8(of, at, clamp8(v, splat8(lo), splat8(hi)))


@jit()
def _put16(of, at, v, lo, hi, zf, has_z):
    """:func:`_put8` on sixteen lanes."""
    if has_z:
        v = add16(v, load16(zf, at))
    store16(of, at, clamp16(v, splat16(lo), splat16(hi)))


@jit()
def pixel_lanes(x, wf, bias, has_bias, act, y, wide=False):
    """y = act(conv1x1(x) + bias) for C-contiguous float32 NCHW ``x`` and ``y``, ``wf`` the
    weights flat (M * C): eight pixels in a vector (module docstring), sixteen where ``wide``
    (:data:`WIDE`: AVX-512)."""
    _pixel_products(x, wf, bias, has_bias, act, y, y, False, wide)


@jit()
def pixel_lanes_residual(x, wf, bias, has_bias, act, z, y, wide=False):
    """:func:`pixel_lanes` with ``z`` (C-contiguous, of y's shape) added before the
    activation: a residual FusedConv, whose Add was a step of its own."""
    _pixel_products(x, wf, bias, has_bias, act, z, y, True, wide)


@jit()
def _pixel_products(x, wf, bias, has_bias, act, z, y, has_z, wide):
    """y = act(conv1x1(x) + bias + z), z only where ``has_z``. The residual, and a Relu or
    Relu6, are applied in registers as the tiles store their sums where each image's rows are
    read as they lie; other activations, and planes gathered into rows, over the output
    after."""
    n_img, c_in = x.shape[0], x.shape[1]
    m_out = y.shape[1]
    plane = y.size // (n_img * m_out)
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    zf = z.reshape(z.size)
    panel = np.empty(c_in * 48, np.float32)
    if plane % 8 == 0:  # each image's rows as they lie
        lo, hi, done = _clamp_bounds(act)
        for img in range(n_img):
            _rows(xf, img * c_in * plane, plane, wf, bias, has_bias, c_in, m_out, plane, yf,
                  img * m_out * plane, plane, panel, wide, lo, hi, zf, has_z)
        if not done:
            _activate_in_place(yf, 0, yf.shape[0], act, np.float32(0.0))
    else:  # the pixels of all the images gathered into rows padded to eight, then scattered
        width = -(-(n_img * plane) // 8) * 8
        xt = np.zeros(c_in * width, np.float32)
        for img in range(n_img):
            for c in range(c_in):
                src = (img * c_in + c) * plane
                dst = c * width + img * plane
                for p in range(plane):
                    xt[U(dst + p)] = xf[U(src + p)]
        res = np.empty(m_out * width, np.float32)
        inf = np.float32(np.inf)
        # (offsets of the type the branch above passes, not literal zeros, and pixel_lanes's
        # literal False: with literal zeros numba compiled _rows and every tile under it once
        # more: ResNet-50's first run from a cold cache took 24.9-30.0 s, 22.7-23.5 s without)
        _rows(xt, np.int64(0), width, wf, bias, has_bias, c_in, m_out, width, res, np.int64(0),
              width, panel, wide, -inf, inf, res, False)
        for img in range(n_img):
            for m in range(m_out):
                src = m * width + img * plane
                dst = (img * m_out + m) * plane
                for p in range(plane):
                    yf[U(dst + p)] = res[U(src + p)]
        if has_z:
            _residual_in_place(yf, zf, act, np.float32(0.0))
        else:
            _activate_in_place(yf, 0, yf.shape[0], act, np.float32(0.0))


@jit()
def channel_lanes(x, wp, bp, act, y, wide=False):
    """y = act(conv1x1(x) + bias) for C-contiguous float32 NCHW ``x`` and ``y``, with the
    weights and bias of :func:`packed_weights`: eight output channels in a vector, three
    pixels (of the images' flat pixel order) per tile; the last tile repeats its last pixel
    and stores only the pixels there are. Blocks of channels outside, pixels inside: each
    weight is read from memory once, however many pixels there are. Where ``wide``
    (:func:`wide`: AVX-512), two blocks of 32 at a time on sixteen lanes
    (:func:`_two_blocks16`)."""
    _channel_products(x, wp, bp, y, wide)
    _activate_in_place(y.reshape(y.size), 0, y.size, act, np.float32(0.0))


@jit()
def channel_lanes_residual(x, wp, bp, act, z, y, wide=False):
    """:func:`channel_lanes` with ``z`` (C-contiguous, of y's shape) added before the
    activation (see :func:`pixel_lanes_residual`)."""
    _channel_products(x, wp, bp, y, wide)
    _residual_in_place(y.reshape(y.size), z.reshape(z.size), act, np.float32(0.0))


# each lanes kernel's variant that adds a residual Z before its activation
RESIDUAL = {pixel_lanes: pixel_lanes_residual, channel_lanes: channel_lanes_residual}


@jit()
def _two_blocks16(xf, wp, bp, c_in, plane, npix, mpad, mb, res):
    """Output channels mb..mb + 64 (two of :func:`packed_weights`' blocks of 32, each read as
    it lies) of every pixel into ``res`` (pixel, channel): four sixteen-lane vectors by three
    pixels per tile, twelve sums in registers as on eight lanes; two, then one pixel at the
    end."""
    wa, wb = mb * c_in, (mb + 32) * c_in
    j = 0
    while j < npix:
        left = npix - j
        p0 = (j // plane) * c_in * plane + j % plane
        j1, j2 = min(j + 1, npix - 1), min(j + 2, npix - 1)
        p1 = (j1 // plane) * c_in * plane + j1 % plane
        p2 = (j2 // plane) * c_in * plane + j2 % plane
        r0 = j * mpad + mb
        a00 = load16(bp, U(mb))
        a01 = load16(bp, U(mb + 16))
        a02 = load16(bp, U(mb + 32))
        a03 = load16(bp, U(mb + 48))
        if left >= 3:
            a10, a11, a12, a13 = a00, a01, a02, a03
            a20, a21, a22, a23 = a00, a01, a02, a03
            for c in range(c_in):
                w0 = load16(wp, U(wa + c * 32))
                w1 = load16(wp, U(wa + c * 32 + 16))
                w2 = load16(wp, U(wb + c * 32))
                w3 = load16(wp, U(wb + c * 32 + 16))
                xo = c * plane
                s = splat16(xf[U(p0 + xo)])
                a00 = fma16(s, w0, a00)
                a01 = fma16(s, w1, a01)
                a02 = fma16(s, w2, a02)
                a03 = fma16(s, w3, a03)
                s = splat16(xf[U(p1 + xo)])
                a10 = fma16(s, w0, a10)
                a11 = fma16(s, w1, a11)
                a12 = fma16(s, w2, a12)
                a13 = fma16(s, w3, a13)
                s = splat16(xf[U(p2 + xo)])
                a20 = fma16(s, w0, a20)
                a21 = fma16(s, w1, a21)
                a22 = fma16(s, w2, a22)
                a23 = fma16(s, w3, a23)
            store16(res, U(r0), a00)
            store16(res, U(r0 + 16), a01)
            store16(res, U(r0 + 32), a02)
            store16(res, U(r0 + 48), a03)
            r0 += mpad
            store16(res, U(r0), a10)
            store16(res, U(r0 + 16), a11)
            store16(res, U(r0 + 32), a12)
            store16(res, U(r0 + 48), a13)
            r0 += mpad
            store16(res, U(r0), a20)
            store16(res, U(r0 + 16), a21)
            store16(res, U(r0 + 32), a22)
            store16(res, U(r0 + 48), a23)
            j += 3
        elif left == 2:
            a10, a11, a12, a13 = a00, a01, a02, a03
            for c in range(c_in):
                w0 = load16(wp, U(wa + c * 32))
                w1 = load16(wp, U(wa + c * 32 + 16))
                w2 = load16(wp, U(wb + c * 32))
                w3 = load16(wp, U(wb + c * 32 + 16))
                xo = c * plane
                s = splat16(xf[U(p0 + xo)])
                a00 = fma16(s, w0, a00)
                a01 = fma16(s, w1, a01)
                a02 = fma16(s, w2, a02)
                a03 = fma16(s, w3, a03)
                s = splat16(xf[U(p1 + xo)])
                a10 = fma16(s, w0, a10)
                a11 = fma16(s, w1, a11)
                a12 = fma16(s, w2, a12)
                a13 = fma16(s, w3, a13)
            store16(res, U(r0), a00)
            store16(res, U(r0 + 16), a01)
            store16(res, U(r0 + 32), a02)
            store16(res, U(r0 + 48), a03)
            r0 += mpad
            store16(res, U(r0), a10)
            store16(res, U(r0 + 16), a11)
            store16(res, U(r0 + 32), a12)
            store16(res, U(r0 + 48), a13)
            j += 2
        else:
            for c in range(c_in):
                s = splat16(xf[U(p0 + c * plane)])
                a00 = fma16(s, load16(wp, U(wa + c * 32)), a00)
                a01 = fma16(s, load16(wp, U(wa + c * 32 + 16)), a01)
                a02 = fma16(s, load16(wp, U(wb + c * 32)), a02)
                a03 = fma16(s, load16(wp, U(wb + c * 32 + 16)), a03)
            store16(res, U(r0), a00)
            store16(res, U(r0 + 16), a01)
            store16(res, U(r0 + 32), a02)
            store16(res, U(r0 + 48), a03)
            j += 1


@jit()
def _channel_products(x, wp, bp, y, wide_lanes):
    """y = conv1x1(x) + bias: :func:`channel_lanes` before its activation."""
    n_img, c_in = x.shape[0], x.shape[1]
    m_out = y.shape[1]
    plane = y.size // (n_img * m_out)
    mpad = bp.shape[0]
    npix = n_img * plane
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    res = np.empty((npix + 2) * mpad, np.float32)  # (pixel, channel), the repeats past npix
    mb = 0
    while wide_lanes and mb + 64 <= mpad:  # two blocks of 32 on sixteen lanes
        _two_blocks16(xf, wp, bp, c_in, plane, npix, mpad, mb, res)
        mb += 64
    while mb < mpad:
        wide = mb + 32 <= mpad
        j = 0
        while j < npix:
            left = npix - j
            j1, j2 = min(j + 1, npix - 1), min(j + 2, npix - 1)
            p0 = (j // plane) * c_in * plane + j % plane
            p1 = (j1 // plane) * c_in * plane + j1 % plane
            p2 = (j2 // plane) * c_in * plane + j2 % plane
            r0 = j * mpad + mb
            if wide and left >= 3:
                a00 = load8(bp, U(mb))
                a01 = load8(bp, U(mb + 8))
                a02 = load8(bp, U(mb + 16))
                a03 = load8(bp, U(mb + 24))
                a10, a11, a12, a13 = a00, a01, a02, a03
                a20, a21, a22, a23 = a00, a01, a02, a03
                for c in range(c_in):
                    wo = mb * c_in + c * 32
                    w0 = load8(wp, U(wo))
                    w1 = load8(wp, U(wo + 8))
                    w2 = load8(wp, U(wo + 16))
                    w3 = load8(wp, U(wo + 24))
                    xo = c * plane
                    s = splat8(xf[U(p0 + xo)])
                    a00 = fma8(s, w0, a00)
                    a01 = fma8(s, w1, a01)
                    a02 = fma8(s, w2, a02)
                    a03 = fma8(s, w3, a03)
                    s = splat8(xf[U(p1 + xo)])
                    a10 = fma8(s, w0, a10)
                    a11 = fma8(s, w1, a11)
                    a12 = fma8(s, w2, a12)
                    a13 = fma8(s, w3, a13)
                    s = splat8(xf[U(p2 + xo)])
                    a20 = fma8(s, w0, a20)
                    a21 = fma8(s, w1, a21)
                    a22 = fma8(s, w2, a22)
                    a23 = fma8(s, w3, a23)
                store8(res, U(r0), a00)
                store8(res, U(r0 + 8), a01)
                store8(res, U(r0 + 16), a02)
                store8(res, U(r0 + 24), a03)
                r0 += mpad
                store8(res, U(r0), a10)
                store8(res, U(r0 + 8), a11)
                store8(res, U(r0 + 16), a12)
                store8(res, U(r0 + 24), a13)
                r0 += mpad
                store8(res, U(r0), a20)
                store8(res, U(r0 + 8), a21)
                store8(res, U(r0 + 16), a22)
                store8(res, U(r0 + 24), a23)
                j += 3
            elif wide and left == 2:  # the last two pixels (two images of 1x1 planes)
                a00 = load8(bp, U(mb))
                a01 = load8(bp, U(mb + 8))
                a02 = load8(bp, U(mb + 16))
                a03 = load8(bp, U(mb + 24))
                a10, a11, a12, a13 = a00, a01, a02, a03
                for c in range(c_in):
                    wo = mb * c_in + c * 32
                    w0 = load8(wp, U(wo))
                    w1 = load8(wp, U(wo + 8))
                    w2 = load8(wp, U(wo + 16))
                    w3 = load8(wp, U(wo + 24))
                    xo = c * plane
                    s = splat8(xf[U(p0 + xo)])
                    a00 = fma8(s, w0, a00)
                    a01 = fma8(s, w1, a01)
                    a02 = fma8(s, w2, a02)
                    a03 = fma8(s, w3, a03)
                    s = splat8(xf[U(p1 + xo)])
                    a10 = fma8(s, w0, a10)
                    a11 = fma8(s, w1, a11)
                    a12 = fma8(s, w2, a12)
                    a13 = fma8(s, w3, a13)
                store8(res, U(r0), a00)
                store8(res, U(r0 + 8), a01)
                store8(res, U(r0 + 16), a02)
                store8(res, U(r0 + 24), a03)
                r0 += mpad
                store8(res, U(r0), a10)
                store8(res, U(r0 + 8), a11)
                store8(res, U(r0 + 16), a12)
                store8(res, U(r0 + 24), a13)
                j += 2
            elif wide:  # the last pixel
                a00 = load8(bp, U(mb))
                a01 = load8(bp, U(mb + 8))
                a02 = load8(bp, U(mb + 16))
                a03 = load8(bp, U(mb + 24))
                for c in range(c_in):
                    wo = mb * c_in + c * 32
                    s = splat8(xf[U(p0 + c * plane)])
                    a00 = fma8(s, load8(wp, U(wo)), a00)
                    a01 = fma8(s, load8(wp, U(wo + 8)), a01)
                    a02 = fma8(s, load8(wp, U(wo + 16)), a02)
                    a03 = fma8(s, load8(wp, U(wo + 24)), a03)
                store8(res, U(r0), a00)
                store8(res, U(r0 + 8), a01)
                store8(res, U(r0 + 16), a02)
                store8(res, U(r0 + 24), a03)
                j += 1
            else:  # eight channels of the last 8, 16 or 24
                a00 = load8(bp, U(mb))
                a10, a20 = a00, a00
                for c in range(c_in):
                    w0 = load8(wp, U(mb * c_in + c * 8))
                    xo = c * plane
                    a00 = fma8(splat8(xf[U(p0 + xo)]), w0, a00)
                    a10 = fma8(splat8(xf[U(p1 + xo)]), w0, a10)
                    a20 = fma8(splat8(xf[U(p2 + xo)]), w0, a20)
                store8(res, U(r0), a00)
                store8(res, U(r0 + mpad), a10)
                store8(res, U(r0 + 2 * mpad), a20)
                j += 3
        mb += 32 if wide else 8
    for j in range(npix):
        ob = (j // plane) * m_out * plane + j % plane
        for m in range(m_out):
            yf[U(ob + m * plane)] = res[U(j * mpad + m)]
