"""MaxPool of float32 planes with eight channels in the lanes of a vector (:mod:`._simd`).

The NCHW kernels (``pool._max_pool_fixed``) reduce each window's rows in one sweep, then take
each output's taps from that row at the window's stride: strided reads, one output per lane
of work. Here, as onnxruntime's NCHWc pooling does, each block of eight channels is copied
into a (rows, columns, 8) plane bordered with -inf by 8x8 transposes (the depthwise lanes'
copy, :mod:`.depthwise_lanes`), every output pixel is the running maximum of its taps' vectors,
eight pixels at a time in eight registers, and the results go back to NCHW by the same
transposes. The border stands for the padding and for ``ceil_mode``'s last windows, which the
maximum ignores as the NCHW kernels do. NaN wins and stays (np.maximum), so the outputs equal
the NCHW kernels'.

Taken on one thread for float32 with a multiple of eight channels, when the CPU has AVX2 and
FMA (``_simd.host_has_fma``), for the shapes :func:`fits` admits; measured in
docs/benchmarks.md, "Twenty-first round"."""

from __future__ import annotations

import numpy as np

from ._jit import jit
from ._simd import host_has_fma, load8, max8, store8
from .conv import U
from .depthwise_lanes import Geometry, copy_in, copy_out, store_eight

MAX_PLANE_BYTES = 1 << 20  # one block's bordered plane (eight channels)
# pixels of an input plane: past 16x16 the copies into and out of the lanes cost more than the
# strided reads they save (see fits)
MAX_INPUT_PIXELS = 256


def geometry(shape, out_hw, strides, pads, dilations, kernel_shape) -> Geometry | None:
    """The bordered plane's geometry of a MaxPool of ``shape`` (N, C, H, W) when this kernel
    takes it (:func:`fits`), else None; ``pads`` the begin pads (top, left)."""
    c = shape[1]
    oh, ow = out_hw
    plan = (None, (shape[0], c, oh, ow), strides, pads, dilations, kernel_shape, None)
    if not fits(plan, shape):
        return None
    return Geometry(plan, shape)


def fits(plan, xshape) -> bool:
    """Whether a float32 MaxPool with this geometry (a convolution's plan tuple: output,
    strides, begin pads, dilations, window) goes by lanes (the caller checks the dtype and the
    thread mode): a multiple of eight channels, input planes of at most 16x16 with eight
    output pixels or more. Paired with the NCHW kernel (one thread): SqueezeNet's 3x3/2 pools
    over 15x15 and 7x7 planes 0.59x and 0.63x, 13x13 0.62x, a 3x3/1 over 8x8 0.72x, a 2x2/2
    over 16x16 0.96x; over 31x31 and 32x32 planes 1.04-1.09x, 56x56 to 112x112 1.5-2.1x (the
    copies into and out of the lanes outweigh the strided reads they save)."""
    _path, (_n, _m, oh, ow), s, pb, d, k, _chunk = plan
    if xshape[1] % 8 or min(pb) < 0 or not host_has_fma():
        return False
    hp = max(xshape[2] + pb[0], (oh - 1) * s[0] + (k[0] - 1) * d[0] + 1)
    wq = max(xshape[3] + pb[1], (ow - 1) * s[1] + (k[1] - 1) * d[1] + 1)
    return oh * ow >= 8 and xshape[2] * xshape[3] <= MAX_INPUT_PIXELS and \
        hp * wq * 32 <= MAX_PLANE_BYTES


@jit()
def max_lanes(x, taps, pix, into, hp, wq, out):
    """out[n, c] = the maximum of x[n, c] over each window, with ``taps``, ``pix``, ``into``
    the offsets of :class:`~.depthwise_lanes.Geometry`."""
    n_img, c = x.shape[0], x.shape[1]
    length = pix.shape[0]
    ntaps = taps.shape[0]
    hw = into.shape[0]
    xf = x.reshape(x.size)
    of = out.reshape(out.size)
    plane = np.full(hp * wq * 8, -np.inf, np.float32)  # the border stays -inf for every block
    res = np.empty(length * 8, np.float32)
    pixels = np.empty(64, np.float32)
    first = taps[U(0)]
    for img in range(n_img):
        for c0 in range(0, c, 8):
            copy_in(xf, (img * c + c0) * hw, hw, into, plane, pixels)
            p = 0
            while p + 8 <= length:
                p0, p1, p2, p3 = pix[U(p)], pix[U(p + 1)], pix[U(p + 2)], pix[U(p + 3)]
                p4, p5, p6, p7 = pix[U(p + 4)], pix[U(p + 5)], pix[U(p + 6)], pix[U(p + 7)]
                a0 = load8(plane, U(p0 + first))
                a1 = load8(plane, U(p1 + first))
                a2 = load8(plane, U(p2 + first))
                a3 = load8(plane, U(p3 + first))
                a4 = load8(plane, U(p4 + first))
                a5 = load8(plane, U(p5 + first))
                a6 = load8(plane, U(p6 + first))
                a7 = load8(plane, U(p7 + first))
                for t in range(1, ntaps):
                    o = taps[U(t)]
                    a0 = max8(a0, load8(plane, U(p0 + o)))
                    a1 = max8(a1, load8(plane, U(p1 + o)))
                    a2 = max8(a2, load8(plane, U(p2 + o)))
                    a3 = max8(a3, load8(plane, U(p3 + o)))
                    a4 = max8(a4, load8(plane, U(p4 + o)))
                    a5 = max8(a5, load8(plane, U(p5 + o)))
                    a6 = max8(a6, load8(plane, U(p6 + o)))
                    a7 = max8(a7, load8(plane, U(p7 + o)))
                store_eight(res, p * 8, a0, a1, a2, a3, a4, a5, a6, a7)
                p += 8
            while p < length:  # the last pixels, one at a time
                p0 = pix[U(p)]
                a0 = load8(plane, U(p0 + first))
                for t in range(1, ntaps):
                    a0 = max8(a0, load8(plane, U(p0 + taps[U(t)])))
                store8(res, U(p * 8), a0)
                p += 1
            copy_out(res, of, (img * c + c0) * length, length)
