"""Convolution (2-D, float32/float64): columns built by numba straight from the NCHW input
(padding and dilation on the fly, no transposes), one BLAS GEMM per image (per group) writing
the NCHW output in place, then bias and activation in one pass. 1x1 stride-1 convolutions skip
the columns: the input already is the GEMM operand. Depthwise convolutions, where a GEMM has
nothing to chew on, are a direct numba loop."""

from __future__ import annotations

import numpy as np

from numba import prange
from onemodel.tensors.ops.nn import _geometry

from ._jit import jit, sync_threads

U = np.uint64
ACT_CODES = {"": 0, "Relu": 1, "Sigmoid": 2, "Tanh": 3}
_COLS_BUDGET = 32 << 20  # bytes of im2col columns built at once
_NO_BIAS = {np.dtype(t): np.empty(0, t) for t in (np.float32, np.float64)}


@jit(parallel=True)
def _im2col(x, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow, cols):
    """cols[n, (c, i, j), (y, x)] = x[n, c, y*sh - ph + i*dh, x*sw - pw + j*dw] (0 outside),
    for a batch of images at once."""
    n_img, c_in, h, w = x.shape
    kk = kh * kw
    rows = c_in * kk
    for t in prange(n_img * rows):
        n = t // rows
        r = t % rows
        c = r // kk
        i = (r % kk) // kw
        j = r % kw
        off = j * dw - pw
        # output columns whose input column lies inside the image: [lo, hi)
        lo = 0
        while lo < ow and lo * sw + off < 0:
            lo += 1
        hi = ow
        while hi > lo and (hi - 1) * sw + off >= w:
            hi -= 1
        # one view per row and plane, none in the loops (a view costs a reference count);
        # unsigned indices skip numba's negative-index wraparound, so the copies vectorize
        row = cols[n, r]
        plane = x[n, c]
        for y in range(oh):
            iy = y * sh - ph + i * dh
            base = y * ow
            if iy < 0 or iy >= h or lo >= hi:
                for q in range(ow):
                    row[U(base + q)] = 0
                continue
            for q in range(lo):
                row[U(base + q)] = 0
            for q in range(hi, ow):
                row[U(base + q)] = 0
            src = plane[iy]
            start = lo * sw + off
            for q in range(hi - lo):
                row[U(base + lo + q)] = src[U(start + q * sw)]


@jit(parallel=True)
def _col2im(dcols, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow, dx):
    """The adjoint of :func:`_im2col`: dx[n, c, ...] += every column entry that read it. One
    (image, channel) plane per task, so no two tasks write the same element."""
    n_img, c_in, h, w = dx.shape
    kk = kh * kw
    for t in prange(n_img * c_in):
        n = t // c_in
        c = t % c_in
        plane = dx[n, c]
        for a in range(h):
            for b in range(w):
                plane[U(a), U(b)] = 0
        for i in range(kh):
            for j in range(kw):
                row = dcols[n, c * kk + i * kw + j]
                off = j * dw - pw
                lo = 0
                while lo < ow and lo * sw + off < 0:
                    lo += 1
                hi = ow
                while hi > lo and (hi - 1) * sw + off >= w:
                    hi -= 1
                for y in range(oh):
                    iy = y * sh - ph + i * dh
                    if iy < 0 or iy >= h:
                        continue
                    base = y * ow
                    for q in range(lo, hi):
                        plane[U(iy), U(q * sw + off)] += row[U(base + q)]


