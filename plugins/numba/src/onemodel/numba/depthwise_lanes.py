"""The depthwise convolution of float32 planes with eight channels in the lanes of a vector
(:mod:`._simd`).

The channels-last kernel (``conv._depthwise_nhwc``) adds each tap into a row of all the
channels in memory: a load and a store of the sum for every multiply-add. Here each block of
eight channels is copied into a zero-bordered (rows, columns, 8) plane by 8x8 transposes in
registers; eight output pixels' sums stay in eight registers over all the taps (independent
sums: one alone waits on the previous multiply-add's latency), and the block's results go
back to its eight NCHW planes by the same transposes, the bias added first and the activation
applied. The border is multiplied like the plane (zeros times the weights), as the reference
does: infinite weights give what it gives.

Taken on one thread for float32 with a multiple of eight channels, when the CPU has AVX2 and
FMA (``_simd.host_has_fma``), for the shapes :func:`fits` admits, whatever path the plan
chose for the others; measured in docs/benchmarks.md, "Nineteenth round"."""

from __future__ import annotations

import numpy as np

from numba import njit

from ._jit import jit
from ._simd import fma8, host_has_fma, load8, store8, transpose8x8

# lanes compiles conv._activate_in_place into its own machine code; numba would keep that
# code cached after a change to conv.py alone, so the package's cache is dropped whenever
# any of its sources change (_cache.py)
from .conv import U, _activate_in_place

MAX_PLANE_BYTES = 1 << 20  # one block's bordered plane (eight channels)


def fits(plan, xshape, dtype, group) -> bool:
    """Whether a depthwise convolution (one output per input channel) goes by lanes, given
    constant weights nothing changes in place (the caller checks them and the thread mode).
    Where it measured faster than the plan's other kernels (python benchmarks/tiled_conv.py,
    one thread): at a stride (0.33-0.78x their time, 112x112 planes included), over at most
    8x8 outputs (0.44-0.68x), and for windows larger than 3x3 over at most 16x16 (0.59-0.85x).
    3x3 windows over 16x16 outputs and more at stride 1 keep theirs (1.05-1.56x); so do planes
    of fewer than eight outputs, whose pixels the tiles of eight leave one at a time."""
    _path, (_n, m, oh, ow), s, pb, d, k, _chunk = plan
    c = xshape[1]
    if dtype != np.float32 or group != c or m != c or c % 8 or min(pb) < 0 or \
            not host_has_fma():
        return False
    length = oh * ow
    hp = max(xshape[2] + pb[0], (oh - 1) * s[0] + (k[0] - 1) * d[0] + 1)
    wq = max(xshape[3] + pb[1], (ow - 1) * s[1] + (k[1] - 1) * d[1] + 1)
    if length < 8 or hp * wq * 32 > MAX_PLANE_BYTES:
        return False
    return s != (1, 1) or length <= 64 or (k[0] * k[1] > 9 and length <= 256)


class Geometry:
    """What a plan's calls share, made once: the bordered plane's size, each tap's offset into
    it and each output pixel's, in floats (eight per position)."""

    __slots__ = ("hp", "into", "pix", "taps", "wq")

    def __init__(self, plan, xshape):
        _path, (_n, _m, oh, ow), s, pb, d, k, _chunk = plan
        h, w = xshape[2], xshape[3]
        self.hp = max(h + pb[0], (oh - 1) * s[0] + (k[0] - 1) * d[0] + 1)
        self.wq = max(w + pb[1], (ow - 1) * s[1] + (k[1] - 1) * d[1] + 1)
        i, j = np.meshgrid(np.arange(k[0]), np.arange(k[1]), indexing="ij")
        self.taps = ((i * d[0] * self.wq + j * d[1]) * 8).astype(np.int64).ravel()
        oy, ox = np.meshgrid(np.arange(oh), np.arange(ow), indexing="ij")
        self.pix = ((oy * s[0] * self.wq + ox * s[1]) * 8).astype(np.int64).ravel()
        r, q = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        self.into = (((r + pb[0]) * self.wq + q + pb[1]) * 8).astype(np.int64).ravel()


