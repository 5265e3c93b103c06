"""Convolution (2-D, float32/float64) and its gradients. Columns are built by numba straight
from the NCHW input (padding and dilation on the fly, no transposes), then BLAS GEMMs: one per
image, writing the NCHW output in place, or, when each image's GEMM would be skinny (few output
pixels) or the weights too big to stay cached between images, ONE GEMM over the columns of all
the images side by side, so the weights are read once, its (M, N*oh*ow) result scattered to
NCHW by numba. Bias and activation are applied in the same pass as the scatter (or in one pass
over the output). 1x1 stride-1 convolutions skip the columns: the input already is the GEMM
operand. Small convolutions (a few tens of thousands of multiply-adds), where the calls around
BLAS cost more than the arithmetic, are one numba call doing columns, products, bias and
activation. Depthwise convolutions, where a GEMM has nothing to chew on, are direct numba loops:
channels-last for small planes with many channels, a table of the taps that land inside the
image for other small planes, a zero-padded plane (or its stride phases) per channel else; their
gradients use the tap table. What a (shapes, attributes) signature needs (geometry, path,
chunking) is worked out once and memoized."""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import numpy as np

from numba import prange, types
from numba.extending import overload
from onemodel.tensors.errors import DTypeError, ShapeError
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.nn import _convt_geometry, _geometry
from onemodel.tensors.ops.specialize import (
    CallSite,
    Constant,
    Direct,
    Input,
    Output,
    constant,
    constant_at,
    is_frozen,
    planned,
    specializer,
)

from . import _jit, depthwise
from ._jit import jit, pick, sync_threads
from ._prefetch import prefetch
from ._vecmath import erf32, sigmoid32

U = np.uint64
ACT_CODES = {"": 0, "Relu": 1, "Sigmoid": 2, "Tanh": 3, "HardSwish": 4, "Relu6": 5, "Silu": 6}
_COLS_BUDGET = 32 << 20  # bytes of im2col columns (or GEMM results) built at once
_NO_BIAS = {np.dtype(t): np.empty(0, t) for t in (np.float32, np.float64)}
_UNSET = object()  # no constant input planned: no array is this
# depthwise convolutions without a channel multiplier, with at least this many channels and
# output planes this small, run channels-last (vectorized over the channels): measured 2-10x
# faster than the per-channel kernels there; below 16 channels a vector is not filled
_NHWC_MIN_CHANNELS = 16
_NHWC_MAX_LENGTH = 64
_NHWC_MAX_LENGTH_STRIDED = 256
# strided depthwise outputs of at most this many pixels per plane take the tap-table kernel:
# measured faster there than the padded-plane (stride-phase) kernel, slower on larger planes
_TABLE_MAX_STRIDED = 64
# windows of up to this many taps over planes of this many output pixels (or more) take the
# written-out kernel (depthwise.py) rather than the channels-last one: 3x3 on 8x8 1.6-1.8x,
# 3x3 stride 2 on 16x16 3.9x faster; 5x5 and 7x7 on small planes stay channels-last (2-8x)
_TAPS_OVER_NHWC = 9
_TAPS_MIN_LENGTH = 64
_TAPS_MIN_LENGTH_STRIDED = 256
# stride-1 depthwise convolutions whose output has the input's size, over planes of at least
# this many pixels, take the whole-plane kernel (depthwise.flat_kernel): against the written-out
# padded-plane kernel 0.52x on 2x48x16x16 and 2x48x8x8 (3x3), 0.65x on 2x32x32x32, 0.78x on
# 2x96x56x56, 0.93x on 1x32x112x112, 0.69x for 7x7 on 2x96x14x14; against the channels-last one
# 0.57-0.71x on 8x8 planes (5x5 over 120 and 240 channels); on 4x4 and smaller planes with many
# channels the channels-last kernel stays ahead (1.3-5.5x), so they keep it (one thread, Relu6)
_FLAT_MIN_LENGTH = 64
# GEMM over the whole batch at once (the weights read once, the result scattered to NCHW) when
# each image's GEMM is skinny, or the weights are too big to stay in a core's cache between
# images; else one GEMM per image, writing the output in place
_ONE_GEMM_MAX_LENGTH = 64
# 1x1 convolutions of up to this many images: one np.dot per image instead of np.matmul's
# batched call, whose set-up dominated on small planes (2x96x2x2 -> 576 channels: 23 -> 13 us,
# 2x576x1x1 -> 1024: 79 -> 67 us, measured with the bias and activation pass included)
_DOT_MAX_IMAGES = 16
# float32 convolutions whose GEMM is this narrow (output pixels of the whole batch), this deep
# and with this much weight take the numba product (_skinny_gemm), which reads the weights
# once where OpenBLAS packs them first: 512 -> 512 3x3 over 2x2 (4608 x 8) 1008 -> 409 us,
# 1024 -> 512 1x1 over 2x2 (1024 x 8) 192 -> 105 us; narrower weights stay in BLAS
# (960 x 160 x 16: 73 against 83 us). Up to 20 columns: two images of 3x3 planes (SqueezeNet's
# last fire modules, 64 -> 256 3x3: 122 -> 82 us hot) took SqueezeNet to 0.978x paired (two runs
# of 100 pairs); at 32 columns (2x4x4) BLAS stayed ahead (256 -> 256 3x3: 522 against 691 us)
_SKINNY_MAX_WIDTH = 20
# 1x1 convolutions over 1x1 planes with weights below the limits above (squeeze-and-excitation)
# take the skinny product on up to this many images; deep, large weights follow the rule above,
# up to 20 images (17x512 -> 512: 230 -> 109 us, 20x2048 -> 512: 969 -> 475 us against BLAS,
# hot, one thread; measured by the round's review)
_SKINNY_MAX_IMAGES = 16
_SKINNY_MIN_ROWS = 256
_SKINNY_MIN_WEIGHTS = 256 << 10
_ONE_GEMM_MIN_WEIGHTS = 1 << 20
_TAPS_MAX = 1 << 20  # entries of a depthwise gradient's tap table (8 bytes each)
# convolutions (not depthwise) of at most this many multiply-adds run as one numba call
# (:func:`_small_conv`); up to the second figure when the batch's output planes hold at least
# _SMALL_WIDE pixels (the long rows its loops vectorize), up to the third on at most
# _SMALL_NARROW pixels (1x1 planes: a kernel of dot products along the weights). Measured
# against the columns (or the 1x1 GEMM) and BLAS, float32, one thread: 1.2-3.4 us against
# 4.2-5.8 us at 600-18k multiply-adds on 32 pixels, 1.0-2.4 us against 2.3-4.9 us at 2k-13k
# on 1x1 planes; ties at 18k-37k on 16 pixels, at 74k-150k on 32-128
_SMALL_MAX_WORK = 16384
_SMALL_MAX_WORK_WIDE = 98304
_SMALL_MAX_WORK_NARROW = 32768
_SMALL_WIDE = 32
# strided (ungrouped) convolutions over at least _SMALL_STRIDED_WIDE output pixels: their
# columns are a gather, so the one-call kernel stays ahead up to _SMALL_MAX_WORK_STRIDED
# (3x3 stride 2, float32, one thread, best of 7 loops: 8x8x8x8 -> 16 channels 14.1 -> 10.1 us,
# -> 32 channels 18.0 -> 13.0 us, 8x16x8x8 -> 32 channels 30.6 -> 24.3 us, 4x8x16x16 -> 8
# channels 15.0 -> 11.0 us; on 32 pixels they tie from 221k multiply-adds on)
_SMALL_STRIDED_WIDE = 128
_SMALL_MAX_WORK_STRIDED = 589824


# planes per task of the column builder: each task zero-pads its planes one after another in
# one scratch plane (its border stays zero), so a task allocates once
_PLANES_PER_TASK = 8
# strided convolutions build their columns from the stride's phases (_im2col_phased) with
# windows of this many taps or more, or 3x3 and larger windows over output rows this long
# (vector loops need 32 iterations), measured against the strided gather: 7x7 stride 2 on
# 1x3x224x224 581-860 -> 231-294 us, on 2x3x32x32 29-31 -> 19-20 us; 3x3 stride 2 on
# 1x64x112x112 938-1104 -> 652-941 us, 1x32x64x64 113 -> 96 us; but 1x64x56x56 (rows of 28)
# 193 -> 248 us, 1x128x28x28 77 -> 178 us, 5x5 on 1x96x28x28 224-231 -> 197-274 us, and
# 1x1 stride 2 (1x256x56x56) 113 -> 311 us. Only where windows overlap (a kernel wider than
# its stride on some axis): a window no wider than its stride (a ViT's or ConvNeXt's patches)
# reads each input once either way, and its phases only add a copy: 8x8 stride 8 on 2x3x32x32
# 7.5 against 14.8 us, 16x16 stride 16 on 1x3x224x224 60 against 107 us
_PHASES_MIN_TAPS = 49
_PHASES_MIN_ROW = 32
_BAND_MAX_OUT = 192
_BAND_MIN_COLUMNS = 4 << 20
_BAND_BYTES = 1 << 20
_CACHED_CHUNK_MIN_ROWS = 256
_CACHED_CHUNK_BYTES = 1 << 20


