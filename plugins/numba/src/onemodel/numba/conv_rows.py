"""Convolutions of a few input channels (a network's stem: an RGB image into its first
features) on sixteen-lane output rows (AVX-512).

Why: the register tiles (:mod:`.tiled`) keep 32 output channels of a few pixels in a register
and store them to NCHW by 8x8 transposes. Over the 27 taps of a 3-channel 3x3 stem those
stores cost as much as the products: 34 of 81 us for SqueezeNet's 2x3x64x64 -> 64 at
stride 2, 46 of 75 for EfficientNet-B0's -> 32 (planes of 1024 pixels put the eight rows a
transpose writes 4 KiB apart, in one set of L1). Here a register holds sixteen pixels of one
output row and one channel, so the sums go to NCHW as they are:

- The input is copied once into zero-bordered planes, each row split into its column phases
  at the stride (stride 2: the even columns, then the odd ones, by the strided pools'
  shuffles), so every tap of sixteen output pixels is one contiguous load.
- A tile is eight output channels by two vectors (32 pixels of a row): sixteen sums over the
  C * kh * kw taps, each tap two loads and eight broadcast weights; by one vector where at
  most sixteen pixels of the row are left.
- The sums start at the bias; a Relu or Relu6 is applied in registers, other activations
  over the stored row after. The row's end is stored with masked stores.

Chosen by :func:`fits` (conv.py's ``_prepared_weights``, before the tiles)."""

from __future__ import annotations

import numpy as np

# _rows compiles conv._activate_in_place into its own machine code; numba would keep that
# code cached after a change to conv.py alone, so the package's cache is dropped whenever
# any of its sources change (_cache.py)
from onemodel.tensors.ops.specialize import Input, Output

from ._jit import jit
from ._simd import (
    clamp16,
    evens16,
    fma16,
    host_has_avx512,
    load16,
    load16_masked,
    odds16,
    splat16,
    store16,
    store16_masked,
)
from .conv import PreparedCall, U, _activate_in_place, _clamp_bounds, bound_call

MAX_INPUTS = 4  # input channels: a stem's image (the tiles take convolutions of more)
BLOCK = 8  # output channels per tile
MAX_PLANES_BYTES = 1 << 20  # the phase planes of all the images, which stay in L2


def fits(plan, xshape, wshape, group) -> bool:
    """Whether a float32 convolution of this plan goes by output rows (given constant,
    immutable weights; the caller checks the dtype and the thread mode): a 2-D convolution
    of at most :data:`MAX_INPUTS` input channels, without dilation, at a column stride of 1
    or 2, on a CPU with AVX-512."""
    n, s, pb, d = plan[1][0], plan[2], plan[3], plan[4]
    if group != 1 or xshape[1] > MAX_INPUTS or d != (1, 1) or min(pb) < 0 or \
            s[1] not in (1, 2) or not host_has_avx512():
        return False
    hp, wph = _phase_shape(xshape, plan)
    return n * xshape[1] * hp * s[1] * wph * 4 <= MAX_PLANES_BYTES