@jit()
def _activate(v, act):
    """act: 0 none, 1 Relu, 2 Sigmoid (the stable form), 3 Tanh."""
    if act == 1:
        return v if v > 0 else 0
    if act == 2:
        if v >= 0:
            return 1 / (1 + np.exp(-v))
        e = np.exp(v)
        return e / (1 + e)
    if act == 3:
        return np.tanh(v)
    return v


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
    h, w = x.shape[2], x.shape[3]
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
    for blk in prange((total + block - 1) // block):
        buf = np.zeros((1, 1) if strided else (hp, wp), x.dtype)
        flat = buf.reshape(buf.size)
        phases = np.zeros((sh * sw, hq, wq) if strided else (1, 1, 1), x.dtype)
        acc = np.empty(plane, x.dtype)
        for t in range(blk * block, min(total, (blk + 1) * block)):
            n = t // m_out
            m = t % m_out
            bv = bias[m] if has_bias else 0
            dst = out[n, m]
            acc[:] = 0
            if strided:
                # the channel straight into its phases: padded row iy + ph is phase row
                # (iy + ph) % sh, row (iy + ph) // sh; columns likewise. Padding positions
                # are never written, so they keep the zeros of the block's first channel.
                xc = x[n, m // mult]
                for r in range(sh):
                    iy0 = (r - ph) % sh
                    for c in range(sw):
                        pplane = phases[r * sw + c]
                        ix0 = (c - pw) % sw
                        xx0 = (ix0 + pw) // sw
                        cnt = min((w - ix0 + sw - 1) // sw, wq - xx0)
                        for iy in range(iy0, h, sh):
                            yy = (iy + ph) // sh
                            if yy >= hq:
                                break
                            prow = pplane[yy]
                            xrow = xc[iy]
                            for k in range(cnt):
                                prow[xx0 + k] = xrow[ix0 + k * sw]
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
                        drow[xo] = _activate(src[xo] + bv, act)


@jit(parallel=True)
def _epilogue(y, bias, has_bias, act):
    """y[n, m, :] = act(y + bias[m]) in place; act: 0 none, 1 Relu, 2 Sigmoid, 3 Tanh."""
    n_img, m_out, length = y.shape
    for t in prange(n_img * m_out):
        n = t // m_out
        m = t % m_out
        b = bias[m] if has_bias else 0
        row = y[n, m]
        for k in range(length):
            v = row[k] + b
            if act == 1:
                v = v if v > 0 else 0
            elif act == 2:
                if v >= 0:
                    v = 1 / (1 + np.exp(-v))
                else:
                    e = np.exp(v)
                    v = e / (1 + e)
            elif act == 3:
                v = np.tanh(v)
            row[k] = v


def conv(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
         pads=None, strides=None):
    """ONNX Conv for 2-D float inputs (see :func:`onemodel.numba.support.conv`)."""
    return _conv(X, W, B, "", auto_pad, dilations, group, kernel_shape, pads, strides)


def fused_conv(X, W, B=None, *, activation="Relu", auto_pad="NOTSET", dilations=None, group=1,
               kernel_shape=None, pads=None, strides=None):
    """Conv followed by Relu, Sigmoid or Tanh, applied in the same pass as the bias."""
    return _conv(X, W, B, activation, auto_pad, dilations, group, kernel_shape, pads, strides)


def _conv(X, W, B, activation, auto_pad, dilations, group, kernel_shape, pads, strides):
    sync_threads()
    X = np.ascontiguousarray(X)
    W = np.ascontiguousarray(W, dtype=X.dtype)
    k = tuple(kernel_shape) if kernel_shape else W.shape[2:]
    s, pb, _, d, out_sp, _ = _geometry(X.shape[2:], k, strides, pads, dilations, auto_pad)
    n, c = X.shape[:2]
    m = W.shape[0]
    oh, ow = out_sp
    length = oh * ow
    y = np.empty((n, m, oh, ow), X.dtype)
    cg = c // group
    act = ACT_CODES[activation]
    bias = np.ascontiguousarray(B, dtype=X.dtype) if B is not None else _NO_BIAS[X.dtype]
    if group > 1 and cg == 1:  # bias and activation applied in the same pass
        _depthwise(X, W, m // group, s[0], s[1], pb[0], pb[1], d[0], d[1], bias, B is not None,
                   act, y)
        return y
    else:
        mg = m // group
        w3 = W.reshape(group, mg, -1)
        y3 = y.reshape(n, group, mg, length)
        direct = k == (1, 1) and s == (1, 1) and pb == (0, 0) and (oh, ow) == X.shape[2:]
        if direct:  # the input already is the GEMM operand: one batched GEMM
            np.matmul(w3, X.reshape(n, group, cg, length), out=y3)
        else:
            # columns for a few images at a time (bounded memory), then one batched GEMM
            per_image = c * k[0] * k[1] * length
            step = max(1, min(n, _COLS_BUDGET // max(per_image * X.itemsize, 1)))
            cols = np.empty((step, c * k[0] * k[1], length), X.dtype)
            for start in range(0, n, step):
                m_img = min(step, n - start)
                part = cols[:m_img]
                _im2col(X[start:start + m_img], k[0], k[1], s[0], s[1], pb[0], pb[1], d[0],
                        d[1], oh, ow, part)
                np.matmul(w3, part.reshape(m_img, group, cg * k[0] * k[1], length),
                          out=y3[start:start + m_img])
    if B is not None or act:
        _epilogue(y.reshape(n, m, length), bias, B is not None, act)
    return y


def _grad_setup(X, W, dY, auto_pad, dilations, group, kernel_shape, pads, strides):
    sync_threads()
    X = np.ascontiguousarray(X)
    W = np.ascontiguousarray(W, dtype=X.dtype)
    dY = np.ascontiguousarray(dY, dtype=X.dtype)
    k = tuple(kernel_shape) if kernel_shape else W.shape[2:]
    s, pb, _, d, out_sp, _ = _geometry(X.shape[2:], k, strides, pads, dilations, auto_pad)
    n, c = X.shape[:2]
    m = W.shape[0]
    ckk = (c // group) * k[0] * k[1]
    step = max(1, min(n, _COLS_BUDGET // max(c * k[0] * k[1] * out_sp[0] * out_sp[1]
                                             * X.itemsize, 1)))
    return X, W, dY, k, s, pb, d, out_sp, n, c, m, ckk, step


def conv_weight_grad(X, W, dY, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                     pads=None, strides=None):
    """Gradient of Conv with respect to W: the columns of a few images at a time against dY,
    one batched GEMM per chunk, summed over the images."""
    X, W, dY, k, s, pb, d, (oh, ow), n, c, m, ckk, step = _grad_setup(
        X, W, dY, auto_pad, dilations, group, kernel_shape, pads, strides)
    length = oh * ow
    dw = np.zeros((group, m // group, ckk), np.float64 if X.dtype == np.float64 else X.dtype)
    cols = np.empty((step, c * k[0] * k[1], length), X.dtype)
    dy4 = dY.reshape(n, group, m // group, length)
    for start in range(0, n, step):
        m_img = min(step, n - start)
        part = cols[:m_img]
        _im2col(X[start:start + m_img], k[0], k[1], s[0], s[1], pb[0], pb[1], d[0], d[1], oh,
                ow, part)
        cols4 = part.reshape(m_img, group, ckk, length)
        dw += np.matmul(dy4[start:start + m_img], cols4.transpose(0, 1, 3, 2)).sum(axis=0)
    return dw.reshape(W.shape).astype(X.dtype, copy=False)


def conv_input_grad(X, W, dY, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                    pads=None, strides=None):
    """Gradient of Conv with respect to X: W^T against dY per image (one batched GEMM per
    chunk) into columns, scattered back by numba (the adjoint of the columns)."""
    X, W, dY, k, s, pb, d, (oh, ow), n, c, m, ckk, step = _grad_setup(
        X, W, dY, auto_pad, dilations, group, kernel_shape, pads, strides)
    length = oh * ow
    wt = W.reshape(group, m // group, ckk).transpose(0, 2, 1)
    dy4 = dY.reshape(n, group, m // group, length)
    dx = np.empty(X.shape, X.dtype)
    dcols = np.empty((step, group, ckk, length), X.dtype)
    for start in range(0, n, step):
        m_img = min(step, n - start)
        part = dcols[:m_img]
        np.matmul(wt, dy4[start:start + m_img], out=part)
        _col2im(part.reshape(m_img, c * k[0] * k[1], length), k[0], k[1], s[0], s[1], pb[0],
                pb[1], d[0], d[1], oh, ow, dx[start:start + m_img])
    return dx