@jit(parallel=True)
def _im2col(x, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow, cols, by_image):
    """The columns of a batch of images: row (c, i, j), column (y, x) of image n holds
    x[n, c, y*sh - ph + i*dh, x*sw - pw + j*dw] (0 outside). ``cols`` is (N, C*kh*kw, oh*ow)
    when ``by_image`` (one GEMM per image), else (C*kh*kw, N, oh*ow): every image's columns
    side by side in one matrix, for one GEMM over the batch. Both arrays C-contiguous.

    Each (image, channel) plane is first copied into a zero-padded scratch plane, so every
    column row is a plain copy with no bounds logic: the stride-1 copies vectorize. Against
    bounds worked out per row this measured 18.1 -> 6.8 us on 8x3x16x16 (3x3, pad 1) and
    243 -> 153 us on 1x64x56x56 (docs/benchmarks.md, "Fifth round")."""
    n_img, c_in, h, w = x.shape
    kk = kh * kw
    rows = c_in * kk
    length = oh * ow
    hp = max((oh - 1) * sh + (kh - 1) * dh + 1, h + ph)  # rows the windows reach
    wp = max((ow - 1) * sw + (kw - 1) * dw + 1, w + pw)
    # flat offsets, no views: a view per row costs reference counting, which dominates the
    # short rows of small planes; unsigned indices skip numba's negative-index wraparound, so
    # the copies vectorize
    xf = x.reshape(x.size)
    cf = cols.reshape(cols.size)
    planes = n_img * c_in
    # no padding and every window inside the plane (a ViT's patches, valid convolutions): the
    # columns read the input itself, without the copy into a scratch plane (8x8 stride 8 on
    # 2x3x32x32: the copy was half the work)
    inside = ph == 0 and pw == 0 and hp <= h and wp <= w
    for task in prange((planes + _PLANES_PER_TASK - 1) // _PLANES_PER_TASK):
        pad = np.zeros(0 if inside else hp * wp, x.dtype)
        for t in range(task * _PLANES_PER_TASK, min(planes, (task + 1) * _PLANES_PER_TASK)):
            n = t // c_in
            c = t % c_in
            src = t * h * w
            if inside:
                plane, first, stride = xf, src, w
            else:
                for a in range(h):  # the plane inside its zero border
                    at = (a + ph) * wp + pw
                    for b in range(w):
                        pad[U(at + b)] = xf[U(src + a * w + b)]
                plane, first, stride = pad, 0, wp
            for i in range(kh):
                for j in range(kw):
                    r = c * kk + i * kw + j
                    row = ((n * rows + r) if by_image else (r * n_img + n)) * length
                    for y in range(oh):
                        at = first + (y * sh + i * dh) * stride + j * dw
                        base = row + y * ow
                        if sw == 1:
                            for q in range(ow):
                                cf[U(base + q)] = plane[U(at + q)]
                        else:
                            for q in range(ow):
                                cf[U(base + q)] = plane[U(at + q * sw)]


@jit(parallel=True)
def _im2col_phased(x, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow, cols, by_image):
    """:func:`_im2col` at a stride, from the stride's phases: each plane is copied once into
    the sh*sw phases of its zero-padded plane (:func:`_into_phases`), where every tap's row of
    a window is a contiguous run, so the column rows are plain copies (vectorized on long
    rows) instead of a strided gather per tap. :func:`_columns` says when this wins."""
    n_img, c_in, h, w = x.shape
    kk = kh * kw
    rows = c_in * kk
    length = oh * ow
    xf = x.reshape(x.size)
    cf = cols.reshape(cols.size)
    planes = n_img * c_in
    hq = oh + ((kh - 1) * dh) // sh + 1
    wq = ow + ((kw - 1) * dw) // sw
    for task in prange((planes + _PLANES_PER_TASK - 1) // _PLANES_PER_TASK):
        # padding positions are never written: they keep these zeros for every plane
        buf = np.zeros(sh * sw * hq * wq, x.dtype)
        for t in range(task * _PLANES_PER_TASK, min(planes, (task + 1) * _PLANES_PER_TASK)):
            n = t // c_in
            c = t % c_in
            _into_phases(xf, t * h * w, h, w, sh, sw, ph, pw, hq, wq, buf)
            for i in range(kh):
                for j in range(kw):
                    r = c * kk + i * kw + j
                    row = ((n * rows + r) if by_image else (r * n_img + n)) * length
                    tap = (((i * dh) % sh) * sw + (j * dw) % sw) * hq * wq + \
                        ((i * dh) // sh) * wq + (j * dw) // sw
                    for y in range(oh):
                        at = tap + y * wq
                        base = row + y * ow
                        for q in range(ow):
                            cf[U(base + q)] = buf[U(at + q)]


@jit(parallel=True)
def _im2col_band(x, img, kh, kw, sh, sw, ph, pw, dh, dw, ow, y0, ny, cols):
    """The columns of output rows [y0, y0 + ny) of image ``img``: row (c, i, j), column
    (y - y0, x) of the C-contiguous (C*kh*kw, ny*ow) ``cols`` holds
    x[img, c, y*sh - ph + i*dh, x*sw - pw + j*dw] (0 outside). As :func:`_im2col`, each
    channel's rows that the band's windows reach are first copied into a zero-padded
    scratch band, so every column row is a plain copy."""
    _, c_in, h, w = x.shape
    kk = kh * kw
    width = ny * ow
    hb = (ny - 1) * sh + (kh - 1) * dh + 1  # input rows the band's windows reach
    wp = max((ow - 1) * sw + (kw - 1) * dw + 1, w + pw)
    top = y0 * sh - ph  # the input row of the scratch band's first row
    a0 = max(0, -top)
    a1 = min(hb, h - top)
    xf = x.reshape(x.size)
    cf = cols.reshape(cols.size)
    for task in prange((c_in + _PLANES_PER_TASK - 1) // _PLANES_PER_TASK):
        # rows outside the image and the side borders are never written: they stay zero
        pad = np.zeros(hb * wp, x.dtype)
        for c in range(task * _PLANES_PER_TASK, min(c_in, (task + 1) * _PLANES_PER_TASK)):
            src = (img * c_in + c) * h * w
            for a in range(a0, a1):
                at = a * wp + pw
                s0 = src + (top + a) * w
                for b in range(w):
                    pad[U(at + b)] = xf[U(s0 + b)]
            for i in range(kh):
                for j in range(kw):
                    row = (c * kk + i * kw + j) * width
                    for y in range(ny):
                        at = (y * sh + i * dh) * wp + j * dw
                        base = row + y * ow
                        if sw == 1:
                            for q in range(ow):
                                cf[U(base + q)] = pad[U(at + q)]
                        else:
                            for q in range(ow):
                                cf[U(base + q)] = pad[U(at + q * sw)]


@jit(parallel=True)
def _store_band(res, bias, has_bias, act, y, at, length):
    """y[m * length + at + k] = act(res[m, k] + bias[m]): a band's (M, width) GEMM result
    into its place in one image's flat (M, length) output, bias and activation on the way.
    The loops repeat :func:`_scatter`'s: one helper called by both measured 1.3-3.4x slower
    on rows of 16-448 (LLVM does not inline it, so each row pays a call and its checks)."""
    m_out, width = res.shape
    rf = res.reshape(m_out * width)
    zero = np.zeros(1, y.dtype)[0]
    for m in prange(m_out):
        b = bias[m] if has_bias else zero
        src = m * width
        dst = m * length + at
        if act == 0:
            for k in range(width):
                y[U(dst + k)] = rf[U(src + k)] + b
        elif act == 1:
            for k in range(width):
                v = rf[U(src + k)] + b
                y[U(dst + k)] = zero if v < zero else v
        elif act == 4:
            for k in range(width):
                y[U(dst + k)] = _hard_swish(rf[U(src + k)] + b, zero)
        elif act == 5:
            for k in range(width):
                y[U(dst + k)] = _relu6(rf[U(src + k)] + b, zero)
        elif act == 6:
            for k in range(width):
                y[U(dst + k)] = _silu(rf[U(src + k)] + b, zero)
        else:
            for k in range(width):
                y[U(dst + k)] = _activate(rf[U(src + k)] + b, act, zero)


def _columns(k, s, ow):
    """The column builder for a convolution's window ``k``, strides ``s`` and output width."""
    kk = k[0] * k[1]
    overlap = k[0] > s[0] or k[1] > s[1]
    if overlap and s != (1, 1) and (kk >= _PHASES_MIN_TAPS or ow >= _PHASES_MIN_ROW):
        return _im2col_phased
    return _im2col


@jit(parallel=True)
def _col2im(dcols, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow, dx, by_image):
    """The adjoint of :func:`_im2col` (columns (N, C*kh*kw, oh*ow) when ``by_image``, else side
    by side, (C*kh*kw, N, oh*ow)): dx[n, c, ...] += every column entry that read it. A task
    owns whole (image, channel) planes, so no two tasks write the same element; each plane is
    summed in a zero-padded scratch plane (no bounds logic, as in :func:`_im2col`) whose
    inside is then copied out."""
    n_img, c_in, h, w = dx.shape
    kk = kh * kw
    rows = c_in * kk
    length = oh * ow
    hp = max((oh - 1) * sh + (kh - 1) * dh + 1, h + ph)
    wp = max((ow - 1) * sw + (kw - 1) * dw + 1, w + pw)
    cf = dcols.reshape(dcols.size)
    df = dx.reshape(dx.size)
    planes = n_img * c_in
    for task in prange((planes + _PLANES_PER_TASK - 1) // _PLANES_PER_TASK):
        pad = np.empty(hp * wp, dx.dtype)
        for t in range(task * _PLANES_PER_TASK, min(planes, (task + 1) * _PLANES_PER_TASK)):
            n = t // c_in
            c = t % c_in
            for a in range(hp * wp):
                pad[U(a)] = 0
            for i in range(kh):
                for j in range(kw):
                    r = c * kk + i * kw + j
                    row = ((n * rows + r) if by_image else (r * n_img + n)) * length
                    for y in range(oh):
                        at = (y * sh + i * dh) * wp + j * dw
                        base = row + y * ow
                        if sw == 1:
                            for q in range(ow):
                                pad[U(at + q)] += cf[U(base + q)]
                        else:
                            for q in range(ow):
                                pad[U(at + q * sw)] += cf[U(base + q)]
            dst = t * h * w
            for a in range(h):
                at = (a + ph) * wp + pw
                for b in range(w):
                    df[U(dst + a * w + b)] = pad[U(at + b)]


@jit()
def _activate(v, act, zero):
    """act: 0 none, 1 Relu (NaN passes, as in np.maximum), 2 Sigmoid (the stable form), 3 Tanh,
    4 HardSwish, 5 Relu6 (Clip to 0 and 6; NaN passes), 6 Silu (v * sigmoid(v)); ``zero`` of
    v's dtype keeps float32 math in float32."""
    if act == 1:
        return zero if v < zero else v
    if act == 5:
        return _relu6(v, zero)
    if act == 6:
        return _silu(v, zero)
    if act == 2:
        one = zero + 1
        if v >= zero:
            return one / (one + np.exp(-v))
        e = np.exp(v)
        return e / (one + e)
    if act == 3:
        return np.tanh(v)
    if act == 4:
        return _hard_swish(v, zero)
    return v


def _silu(v, zero):
    """v * sigmoid(v) in v's dtype (compiled per dtype, below)."""


@overload(_silu)
def _silu_typed(v, zero):
    """float32: the sigmoid in arithmetic that vectorizes (``_vecmath``; a loop of it runs in
    vector lanes, where libm's exp is a call per element); float64: the stable form in libm.
    -inf gives NaN, as the Sigmoid and the Mul it replaces (-inf * 0)."""
    if v == types.float32:
        return lambda v, zero: v * sigmoid32(v)

    def stable(v, zero):
        one = zero + 1
        if v >= zero:
            return v * (one / (one + np.exp(-v)))
        e = np.exp(v)
        return v * (e / (one + e))
    return stable


def _gelu(v, zero):
    """(v * (erf(v / sqrt 2) + 1)) * 0.5 in v's dtype (compiled per dtype, below): GELU as
    PyTorch exports it, the same operations in the same order."""


@overload(_gelu)
def _gelu_typed(v, zero):
    """float32: erf in arithmetic that vectorizes (``_vecmath.erf32``, what the fused chains
    it replaces compute); float64: libm's erf."""
    if v == types.float32:
        root2, one, half = np.float32(math.sqrt(2)), np.float32(1), np.float32(0.5)
        return lambda v, zero: (v * (erf32(v / root2) + one)) * half
    return lambda v, zero: (v * (math.erf(v / math.sqrt(2)) + 1.0)) * 0.5


@jit()
def _relu6(v, zero):
    """Clip(v, 0, 6) as selects in v's dtype (a loop of it vectorizes); NaN passes."""
    six = zero + np.float32(6)
    v = zero if v < zero else v
    return six if v > six else v


@jit()
def _hard_swish(v, zero):
    """v * clip(v / 6 + 1/2, 0, 1), the HardSwish op's formula, in v's dtype (float32
    constants: an integer one would make float32 math float64). Selects, no branches, so a
    loop of it vectorizes; the gate is NaN only where v is, so clipping may drop a NaN."""
    gate = v / (zero + np.float32(6)) + (zero + np.float32(0.5))
    gate = zero if gate < zero else gate
    one = zero + np.float32(1)
    return v * (one if gate > one else gate)


@jit()
def _into_phases(xf, xb, h, w, sh, sw, ph, pw, hq, wq, buf):
    """The h x w plane at ``xf[xb:]`` into the sh*sw phases of its zero-padded plane, each
    (hq, wq), flat in ``buf``: padded row iy + ph is row (iy + ph) // sh of the phases
    (iy + ph) % sh, columns likewise, so every tap of a strided window is a contiguous run of
    one phase. Padding positions are never written (they keep the buffer's zeros); rows and
    columns past a phase's end are dropped.

    At a column stride of 2 each input row goes to both column phases in one loop whose two
    loads are the adjacent elements ``2k`` and ``2k + 1``: LLVM vectorizes that as
    interleaved loads, where a runtime stride was a scalar gather. The copy of 192 planes of
    32x32 for a 3x3 window at stride 2: 163 -> 77 us; whole kernels, old against new in one
    process: the written-out depthwise 3x3/2 0.71-0.88x, the phased columns of 3x3/2 and 7x7/2
    stems 0.66-0.89x (docs/benchmarks.md, "Fourteenth round")."""
    if sw == 2:
        _into_two_column_phases(xf, xb, h, w, sh, ph, pw, hq, wq, buf)
        return
    for r in range(sh):
        iy0 = (r - ph) % sh
        for c in range(sw):
            base = (r * sw + c) * hq * wq
            ix0 = (c - pw) % sw
            xx0 = (ix0 + pw) // sw
            cnt = min((w - ix0 + sw - 1) // sw, wq - xx0)
            for iy in range(iy0, h, sh):
                yy = (iy + ph) // sh
                if yy >= hq:
                    break
                d0 = base + yy * wq + xx0
                s0 = xb + iy * w + ix0
                for k in range(cnt):
                    buf[U(d0 + k)] = xf[U(s0 + k * sw)]


@jit()
def _into_two_column_phases(xf, xb, h, w, sh, ph, pw, hq, wq, buf):
    """:func:`_into_phases` for a column stride of 2. Input column ``2k + e`` (e = 0, 1) is
    padded column ``2k + e + pw``: phase ``(e + pw) % 2``, index ``k + (e + pw) // 2``."""
    p0 = pw % 2  # the column phase of the even input columns
    p1 = 1 - p0
    o0 = pw // 2  # their index offset in it
    o1 = (pw + 1) // 2
    n0 = min((w + 1) // 2, wq - o0)  # even input columns kept
    n1 = min(w // 2, wq - o1)
    both = max(0, min(n0, n1))
    for r in range(sh):
        iy0 = (r - ph) % sh
        even = (r * 2 + p0) * hq * wq + o0
        odd = (r * 2 + p1) * hq * wq + o1
        for iy in range(iy0, h, sh):
            yy = (iy + ph) // sh
            if yy >= hq:
                break
            s0 = xb + iy * w
            d0 = even + yy * wq
            d1 = odd + yy * wq
            for k in range(both):
                buf[U(d0 + k)] = xf[U(s0 + 2 * k)]
                buf[U(d1 + k)] = xf[U(s0 + 2 * k + 1)]
            for k in range(both, n0):
                buf[U(d0 + k)] = xf[U(s0 + 2 * k)]
            for k in range(both, n1):
                buf[U(d1 + k)] = xf[U(s0 + 2 * k + 1)]


@jit()
def _store_activated(src, s0, dst, d0, count, act, zero):
    """dst[d0:d0 + count] = act(src[s0:s0 + count]) (flat arrays), one loop per common
    activation so each vectorizes (a loop calling :func:`_activate` does not)."""
    if act == 0:
        for k in range(count):
            dst[U(d0 + k)] = src[U(s0 + k)]
    elif act == 1:  # Relu; NaN stays NaN
        for k in range(count):
            v = src[U(s0 + k)]
            dst[U(d0 + k)] = zero if v < zero else v
    elif act == 4:
        for k in range(count):
            dst[U(d0 + k)] = _hard_swish(src[U(s0 + k)], zero)
    elif act == 5:
        for k in range(count):
            dst[U(d0 + k)] = _relu6(src[U(s0 + k)], zero)
    elif act == 6:
        for k in range(count):
            dst[U(d0 + k)] = _silu(src[U(s0 + k)], zero)
    else:
        for k in range(count):
            dst[U(d0 + k)] = _activate(src[U(s0 + k)], act, zero)


@jit()
def _activate_in_place(a, a0, count, act, zero):
    """a[a0:a0 + count] = act(a[a0:a0 + count]) (a flat array), one loop per common
    activation. Not :func:`_store_activated` with the same array twice: its loops then fail
    their run-time overlap check and run scalar (960 channels of 4x4, HardSwish: 27 -> 3 us)."""
    if act == 1:  # Relu; NaN stays NaN
        for k in range(count):
            v = a[U(a0 + k)]
            a[U(a0 + k)] = zero if v < zero else v
    elif act == 4:
        for k in range(count):
            a[U(a0 + k)] = _hard_swish(a[U(a0 + k)], zero)
    elif act == 5:
        for k in range(count):
            a[U(a0 + k)] = _relu6(a[U(a0 + k)], zero)
    elif act == 6:
        for k in range(count):
            a[U(a0 + k)] = _silu(a[U(a0 + k)], zero)
    elif act != 0:
        for k in range(count):
            a[U(a0 + k)] = _activate(a[U(a0 + k)], act, zero)


@jit()
def _clamp_bounds(act):
    """(lo, hi, whether clamping to them is the activation) for kernels that finish their
    sums in registers by one clamp (``_simd.clamp16``): a Relu (1) is (0, inf), a Relu6 (5)
    (0, 6); other activations (applied after) and none pass everything."""
    inf = np.float32(np.inf)
    if act == 1:
        return np.float32(0.0), inf, True
    if act == 5:
        return np.float32(0.0), np.float32(6.0), True
    return -inf, inf, act == 0


@jit(parallel=True)
def _depthwise(x, wt, mult, sh, sw, ph, pw, dh, dw, bias, has_bias, act, out):
    """out[n, m] = act(sum_ij x[n, m // mult, ...] * wt[m, 0, i, j] + bias[m]): one input
    channel per group, the bias and activation applied as each output row is stored.

    Each channel is copied into a zero-padded buffer (one per block of channels, its border
    zeroed once). At stride 1 every tap is then one long contiguous multiply-add over the whole
    padded-width plane (the columns past the output's width are computed and dropped), which
    vectorizes where short per-row loops would not. At other strides the channel is copied into
    the sh*sw phases of that padded plane instead (rows y*sh + r, columns x*sw + c), in which
    every tap is again one contiguous multiply-add at a fixed offset."""
    n_img, m_out, oh, ow = out.shape
    c_in, h, w = x.shape[1], x.shape[2], x.shape[3]
    xf = x.reshape(x.size)
    kh, kw = wt.shape[2], wt.shape[3]
    hp = max((oh - 1) * sh + (kh - 1) * dh + 1, ph + h) + 1  # one spare row for the overrun
    wp = max((ow - 1) * sw + (kw - 1) * dw + 1, pw + w)
    strided = sh != 1 or sw != 1
    # the phases: (sh*sw, hq, wq), one spare row for the overrun as above
    hq = oh + ((kh - 1) * dh) // sh + 1
    wq = ow + ((kw - 1) * dw) // sw
    width = wq if strided else wp  # of a row of the accumulator
    plane = oh * width
    total = n_img * m_out
    block = 16
    zero = np.zeros(1, out.dtype)[0]
    for blk in prange((total + block - 1) // block):
        buf = np.zeros((1, 1) if strided else (hp, wp), x.dtype)
        flat = buf.reshape(buf.size)
        phases = np.zeros((sh * sw, hq, wq) if strided else (1, 1, 1), x.dtype)
        phases_flat = phases.reshape(phases.size)
        acc = np.empty(plane, x.dtype)
        for t in range(blk * block, min(total, (blk + 1) * block)):
            n = t // m_out
            m = t % m_out
            bv = bias[m] if has_bias else zero
            dst = out[n, m]
            acc[:] = 0
            if strided:  # the channel straight into its phases (zeros kept from the first)
                _into_phases(xf, (n * c_in + m // mult) * h * w, h, w, sh, sw, ph, pw, hq, wq,
                             phases_flat)
                for i in range(kh):
                    for j in range(kw):
                        wv = wt[m, 0, i, j]
                        pflat = phases[((i * dh) % sh) * sw + (j * dw) % sw].reshape(hq * wq)
                        start = ((i * dh) // sh) * wq + (j * dw) // sw
                        tap = pflat[start:start + plane]
                        for q in range(plane):
                            acc[q] += wv * tap[q]
            else:
                buf[ph:ph + h, pw:pw + w] = x[n, m // mult]
                for i in range(kh):
                    for j in range(kw):
                        wv = wt[m, 0, i, j]
                        start = i * dh * wp + j * dw
                        tap = flat[start:start + plane]  # a view: q >= 0, so no index wrap
                        for q in range(plane):
                            acc[q] += wv * tap[q]
            for y in range(oh):
                drow = dst[y]
                src = acc[y * width:y * width + ow]
                if act == 0:
                    for xo in range(ow):
                        drow[xo] = src[xo] + bv
                else:
                    for xo in range(ow):
                        drow[xo] = _activate(src[xo] + bv, act, zero)




@jit()
def _taps(h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow):
    """For every output pixel p, its taps that land inside the image: count[p] of them,
    src[p*kh*kw + k] the input offset (y*w + x) and tap[p*kh*kw + k] the weight offset."""
    kk = kh * kw
    count = np.zeros(oh * ow, np.int32)
    src = np.empty(oh * ow * kk, np.int32)
    tap = np.empty(oh * ow * kk, np.int32)
    for y in range(oh):
        for xo in range(ow):
            p = y * ow + xo
            k = 0
            for i in range(kh):
                iy = y * sh - ph + i * dh
                if iy < 0 or iy >= h:
                    continue
                for j in range(kw):
                    ix = xo * sw - pw + j * dw
                    if ix < 0 or ix >= w:
                        continue
                    src[p * kk + k] = iy * w + ix
                    tap[p * kk + k] = i * kw + j
                    k += 1
            count[p] = k
    return count, src, tap


@jit(parallel=True)
def _depthwise_table(x, wt, mult, sh, sw, ph, pw, dh, dw, bias, has_bias, act, out):
    """The depthwise convolution of small output planes: for every output pixel, the list of
    taps that land inside the image (input offset, weight offset) is made once per call and
    shared by every channel, so a 5x5 window over a 2x2 plane costs its 4 real taps instead of
    25, and no padded copy or stride phases are built per channel."""
    n_img, m_out, oh, ow = out.shape
    c_in, h, w = x.shape[1], x.shape[2], x.shape[3]
    kh, kw = wt.shape[2], wt.shape[3]
    length = oh * ow
    kk = kh * kw
    hw = h * w
    count, src, tap = _taps(h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow)
    xf = x.reshape(x.size)
    of = out.reshape(out.size)
    wf = wt.reshape(wt.size)
    zero = np.zeros(1, out.dtype)[0]
    for t in prange(n_img * m_out):
        n = t // m_out
        m = t % m_out
        xb = (n * c_in + m // mult) * hw
        ob = t * length
        wb = m * kk
        bv = bias[m] if has_bias else zero
        for p in range(length):
            acc = bv
            base = p * kk
            for k in range(count[p]):
                acc += xf[U(xb + src[U(base + k)])] * wf[U(wb + tap[U(base + k)])]
            of[U(ob + p)] = _activate(acc, act, zero)


@jit()
def _channels_last_weights(wt):
    """Depthwise weights (C, 1, kh, kw) as (kh, kw, C): each tap's weights of all the channels
    side by side, the layout :func:`_depthwise_nhwc` multiplies by (made once per plan when the
    weights are constant)."""
    c = wt.shape[0]
    kk = wt.shape[2] * wt.shape[3]
    wf = wt.reshape(wt.size)
    wtt = np.empty(kk * c, wt.dtype)
    for ch in range(c):
        for q in range(kk):
            wtt[U(q * c + ch)] = wf[U(ch * kk + q)]
    return wtt


@jit(parallel=True)
def _depthwise_nhwc(x, wtt, kh, kw, sh, sw, ph, pw, dh, dw, bias, has_bias, act, out):
    """The depthwise convolution (one output channel per input channel) of small planes with
    many channels: the input copied channels-last, so every tap of an output pixel is one
    contiguous multiply-add over all the channels (vectorized) with the weights ``wtt``
    (:func:`_channels_last_weights`), and only taps inside the image are visited; the
    channels-last result is stored back to NCHW with the activation. Both copies go eight
    channels at a time: eight rows of one layout against eight adjacent values of the other,
    which keeps both sides in cache (960 channels of 4x4: 21 -> 12 us per copy)."""
    n_img, c, h, w = x.shape
    oh, ow = out.shape[2], out.shape[3]
    hw = h * w
    length = oh * ow
    xf = x.reshape(x.size)
    of = out.reshape(out.size)
    xt = np.empty(x.size, x.dtype)  # (n, h, w, c)
    blocks = c // 8
    for t in prange(n_img * blocks):
        n = t // blocks
        cb = (t - n * blocks) * 8
        base = n * c * hw
        for q in range(hw):
            dst = base + q * c + cb
            src = base + cb * hw + q
            xt[U(dst)] = xf[U(src)]
            xt[U(dst + 1)] = xf[U(src + hw)]
            xt[U(dst + 2)] = xf[U(src + 2 * hw)]
            xt[U(dst + 3)] = xf[U(src + 3 * hw)]
            xt[U(dst + 4)] = xf[U(src + 4 * hw)]
            xt[U(dst + 5)] = xf[U(src + 5 * hw)]
            xt[U(dst + 6)] = xf[U(src + 6 * hw)]
            xt[U(dst + 7)] = xf[U(src + 7 * hw)]
    for n in range(n_img):  # the channels past the last block of eight
        base = n * c * hw
        for ch in range(blocks * 8, c):
            for q in range(hw):
                xt[U(base + q * c + ch)] = xf[U(base + ch * hw + q)]
    zero = np.zeros(1, out.dtype)[0]
    ot = np.empty(n_img * length * c, out.dtype)  # (n, oh, ow, c)
    for t in prange(n_img * oh):
        n = t // oh
        y = t - n * oh
        for xo in range(ow):
            ob = (t * ow + xo) * c
            if has_bias:
                for ch in range(c):
                    ot[U(ob + ch)] = bias[U(ch)]
            else:
                for ch in range(c):
                    ot[U(ob + ch)] = zero
            for i in range(kh):
                iy = y * sh - ph + i * dh
                if iy < 0 or iy >= h:
                    continue
                for j in range(kw):
                    ix = xo * sw - pw + j * dw
                    if ix < 0 or ix >= w:
                        continue
                    xb = ((n * h + iy) * w + ix) * c
                    wb = (i * kw + j) * c
                    for ch in range(c):
                        ot[U(ob + ch)] += xt[U(xb + ch)] * wtt[U(wb + ch)]
            if act:  # while the pixel's channels are in cache, as one vectorized run
                _activate_in_place(ot, ob, c, act, zero)
    for t in prange(n_img * blocks):
        n = t // blocks
        cb = (t - n * blocks) * 8
        for p in range(length):
            src = (n * length + p) * c + cb
            dst = (n * c + cb) * length + p
            of[U(dst)] = ot[U(src)]
            of[U(dst + length)] = ot[U(src + 1)]
            of[U(dst + 2 * length)] = ot[U(src + 2)]
            of[U(dst + 3 * length)] = ot[U(src + 3)]
            of[U(dst + 4 * length)] = ot[U(src + 4)]
            of[U(dst + 5 * length)] = ot[U(src + 5)]
            of[U(dst + 6 * length)] = ot[U(src + 6)]
            of[U(dst + 7 * length)] = ot[U(src + 7)]
    for n in range(n_img):
        for ch in range(blocks * 8, c):
            for p in range(length):
                of[U((n * c + ch) * length + p)] = ot[U((n * length + p) * c + ch)]


@jit(parallel=True)
def _epilogue(y, bias, has_bias, act):
    """y[n, m, :] = act(y + bias[m]) in place; act: see :func:`_activate`. One
    loop per activation, written out here (not through a helper), so the common ones
    vectorize. Indexed flat, without a view per row: on short rows (2x576 rows of 4) a row
    view cost more than the row (6.9 -> 2.9 us)."""
    n_img, m_out, length = y.shape
    yf = y.reshape(n_img * m_out * length)
    zero = np.zeros(1, y.dtype)[0]
    for t in prange(n_img * m_out):
        base = t * length
        b = bias[t % m_out] if has_bias else zero
        if act == 0:
            for k in range(length):
                yf[U(base + k)] += b
        elif act == 1:
            for k in range(length):
                v = yf[U(base + k)] + b
                yf[U(base + k)] = zero if v < zero else v
        elif act == 4:
            for k in range(length):
                yf[U(base + k)] = _hard_swish(yf[U(base + k)] + b, zero)
        elif act == 5:
            for k in range(length):
                yf[U(base + k)] = _relu6(yf[U(base + k)] + b, zero)
        elif act == 6:
            for k in range(length):
                yf[U(base + k)] = _silu(yf[U(base + k)] + b, zero)
        else:
            for k in range(length):
                yf[U(base + k)] = _activate(yf[U(base + k)] + b, act, zero)


@jit(parallel=True)
def _bias_act(y, bias, has_bias, act):
    """y[i, :] = act(y[i, :] + bias) in place for a C-contiguous (M, N) ``y``: a product's
    rows (FusedGemm), or the (N, C) output of a convolution over 1x1 planes, whose channels
    then are one run per image (2x576: 3.4-4.2 us through :func:`_epilogue`'s loop per
    channel, 0.5-0.9 us here). act: see :func:`_activate`. Indexed flat, so short rows need no
    view each."""
    rows, n = y.shape
    yf = y.reshape(rows * n)
    zero = np.zeros(1, y.dtype)[0]
    for i in prange(rows):
        base = i * n
        if act == 0:
            for j in range(n):
                yf[U(base + j)] += bias[U(j)] if has_bias else zero
        elif act == 1:  # Relu; NaN stays NaN
            for j in range(n):
                v = yf[U(base + j)] + (bias[U(j)] if has_bias else zero)
                yf[U(base + j)] = zero if v < zero else v
        elif act == 4:
            for j in range(n):
                v = yf[U(base + j)] + (bias[U(j)] if has_bias else zero)
                yf[U(base + j)] = _hard_swish(v, zero)
        elif act == 5:
            for j in range(n):
                v = yf[U(base + j)] + (bias[U(j)] if has_bias else zero)
                yf[U(base + j)] = _relu6(v, zero)
        elif act == 6:
            for j in range(n):
                v = yf[U(base + j)] + (bias[U(j)] if has_bias else zero)
                yf[U(base + j)] = _silu(v, zero)
        elif act == 7:  # Gelu (FusedMatMul's; no convolution takes it)
            for j in range(n):
                v = yf[U(base + j)] + (bias[U(j)] if has_bias else zero)
                yf[U(base + j)] = _gelu(v, zero)
        else:
            for j in range(n):
                v = yf[U(base + j)] + (bias[U(j)] if has_bias else zero)
                yf[U(base + j)] = _activate(v, act, zero)


def _finish(y3, bias, has_bias, act):
    """The bias and activation of an (N, M, length) output in place, when it has either."""
    if not (has_bias or act):
        return
    n, m, length = y3.shape
    if length == 1:
        pick(_bias_act)(y3.reshape(n, m), bias, has_bias, act)
    else:
        pick(_epilogue)(y3, bias, has_bias, act)


@jit(parallel=True)
def _scatter(res, bias, has_bias, act, y):
    """y[n, m, :] = act(res[m, n*L:(n+1)*L] + bias[m]): the GEMM's (M, N*L) result of a
    chunk of images back to NCHW, the bias and activation applied on the way (indexed flat,
    as :func:`_epilogue`)."""
    n_img, m_out, length = y.shape
    width = res.shape[1]
    rf = res.reshape(m_out * width)
    yf = y.reshape(n_img * m_out * length)
    zero = np.zeros(1, y.dtype)[0]
    for t in prange(n_img * m_out):
        n = t // m_out
        m = t - n * m_out
        b = bias[m] if has_bias else zero
        src = m * width + n * length
        dst = t * length
        if act == 0:
            for k in range(length):
                yf[U(dst + k)] = rf[U(src + k)] + b
        elif act == 1:
            for k in range(length):
                v = rf[U(src + k)] + b
                yf[U(dst + k)] = zero if v < zero else v
        elif act == 4:
            for k in range(length):
                yf[U(dst + k)] = _hard_swish(rf[U(src + k)] + b, zero)
        elif act == 5:
            for k in range(length):
                yf[U(dst + k)] = _relu6(rf[U(src + k)] + b, zero)
        elif act == 6:
            for k in range(length):
                yf[U(dst + k)] = _silu(rf[U(src + k)] + b, zero)
        else:
            for k in range(length):
                yf[U(dst + k)] = _activate(rf[U(src + k)] + b, act, zero)


# blocks of four weight rows between a block's prefetch and its multiply: 4-16 measured alike
# in scratch timings (1280 x 320 weights, 8 columns, out of cache); 1 and 2 a little slower
_AHEAD = 4
# rows of at most this many bytes are prefetched: longer ones are long runs the hardware
# follows by itself (scratch timings: 192 x 1152 and 768 x 768 float32 gained nothing out of
# cache and lost 8-18% in cache)
_PREFETCH_MAX_ROW = 1536


@jit(parallel=True, fastmath={"reassoc"})
def _skinny_gemm(w, xt, of, rs, cs):
    """of[j * rs + i * cs] = sum_q w[j, q] * xt[i, q]: a product with a narrow result (a
    handful of columns; ``of`` flat, (M, N) with rs=N, cs=1, or straight into an (N, M)
    output with rs=1, cs=M), each output a dot product along the contiguous rows of ``w`` and
    ``xt``. Four rows of ``w`` times four of ``xt`` per pass: sixteen sums in vector registers, each load
    of ``w`` used four times, and ``w`` read once from memory, unpacked (the sums reassociated,
    which keeps NaN and infinities)."""
    m, k = w.shape
    n = xt.shape[0]
    wf = w.reshape(w.size)
    xf = xt.reshape(xt.size)
    zero = np.zeros(1, of.dtype)[0]
    line = max(1, 64 // wf.itemsize)  # elements per cache line
    ahead = _AHEAD if k * wf.itemsize <= _PREFETCH_MAX_ROW else 0
    for blk in prange((m + 3) // 4):
        j = blk * 4
        if ahead:
            # the weights of the block `ahead` on requested now, to arrive while these are
            # multiplied (benchmarks/planned_calls.py: 1280 x 320 by 8 columns, the weights out
            # of cache, 212-220 -> 146-154 us)
            p = (j + 4 * ahead) * k
            end = min(p + 4 * k, wf.size)
            while p < end:
                prefetch(wf, p)
                p += line
        if j + 4 > m:  # the last rows, one at a time
            for r in range(j, m):
                for i in range(n):
                    s = zero
                    for q in range(k):
                        s += wf[U(r * k + q)] * xf[U(i * k + q)]
                    of[U(r * rs + i * cs)] = s
            continue
        w0 = j * k
        w1 = w0 + k
        w2 = w1 + k
        w3 = w2 + k
        i = 0
        while i + 4 <= n:
            b0 = i * k
            b1 = b0 + k
            b2 = b1 + k
            b3 = b2 + k
            a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = zero
            a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = zero
            for q in range(k):
                x0 = xf[U(b0 + q)]
                x1 = xf[U(b1 + q)]
                x2 = xf[U(b2 + q)]
                x3 = xf[U(b3 + q)]
                u = wf[U(w0 + q)]
                a00 += u * x0
                a01 += u * x1
                a02 += u * x2
                a03 += u * x3
                u = wf[U(w1 + q)]
                a10 += u * x0
                a11 += u * x1
                a12 += u * x2
                a13 += u * x3
                u = wf[U(w2 + q)]
                a20 += u * x0
                a21 += u * x1
                a22 += u * x2
                a23 += u * x3
                u = wf[U(w3 + q)]
                a30 += u * x0
                a31 += u * x1
                a32 += u * x2
                a33 += u * x3
            o = j * rs + i * cs
            of[U(o)] = a00
            of[U(o + cs)] = a01
            of[U(o + 2 * cs)] = a02
            of[U(o + 3 * cs)] = a03
            o += rs
            of[U(o)] = a10
            of[U(o + cs)] = a11
            of[U(o + 2 * cs)] = a12
            of[U(o + 3 * cs)] = a13
            o += rs
            of[U(o)] = a20
            of[U(o + cs)] = a21
            of[U(o + 2 * cs)] = a22
            of[U(o + 3 * cs)] = a23
            o += rs
            of[U(o)] = a30
            of[U(o + cs)] = a31
            of[U(o + 2 * cs)] = a32
            of[U(o + 3 * cs)] = a33
            i += 4
        if i + 2 <= n:  # two columns left (a batch of two, 1x1 planes): four rows times two
            b0 = i * k
            b1 = b0 + k
            a00 = a01 = a10 = a11 = a20 = a21 = a30 = a31 = zero
            for q in range(k):
                x0 = xf[U(b0 + q)]
                x1 = xf[U(b1 + q)]
                u = wf[U(w0 + q)]
                a00 += u * x0
                a01 += u * x1
                u = wf[U(w1 + q)]
                a10 += u * x0
                a11 += u * x1
                u = wf[U(w2 + q)]
                a20 += u * x0
                a21 += u * x1
                u = wf[U(w3 + q)]
                a30 += u * x0
                a31 += u * x1
            o = j * rs + i * cs
            of[U(o)] = a00
            of[U(o + cs)] = a01
            of[U(o + rs)] = a10
            of[U(o + rs + cs)] = a11
            of[U(o + 2 * rs)] = a20
            of[U(o + 2 * rs + cs)] = a21
            of[U(o + 3 * rs)] = a30
            of[U(o + 3 * rs + cs)] = a31
            i += 2
        while i < n:  # the last column: four rows times one
            b0 = i * k
            a00 = a10 = a20 = a30 = zero
            for q in range(k):
                x0 = xf[U(b0 + q)]
                a00 += wf[U(w0 + q)] * x0
                a10 += wf[U(w1 + q)] * x0
                a20 += wf[U(w2 + q)] * x0
                a30 += wf[U(w3 + q)] * x0
            o = j * rs + i * cs
            of[U(o)] = a00
            of[U(o + rs)] = a10
            of[U(o + 2 * rs)] = a20
            of[U(o + 3 * rs)] = a30
            i += 1


# the small-convolution kernel's table: these scalars, then the output rows that each kernel
# row reaches inside the image (lo, hi), then the output columns likewise for each kernel column
_T_N, _T_C, _T_H, _T_W, _T_M, _T_OH, _T_OW, _T_KH, _T_KW, _T_SH, _T_SW, _T_PH, _T_PW, _T_DH, \
    _T_DW, _T_GROUP, _T_ACT, _T_BIAS, _T_NARROW = range(19)
_T_RANGES = 19
# at most this many output pixels (all the images): :func:`_small_conv_narrow`, whose vector
# loops run along the weights, not the pixels
_SMALL_NARROW = 8
# narrow ungrouped convolutions with at least this many output channels (and at most twice as
# many weights per output) take :func:`_small_conv_by_channels` when their weights are
# constant: measured 0.41-0.80x the dot products' time on 1-8 pixels with 32-480 outputs from
# 16-120 channels, 1.0-2.5x on deep reductions (480 channels to 8-64)
_BY_CHANNELS_MIN = 32


@jit()
def _small_conv(x, wt, bias, t, out):
    """The whole convolution of a small problem in one call, straight into ``out``:
    out[n, m] = act(bias[m] + sum over the group's input channels and the taps of
    wt[m, c, i, j] * x[n, c, y*sh - ph + i*dh, q*sw - pw + j*dw]).

    The columns of all the images side by side, (C*kh*kw, N*oh*ow), are built in a scratch
    buffer (each tap copies only the output rows and columns it reaches inside the image: the
    ranges in ``t``, made once per signature; the rest stays zero), then every output channel
    is the sum of its weights times those long rows (the loop that vectorizes), stored to NCHW
    with the bias and activation. No Python between the steps: for a small convolution the
    calls around a BLAS GEMM cost more than the arithmetic. Shapes and attributes come from
    ``t`` (:func:`_small_table`), so x, wt and out may be 3-D (Conv1d) or 4-D, C-contiguous."""
    if t[_T_NARROW]:
        _small_conv_narrow(x, wt, bias, t, out)
        return
    n_img, c_in, h, w = t[_T_N], t[_T_C], t[_T_H], t[_T_W]
    m_out, oh, ow, kh, kw = t[_T_M], t[_T_OH], t[_T_OW], t[_T_KH], t[_T_KW]
    sh, sw, ph, pw, dh, dw = t[_T_SH], t[_T_SW], t[_T_PH], t[_T_PW], t[_T_DH], t[_T_DW]
    group, act, has_bias = t[_T_GROUP], t[_T_ACT], t[_T_BIAS]
    rows_g = (c_in // group) * kh * kw  # weights per output channel
    mg = m_out // group
    hw = h * w
    length = oh * ow
    width = n_img * length
    xf = x.reshape(x.size)
    wf = wt.reshape(wt.size)
    of = out.reshape(out.size)
    zero = np.zeros(1, out.dtype)[0]
    if kh == 1 and kw == 1 and sh == 1 and sw == 1 and ph == 0 and pw == 0 and oh == h and \
            ow == w:
        # a 1x1 convolution: each image's planes are its columns already (no zeroed copy of
        # the batch side by side: a planned 2x48x8x8 -> 8 4.3 -> 2.7 us, a scratch timing)
        res = np.empty(4 * length, out.dtype)
        for n in range(n_img):
            _small_products(res, xf[n * c_in * hw:(n + 1) * c_in * hw], wf, bias, has_bias,
                            act, zero, rows_g, mg, group, length, 1, length, m_out, of,
                            n * m_out * length)
        return
    cols = np.zeros(c_in * kh * kw * width, out.dtype)
    for c in range(c_in):
        for i in range(kh):
            ylo, yhi = t[_T_RANGES + 2 * i], t[_T_RANGES + 2 * i + 1]
            for j in range(kw):
                qlo = t[_T_RANGES + 2 * kh + 2 * j]
                qhi = t[_T_RANGES + 2 * kh + 2 * j + 1]
                row = ((c * kh + i) * kw + j) * width
                for n in range(n_img):
                    xb = (n * c_in + c) * hw + j * dw - pw
                    for y in range(ylo, yhi):
                        src = xb + (y * sh - ph + i * dh) * w
                        dst = row + n * length + y * ow
                        if sw == 1:
                            for q in range(qlo, qhi):
                                cols[U(dst + q)] = xf[U(src + q)]
                        else:
                            for q in range(qlo, qhi):
                                cols[U(dst + q)] = xf[U(src + q * sw)]
    res = np.empty(4 * width, out.dtype)
    _small_products(res, cols, wf, bias, has_bias, act, zero, rows_g, mg, group, width, n_img,
                    length, m_out, of, 0)


@jit()
def _small_products(res, cols, wf, bias, has_bias, act, zero, rows_g, mg, group, width, n_img,
                    length, m_out, of, o0):
    """:func:`_small_conv`'s products: every output channel the sum of its weights times the
    column rows (``width`` = ``n_img`` images of ``length`` side by side), stored to the NCHW
    output ``of`` from ``o0`` with the bias and activation; ``res``: 4 * width of scratch."""
    for g in range(group):
        cb = g * rows_g * width
        m = g * mg
        while m < (g + 1) * mg:
            # four (or two) output channels share each pass over the columns
            block = min(4 if mg - m % mg >= 4 else 2, (g + 1) * mg - m)
            for mm in range(block):
                bv = bias[m + mm] if has_bias else zero
                for p in range(width):
                    res[U(mm * width + p)] = bv
            if block == 4:
                _rows_times_columns4(res, cols, wf, m * rows_g, rows_g, cb, width)
            elif block == 2:
                _rows_times_columns2(res, cols, wf, m * rows_g, rows_g, cb, width)
            else:
                _rows_times_columns(res, cols, wf, m * rows_g, rows_g, cb, width)
            for mm in range(block):
                for n in range(n_img):
                    _store_activated(res, mm * width + n * length, of,
                                     o0 + (n * m_out + m + mm) * length, length, act, zero)
            m += block


@jit()
def _pixel_columns(xf, t, cols):
    """Each output pixel's column, (C*kh*kw,), contiguous in ``cols`` (pixel-major, all the
    images), from the flat input ``xf``; taps outside the image are not written (``cols``
    comes zeroed)."""
    n_img, c_in, h, w = t[_T_N], t[_T_C], t[_T_H], t[_T_W]
    oh, ow, kh, kw = t[_T_OH], t[_T_OW], t[_T_KH], t[_T_KW]
    sh, sw, ph, pw, dh, dw = t[_T_SH], t[_T_SW], t[_T_PH], t[_T_PW], t[_T_DH], t[_T_DW]
    kk = kh * kw
    rows = c_in * kk
    hw = h * w
    for n in range(n_img):
        for y in range(oh):
            for q in range(ow):
                cb = ((n * oh + y) * ow + q) * rows
                for i in range(kh):
                    if y < t[_T_RANGES + 2 * i] or y >= t[_T_RANGES + 2 * i + 1]:
                        continue
                    for j in range(kw):
                        if q < t[_T_RANGES + 2 * kh + 2 * j] or \
                                q >= t[_T_RANGES + 2 * kh + 2 * j + 1]:
                            continue
                        src = n * c_in * hw + (y * sh - ph + i * dh) * w + q * sw - pw + j * dw
                        for c in range(c_in):
                            cols[U(cb + c * kk + i * kw + j)] = xf[U(src + c * hw)]


@jit(fastmath={"reassoc"})
def _small_conv_narrow(x, wt, bias, t, out):
    """:func:`_small_conv` for a few output pixels (1x1 planes: squeeze-and-excitation): each
    pixel's column, (C*kh*kw,), is built contiguous, then every output is the dot product of
    its channel's weights and its pixel's column in the group, a loop along the weights that
    vectorizes (its sum reassociated), where loops along a handful of pixels would not."""
    n_img, c_in = t[_T_N], t[_T_C]
    m_out, oh, ow, kh, kw = t[_T_M], t[_T_OH], t[_T_OW], t[_T_KH], t[_T_KW]
    group, act, has_bias = t[_T_GROUP], t[_T_ACT], t[_T_BIAS]
    rows = c_in * kh * kw
    rows_g = rows // group
    mg = m_out // group
    length = oh * ow
    wf = wt.reshape(wt.size)
    of = out.reshape(out.size)
    zero = np.zeros(1, out.dtype)[0]
    cols = np.zeros(n_img * length * rows, out.dtype)  # (pixel, c*kh*kw)
    _pixel_columns(x.reshape(x.size), t, cols)
    for n in range(n_img):
        for m in range(m_out):
            wb = m * rows_g
            ob = (n * m_out + m) * length
            bv = bias[m] if has_bias else zero
            for p in range(length):
                cb = (n * length + p) * rows + (m // mg) * rows_g
                acc = zero
                for r in range(rows_g):
                    acc += wf[U(wb + r)] * cols[U(cb + r)]
                of[U(ob + p)] = _activate(acc + bv, act, zero)


@jit()
def _small_conv_by_channels(x, wt_cols, bias, t, out):
    """:func:`_small_conv_narrow` for an ungrouped convolution with many output channels and
    its weights laid out once as ``wt_cols`` (C*kh*kw, M), flat: each pixel's outputs are the
    sum over its column of the column's value times a row of ``wt_cols``, a loop along the
    output channels that vectorizes without a sum across the vector (four pixels share each
    row's loads). 2x40x1x1 -> 240 channels 3.7 -> 2.4 us, 2x24x2x2 -> 144 4.5 -> 3.0 us."""
    n_img, c_in = t[_T_N], t[_T_C]
    m_out, oh, ow, kh, kw = t[_T_M], t[_T_OH], t[_T_OW], t[_T_KH], t[_T_KW]
    act, has_bias = t[_T_ACT], t[_T_BIAS]
    rows = c_in * kh * kw
    length = oh * ow
    pixels = n_img * length
    of = out.reshape(out.size)
    zero = np.zeros(1, out.dtype)[0]
    cols = np.zeros(pixels * rows, out.dtype)  # (pixel, c*kh*kw)
    _pixel_columns(x.reshape(x.size), t, cols)
    acc = np.empty(4 * m_out, out.dtype)
    for p in range(0, pixels, 4):
        block = min(4, pixels - p)
        for k in range(4 * m_out):
            acc[U(k)] = zero
        if block == 4:
            cb = p * rows
            for r in range(rows):
                c0, c1 = cols[U(cb + r)], cols[U(cb + rows + r)]
                c2, c3 = cols[U(cb + 2 * rows + r)], cols[U(cb + 3 * rows + r)]
                wb = r * m_out
                for m in range(m_out):
                    wv = wt_cols[U(wb + m)]
                    acc[U(m)] += c0 * wv
                    acc[U(m_out + m)] += c1 * wv
                    acc[U(2 * m_out + m)] += c2 * wv
                    acc[U(3 * m_out + m)] += c3 * wv
        else:
            for k in range(block):
                cb = (p + k) * rows
                ab = k * m_out
                for r in range(rows):
                    cv = cols[U(cb + r)]
                    wb = r * m_out
                    for m in range(m_out):
                        acc[U(ab + m)] += cv * wt_cols[U(wb + m)]
        for k in range(block):
            n = (p + k) // length
            ob = n * m_out * length + (p + k - n * length)
            ab = k * m_out
            for m in range(m_out):
                bv = bias[m] if has_bias else zero
                of[U(ob + m * length)] = _activate(acc[U(ab + m)] + bv, act, zero)


@jit()
def _rows_times_columns(res, cols, wf, wb, rows, cb, width):
    """res[:width] += the weights wf[wb:wb + rows] times the column rows from ``cb`` on: four
    column rows per pass over the result row (fewer loads and stores of it)."""
    quads = rows // 4
    for r4 in range(quads):
        r = 4 * r4
        w0, w1 = wf[U(wb + r)], wf[U(wb + r + 1)]
        w2, w3 = wf[U(wb + r + 2)], wf[U(wb + r + 3)]
        s0 = cb + r * width
        for p in range(width):
            res[U(p)] += (w0 * cols[U(s0 + p)] + w1 * cols[U(s0 + width + p)]) + (
                w2 * cols[U(s0 + 2 * width + p)] + w3 * cols[U(s0 + 3 * width + p)])
    for r in range(4 * quads, rows):
        wv = wf[U(wb + r)]
        s0 = cb + r * width
        for p in range(width):
            res[U(p)] += wv * cols[U(s0 + p)]


@jit()
def _rows_times_columns4(res, cols, wf, wb, rows, cb, width):
    """:func:`_rows_times_columns` for four output channels at once (weights wb + k*rows,
    results res[k*width:(k+1)*width]), two column rows per pass."""
    for r2 in range(rows // 2):
        r = 2 * r2
        a0, a1 = wf[U(wb + r)], wf[U(wb + r + 1)]
        b0, b1 = wf[U(wb + rows + r)], wf[U(wb + rows + r + 1)]
        c0, c1 = wf[U(wb + 2 * rows + r)], wf[U(wb + 2 * rows + r + 1)]
        d0, d1 = wf[U(wb + 3 * rows + r)], wf[U(wb + 3 * rows + r + 1)]
        s0 = cb + r * width
        for p in range(width):
            x0 = cols[U(s0 + p)]
            x1 = cols[U(s0 + width + p)]
            res[U(p)] += a0 * x0 + a1 * x1
            res[U(width + p)] += b0 * x0 + b1 * x1
            res[U(2 * width + p)] += c0 * x0 + c1 * x1
            res[U(3 * width + p)] += d0 * x0 + d1 * x1
    if rows % 2:
        r = rows - 1
        a0, b0 = wf[U(wb + r)], wf[U(wb + rows + r)]
        c0, d0 = wf[U(wb + 2 * rows + r)], wf[U(wb + 3 * rows + r)]
        s0 = cb + r * width
        for p in range(width):
            x0 = cols[U(s0 + p)]
            res[U(p)] += a0 * x0
            res[U(width + p)] += b0 * x0
            res[U(2 * width + p)] += c0 * x0
            res[U(3 * width + p)] += d0 * x0


@jit()
def _rows_times_columns2(res, cols, wf, wb, rows, cb, width):
    """:func:`_rows_times_columns` for two output channels at once (weights wb and
    wb + rows, results res[:width] and res[width:]): each column load serves both."""
    quads = rows // 4
    for r4 in range(quads):
        r = 4 * r4
        w0, w1 = wf[U(wb + r)], wf[U(wb + r + 1)]
        w2, w3 = wf[U(wb + r + 2)], wf[U(wb + r + 3)]
        v0, v1 = wf[U(wb + rows + r)], wf[U(wb + rows + r + 1)]
        v2, v3 = wf[U(wb + rows + r + 2)], wf[U(wb + rows + r + 3)]
        s0 = cb + r * width
        for p in range(width):
            c0 = cols[U(s0 + p)]
            c1 = cols[U(s0 + width + p)]
            c2 = cols[U(s0 + 2 * width + p)]
            c3 = cols[U(s0 + 3 * width + p)]
            res[U(p)] += (w0 * c0 + w1 * c1) + (w2 * c2 + w3 * c3)
            res[U(width + p)] += (v0 * c0 + v1 * c1) + (v2 * c2 + v3 * c3)
    for r in range(4 * quads, rows):
        w0, v0 = wf[U(wb + r)], wf[U(wb + rows + r)]
        s0 = cb + r * width
        for p in range(width):
            c0 = cols[U(s0 + p)]
            res[U(p)] += w0 * c0
            res[U(width + p)] += v0 * c0


def _reach(size, out_size, k, s, p, d):
    """For each tap along one axis, the output positions [lo, hi) whose input position
    o*s - p + tap*d lies inside [0, size)."""
    ranges = []
    for tap in range(k):
        inside = [o for o in range(out_size) if 0 <= o * s - p + tap * d < size]
        ranges += [inside[0], inside[-1] + 1] if inside else [0, 0]
    return ranges


@functools.lru_cache(maxsize=1024)
def _small_table(xshape, wshape, group, act, has_bias, plan):
    """The int64 table :func:`_small_conv` runs on (4-D shapes; a Conv1d's as 2-D)."""
    _, (n, m, oh, ow), s, pb, d, k, _ = plan
    t = [n, xshape[1], xshape[2], xshape[3], m, oh, ow, k[0], k[1], s[0], s[1], pb[0], pb[1],
         d[0], d[1], group, act, int(has_bias), int(n * oh * ow <= _SMALL_NARROW)]
    t += _reach(xshape[2], oh, k[0], s[0], pb[0], d[0])
    t += _reach(xshape[3], ow, k[1], s[1], pb[1], d[1])
    table = np.array(t, np.int64)
    table.flags.writeable = False
    return table

@jit(parallel=True)
def _depthwise_input_grad(dy, wt, mult, sh, sw, ph, pw, dh, dw, dx):
    """dx of a depthwise convolution (one input channel per group, ``mult`` outputs each):
    every output gradient pixel adds g * w into the inputs its taps read (the tap table).
    One (image, input channel) plane per task, so no two tasks write the same element."""
    n_img, m_out, oh, ow = dy.shape
    c_in, h, w = dx.shape[1], dx.shape[2], dx.shape[3]
    kh, kw = wt.shape[2], wt.shape[3]
    length = oh * ow
    kk = kh * kw
    hw = h * w
    count, src, tap = _taps(h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow)
    dyf = dy.reshape(dy.size)
    wf = wt.reshape(wt.size)
    dxf = dx.reshape(dx.size)
    for t in prange(n_img * c_in):
        n = t // c_in
        c = t % c_in
        xb = t * hw
        for q in range(hw):
            dxf[U(xb + q)] = 0
        for mm in range(mult):
            m = c * mult + mm
            yb = (n * m_out + m) * length
            wb = m * kk
            for p in range(length):
                g = dyf[U(yb + p)]
                base = p * kk
                for k in range(count[p]):
                    dxf[U(xb + src[U(base + k)])] += g * wf[U(wb + tap[U(base + k)])]


@jit(parallel=True)
def _depthwise_weight_grad(x, dy, mult, sh, sw, ph, pw, dh, dw, dwt):
    """dW of a depthwise convolution: for each output channel, the sum over images and output
    pixels of g * the inputs its taps read (the tap table). One output channel per task."""
    n_img, m_out, oh, ow = dy.shape
    c_in, h, w = x.shape[1], x.shape[2], x.shape[3]
    kh, kw = dwt.shape[2], dwt.shape[3]
    length = oh * ow
    kk = kh * kw
    hw = h * w
    count, src, tap = _taps(h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow)
    xf = x.reshape(x.size)
    dyf = dy.reshape(dy.size)
    dwf = dwt.reshape(dwt.size)
    for m in prange(m_out):
        c = m // mult
        acc = np.zeros(kk, np.float64)  # sums over batch and plane: float64 at no cost here
        for n in range(n_img):
            xb = (n * c_in + c) * hw
            yb = (n * m_out + m) * length
            for p in range(length):
                g = dyf[U(yb + p)]
                base = p * kk
                for k in range(count[p]):
                    acc[U(tap[U(base + k)])] += g * xf[U(xb + src[U(base + k)])]
        for k in range(kk):
            dwf[U(m * kk + k)] = acc[U(k)]


_DW_NHWC, _DW_TABLE, _DW_TAPS, _DW_FLAT, _DW, _DIRECT, _BY_IMAGE, _ONE_GEMM, _SMALL, _SKINNY = \
    range(10)


def _table_wins(in_sp, k, s, pb, d, out_sp):
    """Whether the tap-table depthwise kernel beats the other one for this geometry: the
    written-out kernel (``depthwise.py``) for windows of up to ``depthwise.MAX_TAPS`` taps,
    else the padded-plane one. Cost models fitted to measurements, in ns per channel: the
    table about 1 per tap inside the image plus 40; the written-out kernel 60, plus 4 per tap
    of its expression, 0.05 per tap and plane position (vectorized) and 0.3 per input pixel
    copied (0.5 and 20 per phase at a stride); the padded-plane kernel
    one unit per multiply-add over the padded-width plane plus 300 of set-up (stride 1; at
    a stride it loses to the table on output planes of up to 64 pixels). The table wins
    where most of a window falls in the padding (5x5 over a 2x2 plane)."""
    inside = 1
    for size, kk, st, p, dd, o in zip(in_sp, k, s, pb, d, out_sp):
        inside *= sum(1 for y in range(o) for i in range(kk) if 0 <= y * st - p + i * dd < size)
    taps = k[0] * k[1]
    if taps <= depthwise.MAX_TAPS:
        if s == (1, 1):
            wq = max(out_sp[1] + (k[1] - 1) * d[1], pb[1] + in_sp[1])
        else:  # the width of a stride phase
            wq = out_sp[1] + ((k[1] - 1) * d[1]) // s[1]
        span = (out_sp[0] - 1) * wq + out_sp[1]
        plane = in_sp[0] * in_sp[1]
        fill = 0.3 * plane if s == (1, 1) else 0.5 * plane + 20 * s[0] * s[1]
        return inside + 40 < 60 + 4 * taps + 0.05 * taps * span + fill
    if s != (1, 1):
        return out_sp[0] * out_sp[1] <= _TABLE_MAX_STRIDED
    wp = max(out_sp[1] + (k[1] - 1) * d[1], pb[1] + in_sp[1])
    return 6 * inside < k[0] * k[1] * out_sp[0] * wp + 300


def _small(work, width, strided=False):
    """Whether a convolution of ``work`` multiply-adds over ``width`` output pixels (all the
    images) is cheaper as one :func:`_small_conv` call than as columns and a GEMM
    (``strided``: an ungrouped convolution with a stride, whose columns cost more)."""
    if width <= _SMALL_NARROW:
        return work <= _SMALL_MAX_WORK_NARROW
    if strided and width >= _SMALL_STRIDED_WIDE and work <= _SMALL_MAX_WORK_STRIDED:
        return True
    return work <= _SMALL_MAX_WORK or (width >= _SMALL_WIDE and work <= _SMALL_MAX_WORK_WIDE)


def _key(v):
    return tuple(v) if v is not None and not isinstance(v, (str, int)) else v


_PLANS: dict = {}  # the plans of calls whose attributes are hashable as given (tuples)


def _plan_of(X, W, kernel_shape, strides, pads, dilations, auto_pad, group):
    """:func:`_plan` of a call: one dict lookup when the attributes come as tuples."""
    serial = not _jit._parallel
    key = (X.shape, W.shape, X.itemsize, kernel_shape, strides, pads, dilations, auto_pad, group,
           serial)
    try:
        return _PLANS[key]
    except (KeyError, TypeError):
        pass
    plan = _plan(X.shape, W.shape, X.itemsize, _key(kernel_shape), _key(strides), _key(pads),
                 _key(dilations), auto_pad, group, serial)
    try:
        if len(_PLANS) < 4096:
            _PLANS[key] = plan
    except TypeError:  # a list among the attributes
        pass
    return plan


@functools.lru_cache(maxsize=1024)
def _plan(xshape, wshape, itemsize, kernel_shape, strides, pads, dilations, auto_pad, group,
          serial=False):
    """Everything about a call that its shapes and attributes decide, worked out once per
    signature and thread mode (``serial``: kernels on one thread): (path, output shape,
    strides, begin pads, dilations, kernel, images per chunk)."""
    n, c, h, w = xshape
    m = wshape[0]
    if group < 1 or m % group:
        raise ShapeError(f"Conv: W has {m} output channels, which group={group} cannot split "
                         "into equal groups; W's first dimension must be a multiple of group")
    k = tuple(kernel_shape) if kernel_shape else tuple(wshape[2:])
    s, pb, _, d, (oh, ow), _ = _geometry((h, w), k, strides, pads, dilations, auto_pad)
    length = oh * ow
    rows = c * k[0] * k[1]
    direct = k == (1, 1) and s == (1, 1) and pb == (0, 0) and (oh, ow) == (h, w)
    if group > 1 and c == group:
        taps = k[0] * k[1]
        if s == (1, 1) and d == (1, 1) and (oh, ow) == (h, w) and length >= _FLAT_MIN_LENGTH \
                and taps <= depthwise.MAX_TAPS and 0 <= pb[0] < k[0] and 0 <= pb[1] < k[1]:
            path = _DW_FLAT  # (pads inside the window on both ends: none negative)
        elif m == c and c >= _NHWC_MIN_CHANNELS and (
                length <= _NHWC_MAX_LENGTH or (s != (1, 1) and length <= _NHWC_MAX_LENGTH_STRIDED)
        ) and not (taps <= _TAPS_OVER_NHWC and
                   length >= (_TAPS_MIN_LENGTH if s == (1, 1) else _TAPS_MIN_LENGTH_STRIDED)):
            path = _DW_NHWC
        elif _table_wins((h, w), k, s, pb, d, (oh, ow)):
            path = _DW_TABLE
        else:
            path = _DW_TAPS if taps <= depthwise.MAX_TAPS else _DW
    elif group == 1 and itemsize == 4 and n * length <= _SKINNY_MAX_WIDTH and \
            rows >= _SKINNY_MIN_ROWS and m * rows * itemsize >= _SKINNY_MIN_WEIGHTS:
        path = _SKINNY
    elif _small(m * rows // group * n * length, n * length, s != (1, 1) and group == 1):
        path = _SMALL
    elif group == 1 and itemsize == 4 and length == 1 and n <= _SKINNY_MAX_IMAGES and direct:
        path = _SKINNY  # 1x1 over 1x1 planes (squeeze-and-excitation): the input is its operand
    elif direct:
        path = _DIRECT  # the input already is the GEMM operand
    elif serial and n > 1 and group == 1 and rows >= _CACHED_CHUNK_MIN_ROWS and \
            rows * length * itemsize <= _BAND_MIN_COLUMNS:
        # one thread: one GEMM per chunk of images whose columns stay in cache (about 1 MiB),
        # against one GEMM per image over the whole batch's columns: 0.8-0.9x the time of
        # the convolution and its weight gradient for 3x3 windows over 256-1152 rows (a
        # training CNN's 32x32x14x14 -> 64 3.9 -> 3.2 ms; docs/benchmarks.md, "Tenth round")
        chunk = max(1, min(n, _CACHED_CHUNK_BYTES // (max(rows, m) * length * itemsize)))
        return _ONE_GEMM, (n, m, oh, ow), s, pb, d, k, chunk
    elif n > 1 and (length <= _ONE_GEMM_MAX_LENGTH
                    or m * (rows // group) * itemsize >= _ONE_GEMM_MIN_WEIGHTS):
        path = _ONE_GEMM
    else:
        path = _BY_IMAGE
    # images per chunk: their columns, and the GEMM result (or dY's copy) of the batch-wide
    # GEMM, within the budget
    chunk = max(1, min(n, _COLS_BUDGET // max(max(rows, m) * length * itemsize, 1)))
    return path, (n, m, oh, ow), s, pb, d, k, chunk


def _band_rows(m, rows, length, ow, group, itemsize):
    """Output rows per band of a one-image GEMM, or 0 for the whole image at once. On one
    thread, OpenBLAS multiplies a narrow weight matrix (M <= 192) by wide columns (4 MiB and
    more) at 31-37 GMAC/s here, and by blocks of about 1 MiB of them at 43-46, so those are
    built and multiplied a band at a time. On more threads each band's column build, GEMM and
    store would each fork and join: measured 1.2-2.3x slower there, so bands are not used
    (docs/benchmarks.md, "Tenth round")."""
    if _jit._parallel or group != 1 or m > _BAND_MAX_OUT or \
            rows * length * itemsize <= _BAND_MIN_COLUMNS:
        return 0
    return max(1, _BAND_BYTES // (rows * ow * itemsize))


def conv(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
         pads=None, strides=None, out=None):
    """ONNX Conv for 1-D and 2-D float inputs (see :func:`onemodel.numba.support.conv`); ``out``: a
    planned C-contiguous buffer of the output's shape and dtype to fill and return."""
    return _conv(X, W, B, 0, auto_pad, dilations, group, kernel_shape, pads, strides, out)


def fused_conv(X, W, B=None, Z=None, *, activation="Relu", auto_pad="NOTSET", dilations=None,
               group=1, kernel_shape=None, pads=None, strides=None, out=None):
    """Conv followed by its activation, applied in the same pass as the bias; with ``Z`` (a
    residual Add's other addend), the convolution, then Z added and the activation applied
    in one pass over the output (:func:`_add_activate`)."""
    if Z is None:
        return _conv(X, W, B, ACT_CODES[activation], auto_pad, dilations, group, kernel_shape,
                     pads, strides, out)
    if Z.dtype == X.dtype:
        y = _conv(X, W, B, 0, auto_pad, dilations, group, kernel_shape, pads, strides, out)
        if Z.shape == y.shape and y.flags.c_contiguous:
            pick(_add_activate)(y, np.ascontiguousarray(Z), ACT_CODES[activation])
            return y
    # what the reference makes of it: a Z that broadcasts, or of another dtype (numpy's
    # promotion, as the Add did), or an error naming the shapes
    ref = OPS["FusedConv"].kernel(X, W, B, Z, activation=activation, auto_pad=auto_pad,
                                  dilations=dilations, group=group, kernel_shape=kernel_shape,
                                  pads=pads, strides=strides)
    if out is None:
        return ref
    out[...] = ref
    return out


@jit(parallel=True)
def _add_activate(y, z, act):
    """y = act(y + z) in place, for C-contiguous ``y`` and ``z`` of one shape: a residual
    FusedConv's Add and activation after its convolution."""
    yf = y.reshape(y.size)
    zf = z.reshape(z.size)
    zero = np.zeros(1, y.dtype)[0]
    for i in prange(yf.shape[0]):
        yf[i] += zf[i]
    _activate_in_place(yf, 0, yf.shape[0], act, zero)


@jit()
def _residual_in_place(yf, zf, act, zero):
    """yf = act(yf + zf) (flat arrays of one length): the end of a kernel that adds a
    residual FusedConv's Z itself (pointwise.py)."""
    for i in range(yf.shape[0]):
        yf[U(i)] += zf[U(i)]
    _activate_in_place(yf, 0, yf.shape[0], act, zero)


def _attrs_2d(kernel_shape, pads, strides, dilations):
    """A 1-D convolution's attributes as the 2-D one's over a height of 1."""
    kernel_shape = (1, kernel_shape[0]) if kernel_shape else None
    pads = (0, pads[0], 0, pads[1]) if pads else None
    strides = (1, strides[0]) if strides else None
    dilations = (1, dilations[0]) if dilations else None
    return kernel_shape, pads, strides, dilations


def _as_2d(X, W, kernel_shape, pads, strides, dilations, out):
    """A 1-D convolution as the 2-D one over a height of 1 (views, no copies)."""
    X = X.reshape(X.shape[0], X.shape[1], 1, X.shape[2])
    W = W.reshape(W.shape[0], W.shape[1], 1, W.shape[2])
    kernel_shape, pads, strides, dilations = _attrs_2d(kernel_shape, pads, strides, dilations)
    if out is not None:
        out = out.reshape(out.shape[0], out.shape[1], 1, out.shape[2])
    return X, W, kernel_shape, pads, strides, dilations, out


def _conv(X, W, B, act, auto_pad, dilations, group, kernel_shape, pads, strides, out):
    if X.ndim == 3:  # Conv1d (Whisper's stem, wav2vec, TCNs)
        if out is not None and out.ndim != 3:
            raise ShapeError(f"Conv: out= has shape {out.shape}; a 1-D convolution's result "
                             "has 3 axes (N, M, width)")
        X, W, kernel_shape, pads, strides, dilations, out2 = _as_2d(
            X, W, kernel_shape, pads, strides, dilations, out)
        y = _conv(X, W, B, act, auto_pad, dilations, group, kernel_shape, pads, strides, out2)
        return out if out is not None else y.reshape(y.shape[0], y.shape[1], y.shape[3])
    sync_threads()
    X = np.ascontiguousarray(X)
    W = np.ascontiguousarray(W)
    plan = _plan_of(X, W, kernel_shape, strides, pads, dilations, auto_pad, group)
    has_bias = B is not None
    bias = np.ascontiguousarray(B) if has_bias else _NO_BIAS[X.dtype]
    return _run(X, W, bias, has_bias, act, group, plan, out)


# the depthwise kernels that visit only the taps inside the image: a weight that is not
# finite times the padding's zero would be NaN (as in the reference and PyTorch), which they
# never compute, so weights with one go to a kernel that reads the padding
_SKIPS_PADDING = frozenset((_DW_NHWC, _DW_TABLE))


def _all_finite(w: np.ndarray) -> bool:
    """Whether every weight is finite: one vectorized pass (np.isfinite(w).all() took 3-7 us
    on 864-28800 depthwise weights, a planned call's whole budget on small planes)."""
    return _finite_sum(w.reshape(w.size)) == 0


@jit(fastmath={"reassoc"})
def _finite_sum(wf):
    """0 when every value is finite, NaN otherwise (v - v is 0 for finite v, NaN for inf and
    NaN, and a NaN stays NaN in any order of the sum)."""
    acc = np.zeros(1, wf.dtype)[0]
    for i in range(wf.shape[0]):
        acc += wf[U(i)] - wf[U(i)]
    return acc


def _run(X, W, bias, has_bias, act, group, plan, out, prepared=None):
    """The convolution of C-contiguous NCHW ``X`` and ``W`` with its plan (:func:`_plan`):
    the per-call part, shared by the generic call and the plan-time specialized one
    (``prepared``: ``W`` laid out for the path once, see :func:`_prepared_weights`)."""
    path, shape, s, pb, d, k, chunk = plan
    if out is not None and (out.shape != shape or not out.flags.c_contiguous or
                            out.dtype != X.dtype):
        if out.shape != shape:  # the kernels index out unchecked: never past its end
            raise ShapeError(f"Conv: out= has shape {out.shape}, the result {shape}")
        if out.dtype != X.dtype:  # bound machine code checks only the item size: an int32
            # out would take float32 bits
            raise DTypeError(f"Conv: out= has dtype {out.dtype}, the result {X.dtype}; "
                             "pass an out= of the inputs' dtype, or none")
        out[...] = _run(X, W, bias, has_bias, act, group, plan, None, prepared)
        return out  # a strided out (the kernels write C-contiguous arrays) gets a copy
    y = np.empty(shape, X.dtype) if out is None else out
    n, m, oh, ow = shape
    if y.size == 0:
        return y
    if path == _SMALL and prepared is None:
        _small_conv(X, W, bias, _small_table(X.shape, W.shape, group, act, has_bias, plan), y)
        return y
    if path in _SKIPS_PADDING and not _all_finite(W):
        path = _DW_TAPS if k[0] * k[1] <= depthwise.MAX_TAPS else _DW
    if path == _DW_NHWC:  # bias and activation applied in the same pass
        if prepared is None:
            prepared = _channels_last_weights(W)
        pick(_depthwise_nhwc)(X, prepared, k[0], k[1], s[0], s[1], pb[0], pb[1], d[0],
                              d[1], bias, has_bias, act, y)
        return y
    if path == _DW_FLAT:
        pick(depthwise.flat_kernel(k[0], k[1], pb[1]))(
            X, W, m // group, pb[0], depthwise.column_flags(oh, ow, k[1], pb[1]), bias,
            has_bias, act, y)
        return y
    if path <= _DW:
        kernel = _depthwise_table if path == _DW_TABLE else (
            depthwise.kernel(k[0], k[1]) if path == _DW_TAPS else _depthwise)
        pick(kernel)(X, W, m // group, s[0], s[1], pb[0], pb[1], d[0], d[1], bias, has_bias,
                      act, y)
        return y
    if isinstance(prepared, PreparedCall):  # Winograd, tiles or rows, made at plan time
        return prepared.run(X, bias, has_bias, act, plan, y)
    length = oh * ow
    c = X.shape[1]
    mg = m // group
    y3 = y.reshape(n, m, length)
    # np.dot skips np.matmul's ufunc set-up, but takes only operands of the output's dtype
    product = np.dot if W.dtype == X.dtype else np.matmul
    if path == _DIRECT:
        if group == 1 and n == 1:
            product(W.reshape(m, c), X.reshape(c, length), out=y.reshape(m, length))
        elif group == 1 and length == 1 and c >= m:  # (N, C) @ (C, M): the output's layout
            product(X.reshape(n, c), W.reshape(m, c).T, out=y.reshape(n, m))
        elif group == 1 and n <= _DOT_MAX_IMAGES:  # np.dot per image: no ufunc set-up
            w2 = W.reshape(m, c)
            for i in range(n):
                product(w2, X[i].reshape(c, length), out=y3[i])
        else:  # one GEMM per image (and group)
            np.matmul(W.reshape(group, mg, c // group), X.reshape(n, group, c // group, length),
                      out=y.reshape(n, group, mg, length))
        _finish(y3, bias, has_bias, act)
        return y
    rows = c * k[0] * k[1]
    w3 = W.reshape(group, mg, rows // group)
    if path == _SKINNY:  # the whole batch's columns, transposed, and one numba product
        if prepared is not None:  # 1x1 planes, weights (C, M): (N, C) @ (C, M), the output
            product(X.reshape(n, c), prepared, out=y.reshape(n, m, copy=False))
            _finish(y3, bias, has_bias, act)
            return y
        width = n * length
        direct = k == (1, 1) and s == (1, 1) and pb == (0, 0) and X.shape[2:] == (oh, ow)
        if direct and length == 1:  # 1x1 planes: the input is the columns, y the result
            pick(_skinny_gemm)(W.reshape(m, c), X.reshape(n, c), y.reshape(y.size, copy=False),
                               1, m)
            _finish(y3, bias, has_bias, act)
            return y
        if direct:  # a 1x1 convolution's transposed columns are its input channels-last
            xt = np.ascontiguousarray(X.reshape(n, c, length).transpose(0, 2, 1))
        else:
            cols = np.empty((rows, n, length), X.dtype)
            pick(_columns(k, s, ow))(X, k[0], k[1], s[0], s[1], pb[0], pb[1], d[0], d[1], oh, ow, cols,
                          False)
            xt = np.ascontiguousarray(cols.reshape(rows, width).T)
        res = np.empty((m, width), X.dtype)
        pick(_skinny_gemm)(W.reshape(m, rows), xt.reshape(width, rows), res.reshape(res.size),
                           width, 1)
        pick(_scatter)(res, bias, has_bias, act, y3)
        return y
    band = _band_rows(m, rows, length, ow, group, X.itemsize) if path == _BY_IMAGE else 0
    if 0 < band < oh:  # a band of output rows at a time: its columns stay in cache for the GEMM
        cols_all = np.empty(rows * band * ow, X.dtype)
        res_all = np.empty(m * band * ow, X.dtype)
        w2 = w3[0]
        build = pick(_im2col_band)
        store = pick(_store_band)
        for i in range(n):
            yi = y3[i].reshape(m * length)
            for y0 in range(0, oh, band):
                ny = min(band, oh - y0)
                width = ny * ow
                cols = cols_all[:rows * width].reshape(rows, width)
                build(X, i, k[0], k[1], s[0], s[1], pb[0], pb[1], d[0], d[1], ow, y0, ny, cols)
                res = res_all[:m * width].reshape(m, width)
                product(w2, cols, out=res)
                store(res, bias, has_bias, act, yi, y0 * ow, length)
        return y
    cols_all = np.empty(rows * chunk * length, X.dtype)
    im2col = pick(_columns(k, s, ow))
    if path == _BY_IMAGE:  # columns of a chunk of images, one GEMM per image into y
        for start in range(0, n, chunk):
            n_img = min(chunk, n - start)
            cols = cols_all[:rows * n_img * length].reshape(n_img, rows, length)
            im2col(X[start:start + n_img], k[0], k[1], s[0], s[1], pb[0], pb[1], d[0], d[1],
                   oh, ow, cols, True)
            if group == 1 and n_img == 1:
                product(w3[0], cols[0], out=y3[start])
            else:
                np.matmul(w3, cols.reshape(n_img, group, rows // group, length),
                          out=y3[start:start + n_img].reshape(n_img, group, mg, length))
        if has_bias or act:
            pick(_epilogue)(y3, bias, has_bias, act)
        return y
    # one GEMM per chunk: the weights are read once for all its images
    res_all = np.empty(m * chunk * length, X.dtype)
    scatter = pick(_scatter)
    for start in range(0, n, chunk):
        n_img = min(chunk, n - start)
        width = n_img * length
        cols = cols_all[:rows * width].reshape(rows, n_img, length)
        im2col(X[start:start + n_img], k[0], k[1], s[0], s[1], pb[0], pb[1], d[0], d[1], oh,
               ow, cols, False)
        res = res_all[:m * width].reshape(m, width)
        if group == 1:
            product(w3[0], cols.reshape(rows, width), out=res)
        else:
            np.matmul(w3, cols.reshape(group, rows // group, width),
                      out=res.reshape(group, mg, width))
        scatter(res, bias, has_bias, act, y3[start:start + n_img])
    return y


@specializer(conv)
def _conv_at(site: CallSite):
    """Conv planned for its shapes: the plan, the bias (and the weights, when constant) made
    ready once; a call checks its inputs and runs :func:`_run`."""
    return _conv_site(site, 0)


@specializer(fused_conv)
def _fused_conv_at(site: CallSite):
    """FusedConv planned for its shapes, as :func:`_conv_at` (the activation's code once);
    with a residual Z, :func:`_residual_site`."""
    act = ACT_CODES.get(site.attrs.get("activation", "Relu"))
    if act is None:
        return None
    if len(site.shapes) > 3 and site.shapes[3] is not None:
        return _residual_site(site, act)
    return _conv_site(site, act)


def _residual_site(site: CallSite, act: int):
    """FusedConv(X, W, B, Z): the convolution's own planned call without an activation, then
    Z added and the activation applied in one pass (:func:`_add_activate`). A Z of another
    shape, dtype or layout than planned, or an output the convolution's call did not make
    C-contiguous, takes the generic call."""
    yshape, dtype = site.out_shapes[0], site.dtypes[0]
    if yshape is None or site.shapes[3] != yshape or site.dtypes[3] != dtype:
        return None
    attrs = {k: v for k, v in site.attrs.items() if k != "activation"}
    generic = site.generic
    inner = _conv_site(replace(site, shapes=site.shapes[:3], dtypes=site.dtypes[:3],
                               values=site.values[:3], attrs=attrs,
                               generic=functools.partial(conv, **attrs)), act, generic)
    if inner is None or getattr(inner, "adds_residual", False):
        return inner
    bound = [None]  # the serial pass's machine code (_jit.entry), bound at the first call

    def residual_at(X, W, B=None, Z=None, out=None):
        if Z is None or Z.shape != yshape or Z.dtype != dtype or not Z.flags.c_contiguous:
            return generic(X, W, B, Z, out=out)
        y = inner(X, W, B, out=out)
        if y.shape != yshape or not y.flags.c_contiguous:
            return generic(X, W, B, Z, out=out)
        if _jit._parallel:
            _add_activate(y, Z, act)
        else:
            (bound[0] or _jit.bind(bound, _add_activate.serial, (y, Z, act)))(y, Z, act)
        return y

    def direct(known, out):  # the convolution's kernels, then the pass that adds Z
        offer = getattr(inner, "direct", None)
        sync_threads()
        if offer is None or _jit._parallel or len(known) < 4 or \
                not planned(known[3], yshape, dtype) or not planned(out, yshape, dtype):
            return None
        first = offer(known[:3], out)
        if first is None:
            return None
        return (*(first if isinstance(first, tuple) else (first,)),
                _jit.direct(_add_activate.serial, (Output(), Input(3), act), known, out))
    residual_at.direct = direct
    return residual_at


def _prepared_weights(plan, xshape, w):
    """Constant weights laid out once for the path that reads them otherwise, or None: the
    channels-last kernel's (kh, kw, C) copy, and for a 1x1 convolution over 1x1 planes that
    widens the channels, (C, M), which BLAS multiplies at once (2x144 -> 576: 10.5 -> 5.5 us;
    the skinny product stays ahead when narrowing, and past 1 MiB of weights, where
    OpenBLAS packs them on every call: 2x576 -> 1024 45 against 206 us)."""
    path, (_, m, oh, ow) = plan[0], plan[1]
    if path == _DW_NHWC:
        return _channels_last_weights(w)
    if path in (_BY_IMAGE, _ONE_GEMM, _SKINNY, _DIRECT, _SMALL) and not _jit._parallel:
        from . import conv_rows, tiled, winograd

        group = xshape[1] // w.shape[1]
        if w.dtype == np.float32 and conv_rows.fits(plan, xshape, w.shape, group):
            return conv_rows.ConvRows(w, plan, xshape)
        if path == _SMALL:  # one call of _small_conv, or the rows above
            return None
        if path in (_BY_IMAGE, _ONE_GEMM) and winograd.fits(plan, xshape, w.shape, group) \
                and not (w.dtype == np.float32 and tiled.beats_winograd(plan, xshape, w.shape,
                                                                        group)):
            return _Winograd(winograd.weights(w), winograd.run)
        if w.dtype == np.float32 and tiled.fits(plan, xshape, w.shape, group):
            return tiled.Tiled(w, plan, xshape)
    c = w.shape[1]
    if path == _SKINNY and xshape[2:] == (1, 1) and (oh, ow) == (1, 1) and \
            w.shape[2:] == (1, 1) and plan[3] == (0, 0) and c < m and \
            c * m * w.itemsize <= _CM_MAX_WEIGHTS:
        return np.ascontiguousarray(w.reshape(m, c).T)
    return None


_CM_MAX_WEIGHTS = 1 << 20


class PreparedCall:
    """Constant weights laid out once for a kernel of their own, with that kernel: the plan's
    convolution goes that way (:func:`_prepared_weights` looks the module up once, at plan
    time, not per call). Other prepared weights are plain arrays the paths read."""

    __slots__ = ()

    def run(self, X, bias, has_bias, act, plan, y):
        """The convolution of C-contiguous ``X`` into C-contiguous ``y``."""
        raise NotImplementedError

    def direct(self, bias, has_bias, act, plan) -> tuple | None:
        """``(kernel, arguments)`` where :meth:`run` is one call of a numba kernel, its X and y
        the ``Input(0)`` and ``Output()`` markers (a compiled plan's direct call); None where
        it is more than that."""
        return None


def _proven(known: tuple, out, xshape, yshape, dtype, w_const, bias) -> bool:
    """Whether a compiled plan proves what a planned convolution's call checks (``direct``):
    X a planned buffer of ``xshape``, the plan's own weights ``w_const`` and ``bias`` (None:
    omitted; ``_UNSET``, a constant the call does not take as it is, is never proven), an
    output buffer of ``yshape``."""
    return len(known) >= 2 and planned(known[0], xshape, dtype) and \
        constant(known[1], w_const) and constant_at(known, 2, bias) and \
        planned(out, yshape, dtype)


def bound_call(slot: list, kernel, args, y):
    """``kernel(*args)`` (its output ``y``, the last argument) by the machine code bound in
    ``slot`` at the first call: every call's arrays have the first's dtype, rank and layout
    (the caller's checks), so it takes them without numba's dispatch. A read-only ``y`` goes
    through the dispatch, which refuses it (the bound code would not). Returns ``y``."""
    if not y.flags.writeable:
        kernel(*args)
        return y
    (slot[0] or _jit.bind(slot, kernel, args))(*args)
    return y


class _Winograd(PreparedCall):
    """Weights transformed for :mod:`.winograd` (U, (16, M, C)) and its ``run``."""

    __slots__ = ("kernel", "u")

    def __init__(self, u: np.ndarray, kernel):
        self.u = u
        self.kernel = kernel

    def run(self, X, bias, has_bias, act, plan, y):
        return self.kernel(X, self.u, bias, has_bias, act, plan, y, pick)


# whether nothing can change a constant in place (read-only views down to immutable bytes: a
# file's constants, a session's own copies), so data derived from it once stays right
_immutable = is_frozen


def _ready(value) -> bool:
    """Whether a constant input can be handed to the kernels as it is."""
    return isinstance(value, np.ndarray) and value.flags.c_contiguous


def _conv_site(site: CallSite, act: int, residual=None):
    """The planned call of a convolution. ``residual``: the generic call of the residual
    FusedConv whose convolution ``site`` is (its Z left out): then a 1x1 lanes kernel's call
    that adds Z and applies ``act`` itself (marked ``adds_residual``), else the convolution's
    call without an activation (:func:`_residual_site` adds Z and applies it)."""
    lanes_act = act
    if residual is not None:
        act = 0
    shapes, dtypes, values = site.shapes, site.dtypes, site.values
    if len(shapes) < 2 or shapes[0] is None or shapes[1] is None:
        return None
    xshape, wshape = shapes[0], shapes[1]
    bshape = shapes[2] if len(shapes) > 2 else None
    dtype = dtypes[0]
    if dtype not in _NO_BIAS or dtypes[1] != dtype or len(xshape) not in (3, 4) or \
            len(wshape) != len(xshape) or (bshape is not None and dtypes[2] != dtype):
        return None
    attrs = site.attrs
    kernel_shape, pads = attrs.get("kernel_shape"), attrs.get("pads")
    strides, dilations = attrs.get("strides"), attrs.get("dilations")
    auto_pad, group = attrs.get("auto_pad", "NOTSET"), attrs.get("group", 1)
    if xshape[1] != wshape[1] * group or (kernel_shape and tuple(kernel_shape) != wshape[2:]):
        return None
    one_d = len(xshape) == 3
    x4, w4 = xshape, wshape
    if one_d:
        x4 = (xshape[0], xshape[1], 1, xshape[2])
        w4 = (wshape[0], wshape[1], 1, wshape[2])
        kernel_shape, pads, strides, dilations = _attrs_2d(kernel_shape, pads, strides,
                                                           dilations)
    try:
        sync_threads()
        plan = _plan(x4, w4, dtype.itemsize, _key(kernel_shape), _key(strides), _key(pads),
                     _key(dilations), auto_pad, group, not _jit._parallel)
    except Exception:  # attributes the generic call refuses: it names the problem
        return None
    y4 = plan[1]
    if (bshape is not None and bshape != (y4[1],)) or math.prod(y4) == 0:
        return None
    yshape = (y4[0], y4[1], y4[3]) if one_d else y4
    # constant weights and bias (initializers, as usual) that are C-contiguous already: a
    # call given these very arrays uses them as they are (views: an update in place shows)
    w_const = values[1] if len(values) > 1 and _ready(values[1]) else _UNSET
    w_ready = w_const.reshape(w4) if w_const is not _UNSET else None
    b_const = values[2] if bshape is not None and _ready(values[2]) else _UNSET
    b_ready = b_const if b_const is not _UNSET else _NO_BIAS[dtype]
    has_bias = bshape is not None
    generic = site.generic
    if not one_d and w_ready is not None and _immutable(w_ready):
        trimmed = _without_dead_taps(site, plan, w_const, act)
        if trimmed is not None:
            return trimmed
    if not one_d and w_ready is not None and _immutable(w_ready) and dtype == np.float32 and \
            not _jit._parallel:
        from . import pointwise, tiled

        lanes = pointwise.kernel(plan, x4, group)
        # the channel lanes before the register tiles; the pixel lanes where the tiles don't
        # fit (pointwise.fits says where each measured faster)
        if lanes is not None and (lanes is pointwise.channel_lanes or not tiled.fits(
                plan, x4, w4, group)) and (
                not has_bias or (b_const is not _UNSET and _immutable(b_const))):
            return _pointwise_site(plan, xshape, yshape, w_const, w_ready, b_const, has_bias,
                                   lanes_act, site.generic, residual)
    w_prepared = _prepared_weights(plan, x4, w_ready) if w_ready is not None and _immutable(w_ready) \
        else None
    if plan[0] == _SMALL and w_prepared is None:
        return _small_site(site, xshape, wshape, bshape, yshape, dtype, w_const, b_const,
                           _small_table(x4, w4, group, act, has_bias, plan))

    def conv_at(X, W, B=None, out=None):
        if X.shape != xshape or X.dtype != dtype or (B is None) == has_bias:
            return generic(X, W, B, out=out)
        if B is b_const or B is None:
            bias = b_ready
        elif B.shape != bshape or B.dtype != dtype:
            return generic(X, W, B, out=out)
        else:
            bias = np.ascontiguousarray(B)
        prepared = None
        if W is w_const:
            wk = w_ready
            prepared = w_prepared
        elif W.shape != wshape or W.dtype != dtype:
            return generic(X, W, B, out=out)
        else:
            wk = np.ascontiguousarray(W.reshape(w4) if one_d else W)
        sync_threads()
        if one_d:  # as the 2-D convolution over a height of 1 (views)
            X = np.ascontiguousarray(X.reshape(x4))
            y = _run(X, wk, bias, has_bias, act, group, plan,
                     None if out is None else out.reshape(y4), prepared)
            return out if out is not None else y.reshape(yshape)
        if not X.flags.c_contiguous:
            X = np.ascontiguousarray(X)
        return _run(X, wk, bias, has_bias, act, group, plan, out, prepared)

    def direct(known, out):  # a prepared path's one kernel, on the plan's weights and bias
        got = w_prepared.direct(b_ready, has_bias, act, plan) \
            if isinstance(w_prepared, PreparedCall) and not one_d else None
        if got is None or not _proven(known, out, xshape, yshape, dtype, w_const,
                                      b_const if has_bias else None):
            return None
        return _jit.direct(*got, known, out)
    conv_at.direct = direct
    if not one_d and w_ready is not None and plan[0] <= _DW and (
            plan[0] != _DW_NHWC or w_prepared is not None):
        return _depthwise_site(plan, xshape, dtype, w_const, w_ready, w_prepared, b_const,
                               b_ready, has_bias, act, group, conv_at)
    if not one_d and w_prepared is None and w_ready is not None and plan[0] == _DIRECT and \
            group == 1 and xshape[0] <= _DOT_MAX_IMAGES and yshape[2] * yshape[3] > 1:
        return _direct_site(xshape, yshape, dtype, w_const, w_ready, b_const, b_ready,
                            has_bias, act, conv_at)
    return conv_at


def _direct_site(xshape, yshape, dtype, w_const, w_ready, b_const, b_ready, has_bias, act,
                 conv_at):
    """The planned call of a 1x1 convolution with constant weights on a few images: one
    np.matmul, the (M, C) weights by each image's (C, H*W) plane, then the bias and
    activation in one pass. The (N, M, H*W) view of ``out`` is made once for the buffer a
    plan hands in run after run (not that of the input, which may be a caller's array: a
    kept view would keep it alive), and the checks of ``conv_at`` and :func:`_run` are made
    at plan time. Through them a call spent about 2 us more than its products and epilogue
    (2x16x16x16 -> 96: 22.5 against 20.5 us); paired in whole models, MNASNet 0.966-0.970x,
    MobileNetV3-small 0.984-0.995x. Anything else (other weights or bias, a strided input or
    ``out``) goes to ``conv_at``."""
    n, c = xshape[:2]
    m, length = yshape[1], yshape[2] * yshape[3]
    w2 = w_ready.reshape(m, c)
    finish = has_bias or act
    # (an out, its view): one tuple, read and written whole, so threads running the plan at
    # once each see a matching pair
    last_y = [(None, None)]
    bound = [None]  # the epilogue's machine code (_jit.entry), bound at the first call

    def direct_at(X, W, B=None, out=None):
        if W is not w_const or (B is not b_const if has_bias else B is not None) or \
                X.shape != xshape or X.dtype != dtype or not X.flags.c_contiguous or (
                    out is not None and (out.shape != yshape or out.dtype != dtype or
                                         not out.flags.c_contiguous)):
            return conv_at(X, W, B, out=out)
        sync_threads()
        x3 = X.reshape(n, c, length)
        if out is None:
            y = np.empty(yshape, dtype)
            y3 = y.reshape(n, m, length)
        else:
            y = out
            given, y3 = last_y[0]
            # (a view kept of an out made read-only since would still be writeable)
            if given is not out or not out.flags.writeable:
                y3 = out.reshape(n, m, length)
                last_y[0] = (out, y3)
        # one call for the images: numpy's loop makes the same GEMM per image that a np.dot
        # each made (bit for bit), without a Python call and two views per image
        np.matmul(w2, x3, out=y3)
        if finish:
            if _jit._parallel:
                _epilogue(y3, b_ready, has_bias, act)
            else:
                (bound[0] or _jit.bind(bound, _epilogue.serial, (y3, b_ready, has_bias, act)))(
                    y3, b_ready, has_bias, act)
        return y

    def direct(known, out):  # np.matmul into the buffer, then the epilogue's kernel
        sync_threads()
        if _jit._parallel or not _proven(known, out, xshape, yshape, dtype, w_const,
                                         b_const if has_bias else None):
            return None
        product = Direct(np.matmul, (w2, Input(0, (n, c, length)), Output((n, m, length))))
        if not finish:
            return product
        return product, _jit.direct(_epilogue.serial, (Output((n, m, length)), b_ready,
                                                       has_bias, act), known, out)
    direct_at.direct = direct
    return direct_at


def _live_taps(size, out, k, s, pb, d):
    """(first, end) of the kernel taps along one axis that read inside the input for some
    output position, or None when they are not one contiguous range."""
    live = []
    for t in range(k):
        first = max(0, -(-(pb - t * d) // s))  # the first output whose tap is at or past 0
        live.append(first < out and first * s - pb + t * d < size)
    if True not in live:
        return None
    lo = live.index(True)
    hi = k - live[::-1].index(True)
    return (lo, hi) if all(live[lo:hi]) else None


def _without_dead_taps(site: CallSite, plan, w_const, act: int):
    """The planned call of a 2-D convolution some of whose kernel rows or columns read only
    padding at these input sizes, as the smaller convolution of the taps that read the
    image: the same sums without the zero terms. A dilated ("atrous") 3x3 convolution whose
    dilation exceeds the feature map, as DeepLabV3's ASPP has on small inputs (dilations 12,
    24 and 36 over 4x4), is then a 1x1 convolution: 2.4-3.8 ms -> 0.20-0.23 ms each at
    2x960x4x4 -> 256 with its Relu. Only for constant weights nothing changes in place (the smaller copy
    cannot go stale) that are all finite (a zero times an infinite weight is NaN, which the
    full convolution keeps). Another weight array or input shape takes the generic call."""
    yshape, s, pb, d, k = plan[1:6]
    xshape = site.shapes[0]
    h, w = xshape[2:]
    rows = _live_taps(h, yshape[2], k[0], s[0], pb[0], d[0])
    cols = _live_taps(w, yshape[3], k[1], s[1], pb[1], d[1])
    if rows is None or cols is None or (rows == (0, k[0]) and cols == (0, k[1])) or \
            not np.isfinite(w_const).all():
        return None
    (r0, r1), (c0, c1) = rows, cols
    kh, kw = r1 - r0, c1 - c0
    begin = (pb[0] - r0 * d[0], pb[1] - c0 * d[1])
    end = ((yshape[2] - 1) * s[0] + (kh - 1) * d[0] + 1 - h - begin[0],
           (yshape[3] - 1) * s[1] + (kw - 1) * d[1] + 1 - w - begin[1])
    if min(begin + end) < 0:
        return None
    kept = np.ascontiguousarray(w_const[:, :, r0:r1, c0:c1])
    weights = np.frombuffer(kept.tobytes(), kept.dtype).reshape(kept.shape)  # immutable
    attrs = {**site.attrs, "kernel_shape": (kh, kw), "pads": begin + end, "auto_pad": "NOTSET"}
    kernel = functools.partial(fused_conv if "activation" in attrs else conv, **attrs)
    inner = _conv_site(CallSite((xshape, weights.shape, *site.shapes[2:]), site.dtypes,
                                (site.values[0], weights, *site.values[2:]), attrs,
                                site.out_shapes, kernel), act)
    if inner is None:
        return None
    generic = site.generic

    def trimmed_at(X, W, B=None, out=None):
        if W is not w_const or X.shape != xshape:
            return generic(X, W, B, out=out)
        return inner(X, weights, B, out=out)

    def direct(known, out):  # the inner call's, given the trimmed weights
        offer = getattr(inner, "direct", None)
        if offer is None or not constant(known[1], w_const):
            return None
        return offer((known[0], Constant(weights), *known[2:]), out)
    trimmed_at.direct = direct
    return trimmed_at


def _depthwise_site(plan, xshape, dtype, w_const, w_ready, w_prepared, b_const, b_ready,
                    has_bias, act, group, conv_at):
    """The planned call of a depthwise convolution with constant weights: the kernel and its
    scalar arguments chosen once, so a call checks its arrays and runs the kernel. Anything
    else (other weights or bias, a strided or other ``out``) goes to ``conv_at``. Through
    ``conv_at`` and :func:`_run` the set-up measured 1.3-2.4 us a call around a 2 us kernel
    (2x8x4x4, 3x3), and MobileNetV3-small has eleven of them."""
    path, yshape, s, pb, d, k, _ = plan
    if path in _SKIPS_PADDING and _immutable(w_ready) and not _all_finite(w_ready):
        return conv_at  # _run takes a kernel that reads the padding
    # writable weights on such a path are checked per call: an update may make one infinite
    checked = path in _SKIPS_PADDING and not _immutable(w_ready)
    from . import depthwise_lanes, depthwise_rows

    rows = depthwise_rows.kernel(plan, xshape, dtype, group) \
        if not _jit._parallel and _immutable(w_ready) else None
    if rows is not None:
        kernel = rows  # (multiplies the padding: any weights)
        args = (np.ascontiguousarray(w_ready), b_ready, has_bias, pb[0], pb[1], act)
    elif not _jit._parallel and not checked and _immutable(w_ready) and \
            depthwise_lanes.fits(plan, xshape, dtype, group):
        geometry = depthwise_lanes.Geometry(plan, xshape)
        kernel = depthwise_lanes.lanes
        args = (w_prepared if path == _DW_NHWC else _channels_last_weights(w_ready),
                geometry.taps, geometry.pix, geometry.into, geometry.hp, geometry.wq, b_ready,
                has_bias, act)
    elif path == _DW_NHWC:
        kernel = _depthwise_nhwc
        args = (w_prepared, k[0], k[1], s[0], s[1], pb[0], pb[1], d[0], d[1], b_ready,
                has_bias, act)
    elif path == _DW_FLAT:
        kernel = depthwise.flat_kernel(k[0], k[1], pb[1])
        args = (w_ready, yshape[1] // group, pb[0],
                depthwise.column_flags(yshape[2], yshape[3], k[1], pb[1]), b_ready, has_bias,
                act)
    else:
        kernel = _depthwise_table if path == _DW_TABLE else (
            depthwise.kernel(k[0], k[1]) if path == _DW_TAPS else _depthwise)
        args = (w_ready, yshape[1] // group, s[0], s[1], pb[0], pb[1], d[0], d[1], b_ready,
                has_bias, act)
    serial = getattr(kernel, "serial", kernel)  # (the lanes kernel is serial only)
    bound = [None]  # serial's machine code for these types (_jit.entry), from the first call

    def depthwise_at(X, W, B=None, out=None):
        if W is not w_const or (B is not b_const if has_bias else B is not None) or \
                X.shape != xshape or X.dtype != dtype or (out is not None and (
                    out.shape != yshape or out.dtype != dtype or not out.flags.carray)
                ) or (checked and not _all_finite(w_ready)):
            return conv_at(X, W, B, out=out)
        sync_threads()
        if not X.flags.c_contiguous:
            X = np.ascontiguousarray(X)
        y = np.empty(yshape, dtype) if out is None else out
        if _jit._parallel:
            kernel(X, *args, y)
        else:
            (bound[0] or _jit.bind(bound, serial, (X, *args, y)))(X, *args, y)
        return y

    def direct(known, out):  # the serial kernel, where the plan proves what the call checks
        sync_threads()
        if checked or _jit._parallel or not _proven(known, out, xshape, yshape, dtype,
                                                     w_const, b_const if has_bias else None):
            return None
        return _jit.direct(serial, (Input(0), *args, Output()), known, out)
    depthwise_at.direct = direct
    return depthwise_at


def _pointwise_site(plan, xshape, yshape, w_const, w_ready, b_const, has_bias, act, generic,
                    residual=None):
    """The planned call of a small float32 1x1 convolution with constant weights and bias
    (:mod:`.pointwise`): the kernel and its packed operands chosen once, so a call checks
    its arrays and runs the kernel's machine code. Anything else (other weights or bias, an
    input or ``out`` of another shape, dtype or layout) goes to the generic call. With
    ``residual`` (a residual FusedConv's generic call), the kernel's variant that adds Z."""
    from . import pointwise

    dtype = np.dtype(np.float32)
    bias = b_const if has_bias else None
    kernel = pointwise.kernel(plan, xshape, 1)
    if kernel is pointwise.channel_lanes:
        args = (*pointwise.packed_weights(w_ready, bias), act)
    else:
        args = (w_ready.reshape(-1), bias if has_bias else _NO_BIAS[dtype], has_bias, act)
    wide = (pointwise.wide(),)  # sixteen lanes (AVX-512) or eight, after the output
    bound = [None]  # the kernel's machine code for these types (_jit.entry), from the first call
    if residual is not None:
        return _pointwise_residual_site(pointwise.RESIDUAL[kernel], args, wide, xshape, yshape,
                                        w_const, b_const, has_bias, residual)

    def pointwise_at(X, W, B=None, out=None):
        if W is not w_const or (B is not b_const if has_bias else B is not None) or \
                X.shape != xshape or X.dtype != dtype or (out is not None and (
                    out.shape != yshape or out.dtype != dtype or not out.flags.carray)):
            return generic(X, W, B, out=out)
        if not X.flags.c_contiguous:
            X = np.ascontiguousarray(X)
        y = np.empty(yshape, dtype) if out is None else out
        (bound[0] or _jit.bind(bound, kernel, (X, *args, y, *wide)))(X, *args, y, *wide)
        return y

    def direct(known, out):  # the kernel, where the plan proves what the call checks
        if not _proven(known, out, xshape, yshape, dtype, w_const,
                       b_const if has_bias else None):
            return None
        return _jit.direct(kernel, (Input(0), *args, Output(), *wide), known, out)
    pointwise_at.direct = direct
    return pointwise_at


def _pointwise_residual_site(kernel, args, wide, xshape, yshape, w_const, b_const, has_bias,
                             generic):
    """:func:`_pointwise_site`'s call for a residual FusedConv(X, W, B, Z): ``kernel`` adds
    Z (C-contiguous float32 of the output's shape, else the generic call) before the
    activation, as it stores the output."""
    dtype = np.dtype(np.float32)
    bound = [None]  # the kernel's machine code for these types (_jit.entry), from the first call

    def pointwise_residual_at(X, W, B=None, Z=None, out=None):
        if W is not w_const or (B is not b_const if has_bias else B is not None) or \
                X.shape != xshape or X.dtype != dtype or Z is None or Z.shape != yshape or \
                Z.dtype != dtype or not Z.flags.c_contiguous or (out is not None and (
                    out.shape != yshape or out.dtype != dtype or not out.flags.carray)):
            return generic(X, W, B, Z, out=out)
        if not X.flags.c_contiguous:
            X = np.ascontiguousarray(X)
        y = np.empty(yshape, dtype) if out is None else out
        (bound[0] or _jit.bind(bound, kernel, (X, *args, Z, y, *wide)))(X, *args, Z, y, *wide)
        return y

    def direct(known, out):  # the kernel, where the plan proves what the call checks
        if len(known) < 4 or not planned(known[3], yshape, dtype) or not _proven(
                known, out, xshape, yshape, dtype, w_const, b_const if has_bias else None):
            return None
        return _jit.direct(kernel, (Input(0), *args, Input(3), Output(), *wide), known, out)
    pointwise_residual_at.direct = direct
    pointwise_residual_at.adds_residual = True
    return pointwise_residual_at


def _small_site(site, xshape, wshape, bshape, yshape, dtype, w_const, b_const, table):
    """The call of a small convolution (:func:`_small_conv`): its table made once, a call
    checks its inputs and runs the one kernel. A Conv1d's arrays go as they are (3-D): the
    kernel reads the shapes from the table."""
    has_bias = bshape is not None
    b_ready = b_const if b_const is not _UNSET else _NO_BIAS[dtype]
    generic = site.generic
    kernel = _small_conv
    bound, by_channels = [None], [None]  # the kernels' machine code (_jit.entry), bound at first
    w_cols = None
    if w_const is not _UNSET and _by_channels(table) and _immutable(w_const):
        w_cols = np.ascontiguousarray(w_const.reshape(wshape[0], -1).T).reshape(-1)
        w_cols.flags.writeable = False

    def conv_small_at(X, W, B=None, out=None):
        if X.shape != xshape or X.dtype != dtype or (B is None) == has_bias or (
                out is not None and (out.shape != yshape or out.dtype != dtype or
                                     not out.flags.carray)):
            # the kernel writes a C-contiguous output unchecked: any other out goes to the
            # generic call, which fills a strided one and refuses one of another shape
            return generic(X, W, B, out=out)
        if B is b_const or B is None:
            bias = b_ready
        elif B.shape != bshape or B.dtype != dtype:
            return generic(X, W, B, out=out)
        else:
            bias = np.ascontiguousarray(B)
        if W is not w_const:
            if W.shape != wshape or W.dtype != dtype:
                return generic(X, W, B, out=out)
            W = np.ascontiguousarray(W)
        if not X.flags.c_contiguous:
            X = np.ascontiguousarray(X)
        y = np.empty(yshape, dtype) if out is None else out
        if w_cols is not None and W is w_const:
            (by_channels[0] or _jit.bind(by_channels, _small_conv_by_channels,
                                         (X, w_cols, bias, table, y)))(X, w_cols, bias, table, y)
        elif W is w_const and bias is b_ready:  # the plan's own arrays: types fixed
            (bound[0] or _jit.bind(bound, kernel, (X, W, bias, table, y)))(X, W, bias, table, y)
        else:
            kernel(X, W, bias, table, y)
        return y

    def direct(known, out):  # the kernel, where the plan proves what the call checks
        if not _proven(known, out, xshape, yshape, dtype, w_const,
                       b_const if has_bias else None):
            return None
        if w_cols is not None:
            return _jit.direct(_small_conv_by_channels, (Input(0), w_cols, b_ready, table,
                                                         Output()), known, out)
        return _jit.direct(kernel, (Input(0), w_const, b_ready, table, Output()), known, out)
    conv_small_at.direct = direct
    return conv_small_at


def _by_channels(table) -> bool:
    """Whether a narrow small convolution runs faster along its output channels
    (:func:`_small_conv_by_channels`): ungrouped, at least _BY_CHANNELS_MIN outputs, and at
    most twice as many weights per output as outputs (a deep reduction to few channels keeps
    the dot products)."""
    rows = table[_T_C] * table[_T_KH] * table[_T_KW]
    return bool(table[_T_NARROW]) and table[_T_GROUP] == 1 and \
        table[_T_M] >= _BY_CHANNELS_MIN and rows <= 2 * table[_T_M]


def _grad_setup(X, W, dY, auto_pad, dilations, group, kernel_shape, pads, strides):
    sync_threads()
    X = np.ascontiguousarray(X)
    W = np.ascontiguousarray(W, dtype=X.dtype)
    dY = np.ascontiguousarray(dY, dtype=X.dtype)
    path, shape, s, pb, d, k, chunk = _plan_of(X, W, kernel_shape, strides, pads, dilations,
                                               auto_pad, group)
    return X, W, dY, path, shape, s, pb, d, k, chunk


def _depthwise_grad(X, group, oh, ow, k):
    """Depthwise gradients run on the tap table (its int32 offsets bounded in size) instead of
    columns and a GEMM per channel."""
    return group > 1 and X.shape[1] == group and oh * ow * k[0] * k[1] <= _TAPS_MAX


def _dy_columns(dY, start, n_img, m, length):
    """dY of images [start, start + n_img) as (M, n_img * L), the layout of the columns."""
    part = dY[start:start + n_img].reshape(n_img, m, length)
    if n_img == 1:
        return part.reshape(m, length)
    return np.ascontiguousarray(part.transpose(1, 0, 2)).reshape(m, n_img * length)


def conv_weight_grad(X, W, dY, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                     pads=None, strides=None):
    """Gradient of Conv with respect to W: dY against the columns of a chunk of images side
    by side, one GEMM per chunk (the sum over the images happens inside it)."""
    X, W, dY, path, (n, m, oh, ow), s, pb, d, k, chunk = _grad_setup(
        X, W, dY, auto_pad, dilations, group, kernel_shape, pads, strides)
    # large stride-1 planes: the columns' GEMM measured as fast or faster for dW
    if _depthwise_grad(X, group, oh, ow, k) and (oh * ow <= 256 or s != (1, 1)):
        dw = np.empty(W.shape, X.dtype)
        pick(_depthwise_weight_grad)(X, dY, m // group, s[0], s[1], pb[0], pb[1], d[0], d[1], dw)
        return dw
    length = oh * ow
    rows = X.shape[1] * k[0] * k[1]
    mg = m // group
    dw = np.zeros((group, mg, rows // group), X.dtype)
    cols_all = np.empty(rows * chunk * length, X.dtype)
    if path == _BY_IMAGE:  # long rows: one GEMM per image, no transposed copy of dY
        dy4 = dY.reshape(n, group, mg, length)
        for start in range(0, n, chunk):
            n_img = min(chunk, n - start)
            cols = cols_all[:rows * n_img * length].reshape(n_img, rows, length)
            pick(_columns(k, s, ow))(X[start:start + n_img], k[0], k[1], s[0], s[1], pb[0], pb[1], d[0],
                           d[1], oh, ow, cols, True)
            dw += np.matmul(dy4[start:start + n_img], cols.reshape(
                n_img, group, rows // group, length).transpose(0, 1, 3, 2)).sum(axis=0)
        return dw.reshape(W.shape)
    for start in range(0, n, chunk):
        n_img = min(chunk, n - start)
        width = n_img * length
        cols = cols_all[:rows * width].reshape(rows, n_img, length)
        pick(_columns(k, s, ow))(X[start:start + n_img], k[0], k[1], s[0], s[1], pb[0], pb[1], d[0], d[1],
                       oh, ow, cols, False)
        dyt = _dy_columns(dY, start, n_img, m, length)
        dw += np.matmul(dyt.reshape(group, mg, width),
                        cols.reshape(group, rows // group, width).transpose(0, 2, 1))
    return dw.reshape(W.shape)


def conv_transpose(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1,
                   kernel_shape=None, output_padding=None, output_shape=None, pads=None,
                   strides=None):
    """2-D ConvTranspose: the input gradient of the convolution it transposes. W^T times each
    image's pixels by BLAS into columns, then :func:`_col2im` scatters them straight into the
    cropped output (the pads are that convolution's), bias added after. The reference scatters
    with numpy, one strided add per tap (2x16x16x16, 4x4 stride 2: 176 against onnxruntime's
    50 us). Pads that grow the output (an ``output_shape`` beyond the kernels' reach) go to
    the reference."""
    attrs = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
                 output_padding=output_padding, output_shape=output_shape, pads=pads,
                 strides=strides)
    k = tuple(kernel_shape) if kernel_shape else tuple(W.shape[2:])
    if X.ndim != 4 or W.ndim != 4 or len(k) != 2 or tuple(W.shape[2:]) != k or group < 1 or \
            X.shape[1] != W.shape[0] or X.shape[1] % group:
        return _reference_conv_transpose(X, W, B, attrs)
    s, pb, pe, d, _, _, (oh, ow) = _convt_geometry(X.shape[2:], k, strides, pads, dilations,
                                                   output_padding, output_shape, auto_pad)
    if min(pb + pe) < 0 or oh <= 0 or ow <= 0 or X.size == 0 or min(s + d) < 1 or \
            (output_padding is not None and min(output_padding) < 0):
        return _reference_conv_transpose(X, W, B, attrs)
    sync_threads()
    n, cin, h, w = X.shape
    mg = W.shape[1]
    m = group * mg
    kk = k[0] * k[1]
    x = np.ascontiguousarray(X).reshape(n, group, cin // group, h * w)
    wt = np.ascontiguousarray(W).reshape(group, cin // group, mg * kk).transpose(0, 2, 1)
    cols = np.matmul(wt, x)  # (n, group, mg*kh*kw, h*w): rows (channel, i, j), by image
    y = np.empty((n, m, oh, ow), X.dtype)
    pick(_col2im)(cols.reshape(n, m * kk, h * w), k[0], k[1], s[0], s[1], pb[0], pb[1], d[0],
                  d[1], h, w, y, True)
    if B is not None:
        y += np.asarray(B, X.dtype).reshape(1, m, 1, 1)
    return y


def _reference_conv_transpose(X, W, B, attrs):
    from onemodel.tensors.ops import OPS

    return OPS["ConvTranspose"].kernel(X, W, B, **attrs)


def conv_input_grad(X, W, dY, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                    pads=None, strides=None):
    """Gradient of Conv with respect to X: W^T against dY of a chunk of images side by side
    (one GEMM per chunk) into columns, scattered back by numba (the adjoint of the columns)."""
    X, W, dY, path, (n, m, oh, ow), s, pb, d, k, chunk = _grad_setup(
        X, W, dY, auto_pad, dilations, group, kernel_shape, pads, strides)
    if _depthwise_grad(X, group, oh, ow, k):
        dx = np.empty(X.shape, X.dtype)
        pick(_depthwise_input_grad)(dY, W, m // group, s[0], s[1], pb[0], pb[1], d[0], d[1], dx)
        return dx
    length = oh * ow
    rows = X.shape[1] * k[0] * k[1]
    mg = m // group
    wt = W.reshape(group, mg, rows // group).transpose(0, 2, 1)
    dx = np.empty(X.shape, X.dtype)
    dcols_all = np.empty(rows * chunk * length, X.dtype)
    if path == _BY_IMAGE:  # long rows: one GEMM per image, no transposed copy of dY
        dy4 = dY.reshape(n, group, mg, length)
        for start in range(0, n, chunk):
            n_img = min(chunk, n - start)
            dcols = dcols_all[:rows * n_img * length].reshape(n_img, group, rows // group,
                                                               length)
            np.matmul(wt, dy4[start:start + n_img], out=dcols)
            pick(_col2im)(dcols.reshape(n_img, rows, length), k[0], k[1], s[0], s[1], pb[0],
                           pb[1], d[0], d[1], oh, ow, dx[start:start + n_img], True)
        return dx
    for start in range(0, n, chunk):
        n_img = min(chunk, n - start)
        width = n_img * length
        dcols = dcols_all[:rows * width].reshape(group, rows // group, width)
        np.matmul(wt, _dy_columns(dY, start, n_img, m, length).reshape(group, mg, width),
                  out=dcols)
        pick(_col2im)(dcols.reshape(rows, n_img, length), k[0], k[1], s[0], s[1], pb[0], pb[1],
                       d[0], d[1], oh, ow, dx[start:start + n_img], False)
    return dx