def _phase_shape(xshape, plan) -> tuple[int, int]:
    """(rows, columns of one phase) of the bordered, phase-split planes: every tap of every
    output row inside, and the loads of a row's last 32 pixels too."""
    _path, (_n, _m, oh, ow), s, pb, _d, k, _chunk = plan
    hp = max(xshape[2] + pb[0], (oh - 1) * s[0] + k[0])
    wph = -(-ow // 32) * 32 + (k[1] - 1) // s[1] + 1
    return hp, -(-wph // 16) * 16


def weights(w: np.ndarray) -> np.ndarray:
    """(M, C, kh, kw) -> flat (blocks, C * kh * kw, 8): each tap's eight output channels side
    by side; channels past M are zero (computed, never stored)."""
    m = w.shape[0]
    taps = w[0].size
    blocks = -(-m // BLOCK)
    packed = np.zeros((blocks * BLOCK, taps), np.float32)
    packed[:m] = w.reshape(m, taps)
    return np.ascontiguousarray(packed.reshape(blocks, BLOCK, taps).transpose(0, 2, 1)).ravel()


@jit()
def _phases(x, ph, pw, sw, hp, wph):
    """``x`` (N, C, H, W) C-contiguous as zero-bordered rows (N, C, hp, sw, wph): row ``r``,
    phase ``f``, column ``q`` holds x[.., r - ph, q * sw + f - pw] (0 outside). Rows of x are
    read sixteen or 32 columns at a time, masked only at their ends."""
    n, c, h, w = x.shape
    xf = x.reshape(x.size)
    span = sw * wph  # one bordered row, all its phases
    planes = np.empty(n * c * hp * span, np.float32)
    zero = np.float32(0.0)
    for p in range(n * c):
        for r in range(hp):
            dst = (p * hp + r) * span
            if r < ph or r >= ph + h:  # a border row
                for q in range(span):
                    planes[U(dst + q)] = zero
                continue
            src = (p * h + r - ph) * w
            if sw == 1:  # column q is x's q - pw
                for q in range(0, wph, 16):
                    c0 = q - pw
                    if c0 >= 0 and c0 + 16 <= w:
                        v = load16(xf, U(src + c0))
                    else:
                        v = load16_masked(xf, src + c0, min(max(-c0, 0), 16),
                                          min(max(w - c0, 0), 16), zero)
                    store16(planes, U(dst + q), v)
            else:  # the even and the odd ones of 32 bordered columns
                for q in range(0, wph, 16):
                    c0 = 2 * q - pw  # x's column under bordered column 2q
                    if c0 >= 0 and c0 + 32 <= w:
                        a = load16(xf, U(src + c0))
                        b = load16(xf, U(src + c0 + 16))
                    else:
                        a = load16_masked(xf, src + c0, min(max(-c0, 0), 16),
                                          min(max(w - c0, 0), 16), zero)
                        b = load16_masked(xf, src + c0 + 16, min(max(-c0 - 16, 0), 16),
                                          min(max(w - c0 - 16, 0), 16), zero)
                    store16(planes, U(dst + q), evens16(a, b))
                    store16(planes, U(dst + wph + q), odds16(a, b))
    return planes


@jit()
def _rows(x, wp, bias, has_bias, act, sh, sw, ph, pw, kh, kw, hp, wph, y):
    """y = act(conv(x) + bias) with the packed weights ``wp`` (:func:`weights`): for each
    image, block of eight output channels and output row, 32 pixels at a time."""
    n, c = x.shape[0], x.shape[1]
    m, oh, ow = y.shape[1], y.shape[2], y.shape[3]
    taps = c * kh * kw
    planes = _phases(x, ph, pw, sw, hp, wph)
    yf = y.reshape(y.size)
    zero = np.float32(0.0)
    # each tap's offset from its output row's first pixel in the phase planes
    toff = np.empty(taps, np.int64)
    t = 0
    for ch in range(c):
        for ky in range(kh):
            for kx in range(kw):
                toff[t] = ((ch * hp + ky) * sw + kx % sw) * wph + kx // sw
                t += 1
    bs = np.empty(8, np.float32)
    low, high, done = _clamp_bounds(act)
    lo, hi = splat16(low), splat16(high)
    for img in range(n):
        for mb in range(0, m, 8):
            wb = (mb // 8) * taps * 8
            for o in range(8):
                bs[o] = bias[mb + o] if has_bias and mb + o < m else zero
            for oy in range(oh):
                for x0 in range(0, ow, 32):
                    a0, a1, a2, a3 = splat16(bs[0]), splat16(bs[1]), splat16(bs[2]), \
                        splat16(bs[3])
                    a4, a5, a6, a7 = splat16(bs[4]), splat16(bs[5]), splat16(bs[6]), \
                        splat16(bs[7])
                    c0, c1, c2, c3, c4, c5, c6, c7 = a0, a1, a2, a3, a4, a5, a6, a7
                    base = (img * c * hp + oy * sh) * sw * wph + x0
                    one = ow - x0 <= 16  # one vector left: eight sums (c* stay the bias)
                    if one:
                        for t in range(taps):
                            va = load16(planes, U(base + toff[t]))
                            wo = wb + t * 8
                            a0 = fma16(splat16(wp[U(wo)]), va, a0)
                            a1 = fma16(splat16(wp[U(wo + 1)]), va, a1)
                            a2 = fma16(splat16(wp[U(wo + 2)]), va, a2)
                            a3 = fma16(splat16(wp[U(wo + 3)]), va, a3)
                            a4 = fma16(splat16(wp[U(wo + 4)]), va, a4)
                            a5 = fma16(splat16(wp[U(wo + 5)]), va, a5)
                            a6 = fma16(splat16(wp[U(wo + 6)]), va, a6)
                            a7 = fma16(splat16(wp[U(wo + 7)]), va, a7)
                    else:
                        for t in range(taps):
                            at = base + toff[t]
                            va = load16(planes, U(at))
                            vc = load16(planes, U(at + 16))
                            wo = wb + t * 8
                            w_ = splat16(wp[U(wo)])
                            a0 = fma16(w_, va, a0)
                            c0 = fma16(w_, vc, c0)
                            w_ = splat16(wp[U(wo + 1)])
                            a1 = fma16(w_, va, a1)
                            c1 = fma16(w_, vc, c1)
                            w_ = splat16(wp[U(wo + 2)])
                            a2 = fma16(w_, va, a2)
                            c2 = fma16(w_, vc, c2)
                            w_ = splat16(wp[U(wo + 3)])
                            a3 = fma16(w_, va, a3)
                            c3 = fma16(w_, vc, c3)
                            w_ = splat16(wp[U(wo + 4)])
                            a4 = fma16(w_, va, a4)
                            c4 = fma16(w_, vc, c4)
                            w_ = splat16(wp[U(wo + 5)])
                            a5 = fma16(w_, va, a5)
                            c5 = fma16(w_, vc, c5)
                            w_ = splat16(wp[U(wo + 6)])
                            a6 = fma16(w_, va, a6)
                            c6 = fma16(w_, vc, c6)
                            w_ = splat16(wp[U(wo + 7)])
                            a7 = fma16(w_, va, a7)
                            c7 = fma16(w_, vc, c7)
                    # a Relu or Relu6 as one clamp (no activation: none that bites)
                    a0, a1, a2, a3 = clamp16(a0, lo, hi), clamp16(a1, lo, hi), \
                        clamp16(a2, lo, hi), clamp16(a3, lo, hi)
                    a4, a5, a6, a7 = clamp16(a4, lo, hi), clamp16(a5, lo, hi), \
                        clamp16(a6, lo, hi), clamp16(a7, lo, hi)
                    c0, c1, c2, c3 = clamp16(c0, lo, hi), clamp16(c1, lo, hi), \
                        clamp16(c2, lo, hi), clamp16(c3, lo, hi)
                    c4, c5, c6, c7 = clamp16(c4, lo, hi), clamp16(c5, lo, hi), \
                        clamp16(c6, lo, hi), clamp16(c7, lo, hi)
                    left = ow - x0  # pixels of this row from x0: more than 32 stores 32
                    out = ((img * m + mb) * oh + oy) * ow + x0
                    step = oh * ow
                    nch = min(8, m - mb)
                    _store_pair(yf, out, left, a0, c0)
                    if nch > 1:
                        _store_pair(yf, out + step, left, a1, c1)
                    if nch > 2:
                        _store_pair(yf, out + 2 * step, left, a2, c2)
                    if nch > 3:
                        _store_pair(yf, out + 3 * step, left, a3, c3)
                    if nch > 4:
                        _store_pair(yf, out + 4 * step, left, a4, c4)
                    if nch > 5:
                        _store_pair(yf, out + 5 * step, left, a5, c5)
                    if nch > 6:
                        _store_pair(yf, out + 6 * step, left, a6, c6)
                    if nch > 7:
                        _store_pair(yf, out + 7 * step, left, a7, c7)
                    if not done:  # other activations over the stored pixels, in L1
                        for o in range(nch):
                            _activate_in_place(yf, out + o * step, min(left, 32), act, zero)


@jit()
def _store_pair(yf, at, left, a, b):
    """yf[at:at + min(left, 32)] = the first ``left`` lanes of ``a`` then ``b``."""
    if left >= 16:
        store16(yf, U(at), a)
        store16_masked(yf, at + 16, left - 16, b)
    else:
        store16_masked(yf, at, left, a)


class ConvRows(PreparedCall):
    """A convolution's packed weights and geometry, made once at plan time; ``run`` does a
    call."""

    __slots__ = ("bound", "hp", "kh", "kw", "wp", "wph")

    def __init__(self, w: np.ndarray, plan, xshape):
        self.hp, self.wph = _phase_shape(xshape, plan)
        self.kh, self.kw = plan[5]  # the window the planes were sized for
        self.wp = weights(w)
        self.bound = [None]  # the kernel's machine code (conv.bound_call)

    def run(self, X, bias, has_bias, act, plan, y):
        """The convolution of C-contiguous float32 ``X`` into ``y`` (C-contiguous)."""
        s, pb = plan[2], plan[3]
        args = (X, self.wp, bias, has_bias, act, s[0], s[1], pb[0], pb[1], self.kh, self.kw,
                self.hp, self.wph, y)
        return bound_call(self.bound, _rows, args, y)

    def direct(self, bias, has_bias, act, plan):
        s, pb = plan[2], plan[3]
        return _rows, (Input(0), self.wp, bias, has_bias, act, s[0], s[1], pb[0], pb[1],
                       self.kh, self.kw, self.hp, self.wph, Output())