@jit()
def copy_in(xf, src, hw, into, plane, pixels):
    """Eight NCHW planes of ``hw`` values from ``xf[src:]`` into the channels-last bordered
    ``plane`` at the offsets ``into`` (the border is left as it is); ``pixels``: 64 floats of
    scratch."""
    q = 0
    while q + 8 <= hw:  # eight input pixels (flat: rows of any width) at a time
        transpose8x8(xf, U(src + q), hw, pixels, U(0), 8)
        for i in range(8):
            store8(plane, U(into[U(q + i)]), load8(pixels, U(i * 8)))
        q += 8
    while q < hw:
        for lane in range(8):
            plane[U(into[U(q)] + lane)] = xf[U(src + lane * hw + q)]
        q += 1


@jit()
def copy_out(res, of, dst, length):
    """The channels-last results ``res`` of ``length`` pixels to eight NCHW planes at
    ``of[dst:]``."""
    p = 0
    while p + 8 <= length:
        transpose8x8(res, U(p * 8), 8, of, U(dst + p), length)
        p += 8
    while p < length:
        for lane in range(8):
            of[U(dst + lane * length + p)] = res[U(p * 8 + lane)]
        p += 1


@njit(cache=True, inline="always")
def store_eight(res, r0, a0, a1, a2, a3, a4, a5, a6, a7):
    """Eight pixels' vectors of eight channels to ``res[r0:r0 + 64]``, one after another
    (channels-last); inlined into the kernels' tiles, whose sums live in registers."""
    store8(res, U(r0), a0)
    store8(res, U(r0 + 8), a1)
    store8(res, U(r0 + 16), a2)
    store8(res, U(r0 + 24), a3)
    store8(res, U(r0 + 32), a4)
    store8(res, U(r0 + 40), a5)
    store8(res, U(r0 + 48), a6)
    store8(res, U(r0 + 56), a7)


@jit()
def lanes(x, wtt, taps, pix, into, hp, wq, bias, has_bias, act, out):
    """out[n, c] = act(bias[c] + sum over the taps of wtt[tap, c] * x[n, c] (window)), with
    ``wtt`` the (kh * kw, C) weights and ``taps``, ``pix``, ``into`` the offsets of
    :class:`Geometry`."""
    n_img, c = x.shape[0], x.shape[1]
    length = pix.shape[0]
    ntaps = taps.shape[0]
    hw = into.shape[0]
    xf = x.reshape(x.size)
    of = out.reshape(out.size)
    plane = np.zeros(hp * wq * 8, np.float32)  # the border stays zero for every block
    res = np.empty(length * 8, np.float32)
    pixels = np.empty(64, np.float32)
    zeros = np.zeros(8, np.float32)
    zero = np.float32(0.0)
    for img in range(n_img):
        for c0 in range(0, c, 8):
            copy_in(xf, (img * c + c0) * hw, hw, into, plane, pixels)
            start = load8(bias, U(c0)) if has_bias else load8(zeros, U(0))
            p = 0
            while p + 8 <= length:
                a0, a1, a2, a3 = start, start, start, start
                a4, a5, a6, a7 = start, start, start, start
                p0, p1, p2, p3 = pix[U(p)], pix[U(p + 1)], pix[U(p + 2)], pix[U(p + 3)]
                p4, p5, p6, p7 = pix[U(p + 4)], pix[U(p + 5)], pix[U(p + 6)], pix[U(p + 7)]
                for t in range(ntaps):
                    wv = load8(wtt, U(t * c + c0))
                    o = taps[U(t)]
                    a0 = fma8(load8(plane, U(p0 + o)), wv, a0)
                    a1 = fma8(load8(plane, U(p1 + o)), wv, a1)
                    a2 = fma8(load8(plane, U(p2 + o)), wv, a2)
                    a3 = fma8(load8(plane, U(p3 + o)), wv, a3)
                    a4 = fma8(load8(plane, U(p4 + o)), wv, a4)
                    a5 = fma8(load8(plane, U(p5 + o)), wv, a5)
                    a6 = fma8(load8(plane, U(p6 + o)), wv, a6)
                    a7 = fma8(load8(plane, U(p7 + o)), wv, a7)
                store_eight(res, p * 8, a0, a1, a2, a3, a4, a5, a6, a7)
                p += 8
            while p < length:  # the last pixels, one at a time
                a0 = start
                p0 = pix[U(p)]
                for t in range(ntaps):
                    a0 = fma8(load8(plane, U(p0 + taps[U(t)])), load8(wtt, U(t * c + c0)), a0)
                store8(res, U(p * 8), a0)
                p += 1
            if act:
                _activate_in_place(res, 0, length * 8, act, zero)
            copy_out(res, of, (img * c + c0) * length, length)
