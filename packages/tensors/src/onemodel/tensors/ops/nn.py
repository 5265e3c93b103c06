"""Neural-network ops: convolution, pooling, normalization and softmax, with the internal ops
(domain ``onemodel``) that their gradients use."""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..dtype import FLOATING, NUMERIC, DType
from ..errors import ShapeError
from ..symbolic import add, floordiv, format_shape, mul
from ._grad import call
from .adapters import ImportNode, onnx_adapter
from .base import TensorSpec, const_ints, defop, norm_axis, same_dtype

# window geometry shared by convolution and pooling -----------------------------------------------


def _geometry(in_sp, k, strides, pads, dilations, auto_pad="NOTSET", ceil_mode=0):
    """(strides, begin pads, end pads, dilations, output sizes) for integer spatial sizes.

    The end pads include the extra room that ``ceil_mode`` needs for the last window."""
    nd = len(k)
    s = tuple(strides) if strides else (1,) * nd
    d = tuple(dilations) if dilations else (1,) * nd
    p = tuple(pads) if pads else (0,) * (2 * nd)
    if min(p, default=0) < 0:  # kernels index the padded input: a negative pad reads outside it
        raise ShapeError(f"pads must be non-negative, got {list(p)}")
    pb, pe = list(p[:nd]), list(p[nd:])
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        for i in range(nd):
            out = -(-in_sp[i] // s[i])
            total = max((out - 1) * s[i] + (k[i] - 1) * d[i] + 1 - in_sp[i], 0)
            small = total // 2
            pb[i], pe[i] = (small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small)
    elif auto_pad == "VALID":
        pb, pe = [0] * nd, [0] * nd
    out_sp, extra = [], []
    for i in range(nd):
        ext = (k[i] - 1) * d[i] + 1
        span = in_sp[i] + pb[i] + pe[i] - ext
        if span < 0:
            raise ShapeError(
                f"kernel extent {ext} is larger than the padded input {in_sp[i] + pb[i] + pe[i]}"
            )
        o = (-(-span // s[i]) if ceil_mode else span // s[i]) + 1
        if ceil_mode and (o - 1) * s[i] >= in_sp[i] + pb[i]:
            o -= 1  # the last window must start inside the input or the left padding
        out_sp.append(o)
        extra.append(max((o - 1) * s[i] + ext - (in_sp[i] + pb[i] + pe[i]), 0))
    return s, tuple(pb), tuple(pe), d, tuple(out_sp), tuple(extra)


def _windows(xp, k, s, d, out_sp):
    """View of ``xp`` (N, C, *padded) as (N, C, *out, *k) windows; no copy."""
    nd = len(k)
    ext = tuple((kk - 1) * dd + 1 for kk, dd in zip(k, d))
    v = sliding_window_view(xp, ext, axis=tuple(range(2, 2 + nd)))
    index = (slice(None), slice(None))
    index += tuple(slice(0, (o - 1) * ss + 1, ss) for o, ss in zip(out_sp, s))
    index += tuple(slice(None, None, dd) for dd in d)
    return v[index]


def _pad_spatial(x, pb, pe, value=0.0):
    if not any(pb) and not any(pe):
        return x
    widths = [(0, 0), (0, 0)] + list(zip(pb, pe))
    return np.pad(x, widths, mode="constant", constant_values=value)


def _col2im(cols, padded_shape, k, s, d, out_sp):
    """Adjoint of :func:`_windows`: add (N, C, *k, *out) columns back into a padded buffer."""
    out = np.zeros(padded_shape, cols.dtype)
    for kidx in np.ndindex(*k):
        index = (slice(None), slice(None)) + tuple(
            slice(ki * di, ki * di + (o - 1) * si + 1, si)
            for ki, di, o, si in zip(kidx, d, out_sp, s)
        )
        out[index] += cols[(slice(None), slice(None)) + kidx]
    return out


def _crop(xp, pb, pe):
    index = (slice(None), slice(None)) + tuple(
        slice(b, xp.shape[2 + i] - e) for i, (b, e) in enumerate(zip(pb, pe))
    )
    return xp[index]


def _positions(k, s, d, out_sp):
    """For each kernel position, the slices of a padded spatial grid that it reads."""
    for kidx in np.ndindex(*k):
        yield kidx, tuple(slice(ki * di, ki * di + (o - 1) * si + 1, si)
                          for ki, di, o, si in zip(kidx, d, out_sp, s))


def _channels_last(X, pb, pe):
    """(N, C, *sp) -> padded, contiguous (N, *padded sp, C)."""
    xl = np.moveaxis(X, 1, -1)
    if any(pb) or any(pe):
        return np.pad(xl, [(0, 0), *zip(pb, pe), (0, 0)])
    return np.ascontiguousarray(xl)


def _im2col_last(xp, k, s, d, out_sp):
    """Columns (N * L, K * C) of a channels-last padded input: one row per output position."""
    n, c = xp.shape[0], xp.shape[-1]
    nd = len(k)
    cols = np.empty((n, *out_sp, *k, c), xp.dtype)
    lead = (slice(None),) * (1 + nd)
    for kidx, sl in _positions(k, s, d, out_sp):
        cols[lead + kidx] = xp[(slice(None), *sl)]
    return cols.reshape(n * math.prod(out_sp), math.prod(k) * c)  # no -1: n may be 0


def _col2im_last(dcols, padded_shape, k, s, d, out_sp):
    """Adjoint of :func:`_im2col_last`: (N, *out, *k, C) columns into a channels-last buffer."""
    out = np.zeros(padded_shape, dcols.dtype)
    lead = (slice(None),) * (1 + len(k))
    for kidx, sl in _positions(k, s, d, out_sp):
        out[(slice(None), *sl)] += dcols[lead + kidx]
    return out


def _weight_matrix(W):
    """(M, C, *k) -> (M, K * C), matching the column order of :func:`_im2col_last`."""
    return np.moveaxis(W, 1, -1).reshape(W.shape[0], math.prod(W.shape[1:]))


# convolution -------------------------------------------------------------------------------

def _im2col(X, k, s, pb, pe, d, out_sp, group):
    """Columns (N, G, Cg*K, L) of the padded input."""
    n, c = X.shape[:2]
    nd = len(k)
    xp = _pad_spatial(X, pb, pe)
    win = _windows(xp, k, s, d, out_sp).reshape(n, group, c // group, *out_sp, *k)
    perm = (0, 1, 2, *range(3 + nd, 3 + 2 * nd), *range(3, 3 + nd))
    cols = np.ascontiguousarray(win.transpose(perm))
    return cols.reshape(n, group, (c // group) * math.prod(k), math.prod(out_sp)), xp.shape


def _conv_attrs_shape(x_shape, w_shape, auto_pad, dilations, kernel_shape, pads, strides,
                      what="Conv"):
    nd = len(x_shape) - 2
    if nd < 1 or len(w_shape) != nd + 2:
        raise ShapeError(f"{what} needs X of rank >= 3 and W of the same rank")
    k = tuple(kernel_shape) if kernel_shape else tuple(w_shape[2:])
    return nd, k


def _conv_shape(specs, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                pads=None, strides=None):
    x, w = specs[0], specs[1]
    dt = same_dtype(specs, FLOATING)
    nd, k = _conv_attrs_shape(x.shape, w.shape, auto_pad, dilations, kernel_shape, pads, strides)
    if isinstance(x.shape[1], int) and isinstance(w.shape[1], int) and x.shape[1] != w.shape[1] * group:
        raise ShapeError(
            f"input has {x.shape[1]} channels but W expects {w.shape[1]} x group {group}"
        )
    if isinstance(w.shape[0], int) and (group < 1 or w.shape[0] % group):
        raise ShapeError(f"W has {w.shape[0]} output channels, which group {group} cannot "
                         "split equally; it must be a multiple of the group")
    b = specs[2] if len(specs) > 2 else None
    if b is not None and (len(b.shape) != 1 or (isinstance(b.shape[0], int)
                                                and isinstance(w.shape[0], int)
                                                and b.shape[0] != w.shape[0])):
        raise ShapeError(f"B has shape {format_shape(b.shape)}; it must be [{w.shape[0]}], one "
                         "bias per output channel")
    out = []
    s = strides or (1,) * nd
    d = dilations or (1,) * nd
    p = pads or (0,) * (2 * nd)
    for i in range(nd):
        dim = x.shape[2 + i]
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out.append(floordiv(add(dim, s[i] - 1), s[i]))
            continue
        if isinstance(dim, int):  # a window wider than the padded input is an error, not 0
            out.append(_geometry((dim,), (k[i],), (s[i],), (p[i], p[i + nd]), (d[i],),
                                 auto_pad)[4][0])
            continue
        pad = 0 if auto_pad == "VALID" else p[i] + p[i + nd]
        ext = (k[i] - 1) * d[i] + 1
        out.append(add(floordiv(add(dim, pad - ext), s[i]), 1))
    return TensorSpec((x.shape[0], w.shape[0], *out), dt)


def _conv_grad(ctx, g):
    x, w = ctx.inputs[0], ctx.inputs[1]
    b = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    gx = call("ConvInputGrad", x, w, g, **ctx.attrs) if x.requires_grad else None
    gw = call("ConvWeightGrad", x, w, g, **ctx.attrs) if w.requires_grad else None
    gb = None
    if b is not None and b.requires_grad:
        gb = g.sum(axis=(0, *range(2, g.ndim)))
    return gx, gw, gb


@defop("Conv", shape=_conv_shape, grad=_conv_grad)
def conv(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
         pads=None, strides=None):
    nd = X.ndim - 2
    k = tuple(kernel_shape) if kernel_shape else W.shape[2:]
    s, pb, pe, d, out_sp, _ = _geometry(X.shape[2:], k, strides, pads, dilations, auto_pad)
    n, m = X.shape[0], W.shape[0]
    if group == 1:  # one GEMM over channels-last columns
        cols = _im2col_last(_channels_last(X, pb, pe), k, s, d, out_sp)
        y = cols @ _weight_matrix(W).T
        if B is not None:
            y += B
        return np.ascontiguousarray(np.moveaxis(y.reshape(n, *out_sp, m), -1, 1))
    cols, _ = _im2col(X, k, s, pb, pe, d, out_sp, group)
    w = W.reshape(group, m // group, math.prod(W.shape[1:]))
    y = np.matmul(w, cols).reshape(n, m, *out_sp)
    if B is not None:
        y += B.reshape((1, m) + (1,) * nd)
    return y


def _same_as(index):
    def rule(specs, **attrs):
        return TensorSpec(specs[index].shape, specs[index].dtype)

    return rule


@defop("ConvInputGrad", traceable=False, shape=_same_as(0), domain="onemodel")
def conv_input_grad(X, W, dY, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                    pads=None, strides=None):
    """Gradient of Conv with respect to X (whose values are not read, only its shape)."""
    k = tuple(kernel_shape) if kernel_shape else W.shape[2:]
    s, pb, pe, d, out_sp, _ = _geometry(X.shape[2:], k, strides, pads, dilations, auto_pad)
    n, c = X.shape[:2]
    m = W.shape[0]
    padded = tuple(x + b + e for x, b, e in zip(X.shape[2:], pb, pe))
    if group == 1:
        dy = np.ascontiguousarray(np.moveaxis(dY, 1, -1)).reshape(-1, m)
        dcols = (dy @ _weight_matrix(W)).reshape(n, *out_sp, *k, c)
        dxp = _col2im_last(dcols, (n, *padded, c), k, s, d, out_sp)
        inner = (slice(None),) + tuple(slice(b, p - e) for b, e, p in zip(pb, pe, padded))
        return np.ascontiguousarray(np.moveaxis(dxp[inner], -1, 1))
    g = group
    dy = dY.reshape(n, g, m // g, math.prod(out_sp))
    w = W.reshape(g, m // g, math.prod(W.shape[1:]))
    dcols = np.matmul(w.transpose(0, 2, 1), dy).reshape(n, c, *k, *out_sp)  # N, G, Cg*K, L
    dX = _crop(_col2im(dcols, (n, c, *padded), k, s, d, out_sp), pb, pe)
    return np.ascontiguousarray(dX)


@defop("ConvWeightGrad", traceable=False, shape=_same_as(1), domain="onemodel")
def conv_weight_grad(X, W, dY, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                     pads=None, strides=None):
    """Gradient of Conv with respect to W (whose values are not read, only its shape)."""
    k = tuple(kernel_shape) if kernel_shape else W.shape[2:]
    s, pb, pe, d, out_sp, _ = _geometry(X.shape[2:], k, strides, pads, dilations, auto_pad)
    n, c = X.shape[:2]
    m = W.shape[0]
    if group == 1:
        cols = _im2col_last(_channels_last(X, pb, pe), k, s, d, out_sp)
        dy = np.ascontiguousarray(np.moveaxis(dY, 1, -1)).reshape(-1, m)
        dw = (dy.T @ cols).reshape(m, *k, c)
        return np.ascontiguousarray(np.moveaxis(dw, -1, 1))
    g = group
    cols, _ = _im2col(X, k, s, pb, pe, d, out_sp, g)
    length = math.prod(out_sp)
    dy = dY.reshape(n, g, m // g, length)
    dy_t = dy.transpose(1, 2, 0, 3).reshape(g, m // g, n * length)
    cols_t = cols.transpose(1, 0, 3, 2).reshape(g, n * length, cols.shape[2])
    return np.matmul(dy_t, cols_t).reshape(W.shape)


def _convt_geometry(in_sp, k, strides, pads, dilations, output_padding, output_shape, auto_pad):
    nd = len(k)
    s = tuple(strides) if strides else (1,) * nd
    d = tuple(dilations) if dilations else (1,) * nd
    op = tuple(output_padding) if output_padding else (0,) * nd
    p = list(pads) if pads else [0] * (2 * nd)
    full = [(in_sp[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1 + op[i] for i in range(nd)]
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = list(output_shape)[-nd:] if output_shape is not None else [
            in_sp[i] * s[i] for i in range(nd)
        ]
        for i in range(nd):
            total = full[i] - target[i]
            if auto_pad == "SAME_UPPER":
                p[i], p[i + nd] = total // 2, total - total // 2
            else:
                p[i], p[i + nd] = total - total // 2, total // 2
    pb, pe = tuple(p[:nd]), tuple(p[nd:])
    out = tuple(full[i] - pb[i] - pe[i] for i in range(nd))
    return s, pb, pe, d, op, tuple(full), out


def _convt_shape(specs, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                 output_padding=None, output_shape=None, pads=None, strides=None):
    x, w = specs[0], specs[1]
    dt = same_dtype(specs, FLOATING)
    nd = len(x.shape) - 2
    k = tuple(kernel_shape) if kernel_shape else tuple(w.shape[2:])
    s = strides or (1,) * nd
    d = dilations or (1,) * nd
    op = output_padding or (0,) * nd
    p = pads or (0,) * (2 * nd)
    out = []
    for i in range(nd):
        if output_shape is not None:
            out.append(int(list(output_shape)[-nd:][i]))
        elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out.append(mul(x.shape[2 + i], s[i]))
        else:
            out.append(add(mul(add(x.shape[2 + i], -1), s[i]),
                           (k[i] - 1) * d[i] + 1 + op[i] - p[i] - p[i + nd]))
        if isinstance(out[-1], int) and out[-1] < 1 and x.shape[2 + i] != 0:
            raise ShapeError(f"output size {out[-1]} along spatial axis {i} (input "
                             f"{x.shape[2 + i]}, kernel {k[i]}, stride {s[i]}, pads "
                             f"{p[i]}+{p[i + nd]}); the pads must leave at least one element")
    return TensorSpec((x.shape[0], mul(w.shape[1], group), *out), dt)


def _convt_grad(ctx, g):
    x, w = ctx.inputs[0], ctx.inputs[1]
    b = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    a = ctx.attrs
    k = tuple(a["kernel_shape"]) if a["kernel_shape"] else tuple(w.shape[2:])
    s, pb, pe, d, _, _, _ = _convt_geometry(x.shape[2:], k, a["strides"], a["pads"],
                                            a["dilations"], a["output_padding"],
                                            a["output_shape"], a["auto_pad"])
    conv_attrs = dict(group=a["group"], strides=s, pads=pb + pe, dilations=d, kernel_shape=k)
    gx = call("Conv", g, w, **conv_attrs) if x.requires_grad else None
    gw = call("ConvWeightGrad", g, w, x, **conv_attrs) if w.requires_grad else None
    gb = g.sum(axis=(0, *range(2, g.ndim))) if b is not None and b.requires_grad else None
    return gx, gw, gb


@defop("ConvTranspose", shape=_convt_shape, grad=_convt_grad)
def conv_transpose(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1,
                   kernel_shape=None, output_padding=None, output_shape=None, pads=None,
                   strides=None):
    nd = X.ndim - 2
    k = tuple(kernel_shape) if kernel_shape else W.shape[2:]
    s, pb, pe, d, _, full, _out = _convt_geometry(X.shape[2:], k, strides, pads, dilations,
                                                 output_padding, output_shape, auto_pad)
    n, cin = X.shape[:2]
    g = group
    mg = W.shape[1]
    x = X.reshape(n, g, cin // g, math.prod(X.shape[2:]))
    w = W.reshape(g, cin // g, math.prod(W.shape[1:]))
    cols = np.matmul(w.transpose(0, 2, 1), x).reshape(n, g * mg, *k, *X.shape[2:])
    y = _col2im(cols, (n, g * mg, *full), k, s, d, X.shape[2:])
    if any(p < 0 for p in pb + pe):  # an output_shape larger than the kernel reaches: zeros
        y = _pad_spatial(y, tuple(max(-p, 0) for p in pb), tuple(max(-p, 0) for p in pe))
        pb, pe = tuple(max(p, 0) for p in pb), tuple(max(p, 0) for p in pe)
    y = _crop(y, pb, pe)
    y = np.ascontiguousarray(y)
    if B is not None:
        y += B.reshape((1, g * mg) + (1,) * nd)
    return y


# pooling -----------------------------------------------------------------------------------

def _pool_shape(specs, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=(),
                pads=None, strides=None, storage_order=0, count_include_pad=0):
    x = specs[0]
    same_dtype(specs, NUMERIC)
    nd = len(x.shape) - 2
    k = tuple(kernel_shape)
    if len(k) != nd:
        raise ShapeError(f"kernel_shape {list(k)} does not match {nd} spatial axes")
    s = strides or (1,) * nd
    d = dilations or (1,) * nd
    p = pads or (0,) * (2 * nd)
    out = []
    for i in range(nd):
        dim = x.shape[2 + i]
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out.append(floordiv(add(dim, s[i] - 1), s[i]))
        elif isinstance(dim, int):
            out.append(_geometry((dim,), (k[i],), (s[i],), (p[i], p[i + nd]), (d[i],),
                                 auto_pad, ceil_mode)[4][0])
        else:
            ext = (k[i] - 1) * d[i] + 1
            span = add(dim, p[i] + p[i + nd] - ext + (s[i] - 1 if ceil_mode else 0))
            out.append(add(floordiv(span, s[i]), 1))
    return TensorSpec((x.shape[0], x.shape[1], *out), x.dtype)


def _pool_setup(X, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode):
    k = tuple(kernel_shape)
    s, pb, pe, d, out_sp, extra = _geometry(X.shape[2:], k, strides, pads, dilations, auto_pad,
                                            ceil_mode)
    return k, s, pb, tuple(e + x for e, x in zip(pe, extra)), d, out_sp, pe


def _max_pool_grad(ctx, g):
    return call("MaxPoolGrad", ctx.inputs[0], g, **ctx.attrs)


@defop("MaxPool", shape=_pool_shape, grad=_max_pool_grad)
def max_pool(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=(), pads=None,
             storage_order=0, strides=None):
    k, s, pb, pe, d, out_sp, _ = _pool_setup(X, kernel_shape, strides, pads, dilations, auto_pad,
                                             ceil_mode)
    lowest = -np.inf if X.dtype.kind == "f" else np.iinfo(X.dtype).min
    xp = _pad_spatial(X, pb, pe, lowest)
    out = None
    for _, sl in _positions(k, s, d, out_sp):
        window = xp[(slice(None), slice(None), *sl)]
        out = window.copy() if out is None else np.maximum(out, window, out=out)
    return out


@defop("MaxPoolGrad", traceable=False, shape=lambda specs, **a: TensorSpec(specs[0].shape, specs[0].dtype),
       domain="onemodel")
def max_pool_grad(X, dY, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=(),
                  pads=None, storage_order=0, strides=None):
    """Gradient of MaxPool: each window's gradient goes to its first maximum."""
    k, s, pb, pe, d, out_sp, _ = _pool_setup(X, kernel_shape, strides, pads, dilations, auto_pad,
                                             ceil_mode)
    xp = _pad_spatial(X, pb, pe, -np.inf)
    windows = [xp[(slice(None), slice(None), *sl)] for _, sl in _positions(k, s, d, out_sp)]
    best = windows[0].copy()
    for window in windows[1:]:
        np.maximum(best, window, out=best)
    # windows that tile the input exactly: each element is written once
    tiled = all(dd == 1 and kk == ss and o * ss == n
                for kk, dd, ss, o, n in zip(k, d, s, out_sp, xp.shape[2:]))
    dxp = (np.empty if tiled else np.zeros)(xp.shape, dY.dtype)
    taken = np.zeros(best.shape, bool)  # ties: the first position in the window takes it
    for (_, sl), window in zip(_positions(k, s, d, out_sp), windows):
        hit = window == best
        hit &= ~taken
        taken |= hit
        target = (slice(None), slice(None), *sl)
        if tiled:
            dxp[target] = dY * hit
        else:
            dxp[target] += dY * hit
    return np.ascontiguousarray(_crop(dxp, pb, pe))


def _window_sum(xp, k, s, d, out_sp):
    out = None
    for _, sl in _positions(k, s, d, out_sp):
        window = xp[(slice(None), slice(None), *sl)]
        out = window.astype(xp.dtype, copy=True) if out is None else np.add(out, window, out=out)
    return out


def _avg_counts(X, k, s, pb, pe, pe_explicit, d, out_sp, count_include_pad):
    ones = np.ones((1, 1, *X.shape[2:]), X.dtype)
    if count_include_pad:
        ones = _pad_spatial(ones, pb, pe_explicit, 1.0)
        ones = _pad_spatial(ones, (0,) * len(k), tuple(a - b for a, b in zip(pe, pe_explicit)))
    else:
        ones = _pad_spatial(ones, pb, pe)
    return _window_sum(ones, k, s, d, out_sp)


def _avg_pool_grad(ctx, g):
    return call("AveragePoolGrad", ctx.inputs[0], g, **ctx.attrs)


@defop("AveragePool", shape=_pool_shape, grad=_avg_pool_grad)
def average_pool(X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=(), pads=None, strides=None):
    k, s, pb, pe, d, out_sp, pe_explicit = _pool_setup(X, kernel_shape, strides, pads, dilations,
                                                       auto_pad, ceil_mode)
    total = _window_sum(_pad_spatial(X, pb, pe), k, s, d, out_sp)
    counts = _avg_counts(X, k, s, pb, pe, pe_explicit, d, out_sp, count_include_pad)
    return (total / counts).astype(X.dtype, copy=False)


@defop("AveragePoolGrad", traceable=False,
       shape=lambda specs, **a: TensorSpec(specs[0].shape, specs[0].dtype),
       domain="onemodel")
def average_pool_grad(X, dY, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0,
                      dilations=None, kernel_shape=(), pads=None, strides=None):
    """Gradient of AveragePool: each window's gradient spread evenly over what it averaged."""
    k, s, pb, pe, d, out_sp, pe_explicit = _pool_setup(X, kernel_shape, strides, pads, dilations,
                                                       auto_pad, ceil_mode)
    counts = _avg_counts(X, k, s, pb, pe, pe_explicit, d, out_sp, count_include_pad)
    share = (dY / counts).astype(dY.dtype, copy=False)
    nd = len(k)
    padded = (X.shape[0], X.shape[1], *(X.shape[2 + i] + pb[i] + pe[i] for i in range(nd)))
    dxp = np.zeros(padded, dY.dtype)
    for _, sl in _positions(k, s, d, out_sp):
        dxp[(slice(None), slice(None), *sl)] += share
    return np.ascontiguousarray(_crop(dxp, pb, pe))


def _global_pool_shape(specs):
    x = specs[0]
    same_dtype(specs, FLOATING)
    return TensorSpec(x.shape[:2] + (1,) * (len(x.shape) - 2), x.dtype)


def _global_avg_grad(ctx, g):
    x = ctx.inputs[0]
    return g.expand(*x.shape) / math.prod(x.shape[2:])


@defop("GlobalAveragePool", shape=_global_pool_shape, grad=_global_avg_grad)
def global_average_pool(X):
    return X.mean(axis=tuple(range(2, X.ndim)), keepdims=True).astype(X.dtype, copy=False)


@defop("GlobalMaxPool", shape=_global_pool_shape)
def global_max_pool(X):
    return X.max(axis=tuple(range(2, X.ndim)), keepdims=True)


# normalization -----------------------------------------------------------------------------

_BN_PARAMS = ("scale", "B", "input_mean", "input_var")


def _bn_shape(specs, *, epsilon=1e-5, momentum=0.9, training_mode=0):
    x = specs[0]
    dt = same_dtype(specs[:1], FLOATING)
    if training_mode:
        raise ShapeError("BatchNormalization with training_mode=1 is not supported; the "
                         "training package computes batch statistics with other ops")
    if len(x.shape) < 2:
        raise ShapeError(f"BatchNormalization needs an input (N, C, ...), got rank {len(x.shape)}")
    c = x.shape[1]
    for name, p in zip(_BN_PARAMS, specs[1:]):
        ok = len(p.shape) == 1 and not (isinstance(c, int) and isinstance(p.shape[0], int)
                                        and p.shape[0] != c)
        if not ok:
            raise ShapeError(f"{name} has shape {format_shape(p.shape)}, but the input has {c} "
                             "channels; "
                             f"scale, B, input_mean and input_var must each be [{c}]")
    return TensorSpec(x.shape, dt)


def _channel(t, ndim):
    return t.reshape(1, -1, *([1] * (ndim - 2)))


def _bn_grad(ctx, g):
    x, scale, bias, mean, var = ctx.inputs
    eps = ctx.attrs["epsilon"]
    nd = x.ndim
    axes = (0, *range(2, nd))
    inv = (var + eps) ** -0.5
    xhat = (x - _channel(mean, nd)) * _channel(inv, nd)
    gx = g * _channel(scale * inv, nd) if x.requires_grad else None
    gscale = (g * xhat).sum(axis=axes) if scale.requires_grad else None
    gbias = g.sum(axis=axes) if bias.requires_grad else None
    gmean = (g.sum(axis=axes) * scale * inv * -1) if mean.requires_grad else None
    gvar = None
    if var.requires_grad:
        gvar = (g * (x - _channel(mean, nd))).sum(axis=axes) * scale * (inv**3) * -0.5
    return gx, gscale, gbias, gmean, gvar


@defop("BatchNormalization", shape=_bn_shape, grad=_bn_grad)
def batch_normalization(X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9,
                        training_mode=0):
    """Inference-mode batch normalization with running statistics."""
    shape = (1, -1) + (1,) * (X.ndim - 2)
    inv = (1.0 / np.sqrt(input_var.astype(np.float64) + epsilon)).astype(X.dtype)
    mul_ = (scale * inv).reshape(shape)
    return (X - input_mean.reshape(shape)) * mul_ + B.reshape(shape)


def _onto(name, spec, x_shape):
    """Refuse a parameter that does not broadcast onto X (the kernel would fail, or change the
    output's shape)."""
    if spec is None:
        return
    shape = spec.shape
    if len(shape) > len(x_shape) or any(
            isinstance(p, int) and isinstance(t, int) and p not in (1, t)
            for p, t in zip(reversed(shape), reversed(x_shape))):
        raise ShapeError(f"{name} has shape {format_shape(shape)}, which does not broadcast "
                         f"onto the input {format_shape(x_shape)}")


def _ln_shape(specs, *, axis=-1, epsilon=1e-5, stash_type=1):
    x = specs[0]
    dt = same_dtype([s for s in specs], FLOATING)
    a = norm_axis(axis, len(x.shape))
    _onto("Scale", specs[1], x.shape)
    _onto("B", specs[2] if len(specs) > 2 else None, x.shape)
    stats = TensorSpec(tuple(x.shape[:a]) + (1,) * (len(x.shape) - a),
                       DType.F32 if stash_type == 1 else dt)
    return [TensorSpec(x.shape, dt), stats, stats]


def _ln_grad(ctx, g, *_stats):
    x, scale = ctx.inputs[0], ctx.inputs[1]
    bias = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    a = ctx.attrs["axis"] % x.ndim
    axes = tuple(range(a, x.ndim))
    lead = tuple(range(a))
    mean = x.mean(axis=axes, keepdims=True)
    xc = x - mean
    rstd = ((xc * xc).mean(axis=axes, keepdims=True) + ctx.attrs["epsilon"]) ** -0.5
    xhat = xc * rstd
    dxhat = g * scale
    gx = (dxhat - dxhat.mean(axis=axes, keepdims=True)
          - xhat * (dxhat * xhat).mean(axis=axes, keepdims=True)) * rstd
    gscale = (g * xhat).sum(axis=lead) if lead else g * xhat
    gscale = gscale.reshape(*scale.shape) if scale.requires_grad else None
    gbias = None
    if bias is not None and bias.requires_grad:
        gbias = (g.sum(axis=lead) if lead else g).reshape(*bias.shape)
    return gx, gscale, gbias


@defop("LayerNormalization", shape=_ln_shape, grad=_ln_grad,
       outputs=("Y", "Mean", "InvStdDev"))
def layer_normalization(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    """ONNX LayerNormalization (opset 17): the normalized output, the mean and the inverse
    standard deviation (float32 when ``stash_type`` is 1)."""
    a = axis % X.ndim
    axes = tuple(range(a, X.ndim))
    stash = np.float32 if stash_type == 1 else X.dtype
    x = X.astype(stash, copy=False) if X.dtype == np.float16 else X
    mean = x.mean(axis=axes, keepdims=True)
    xc = x - mean
    var = (xc * xc).mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(var + np.asarray(epsilon, x.dtype))
    y = xc * inv * Scale
    if B is not None:
        y = y + B
    return (y.astype(X.dtype, copy=False), mean.astype(stash, copy=False),
            inv.astype(stash, copy=False))


def _lrn_shape(specs, *, alpha=1e-4, beta=0.75, bias=1.0, size=1):
    x = specs[0]
    same_dtype(specs, FLOATING)
    if len(x.shape) < 3:
        raise ShapeError("LRN needs an input of rank 3 or more (N, C, ...)")
    return TensorSpec(x.shape, x.dtype)


@defop("LRN", shape=_lrn_shape)
def lrn(X, *, alpha=1e-4, beta=0.75, bias=1.0, size=1):
    """Local response normalization across channels (ONNX LRN)."""
    sq = (X.astype(np.float64) ** 2)
    before, after = (size - 1) // 2, size // 2  # floor((size-1)/2) before, ceil after
    padded = np.pad(sq, [(0, 0), (before, after)] + [(0, 0)] * (X.ndim - 2))
    c = X.shape[1]
    total = np.zeros_like(sq)
    for i in range(size):
        total += padded[:, i : i + c]
    return (X / (bias + alpha / size * total) ** beta).astype(X.dtype)


def _rms_shape(specs, *, axis=-1, epsilon=1e-5, stash_type=1):
    x = specs[0]
    norm_axis(axis, len(x.shape))
    _onto("scale", specs[1], x.shape)
    return TensorSpec(x.shape, same_dtype(specs[:1], FLOATING))


@defop("RMSNormalization", shape=_rms_shape)
def rms_normalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """ONNX RMSNormalization (opset 23): X / sqrt(mean(X^2) + epsilon) * scale."""
    a = axis % X.ndim
    x = X.astype(np.float32 if stash_type == 1 and X.dtype == np.float16 else X.dtype)
    ms = np.mean(x * x, axis=tuple(range(a, X.ndim)), keepdims=True)
    return (x / np.sqrt(ms + epsilon) * scale).astype(X.dtype)


# softmax -----------------------------------------------------------------------------------

def _softmax_shape(specs, *, axis=-1):
    x = specs[0]
    dt = same_dtype(specs, FLOATING)
    norm_axis(axis, len(x.shape))
    return TensorSpec(x.shape, dt)


def _softmax_grad(ctx, g):
    y = ctx.outputs[0]
    gy = g * y
    return gy - y * gy.sum(axis=ctx.attrs["axis"], keepdims=True)


@onnx_adapter("Softmax", "LogSoftmax", before=13)
def _flattened_softmax(node: ImportNode) -> None:
    """Opset < 13: over the input flattened to 2-D at ``axis`` (default 1), reshaped back."""
    node.need(1)
    x = node.inputs[0]
    (shape,) = node.emit("Shape", [x])
    (flat,) = node.emit("Flatten", [x], {"axis": node.attrs.get("axis", 1)})
    (soft,) = node.emit(node.op, [flat], {"axis": -1})
    node.op, node.inputs, node.attrs = "Reshape", [soft, shape], {}


@defop("Softmax", shape=_softmax_shape, grad=_softmax_grad)
def softmax(input, *, axis=-1):
    if input.size == 0:  # max over an empty axis has no identity; the result is empty too
        return np.empty_like(input)
    e = np.exp(input - input.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax_grad(ctx, g):
    y = ctx.outputs[0]
    return g - y.exp() * g.sum(axis=ctx.attrs["axis"], keepdims=True)


@defop("LogSoftmax", shape=_softmax_shape, grad=_log_softmax_grad)
def log_softmax(input, *, axis=-1):
    if input.size == 0:
        return np.empty_like(input)
    shifted = input - input.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


# Lp pooling and normalization, group/instance/mean-variance normalization, MaxUnpool ---------

def _lp_pool_shape(specs, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=(),
                   p=2, pads=None, strides=None):
    same_dtype(specs, FLOATING)
    return _pool_shape(specs, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations,
                       kernel_shape=kernel_shape, pads=pads, strides=strides)


def _lp_pool_grad(ctx, g):
    return call("LpPoolGrad", ctx.inputs[0], ctx.outputs[0], g, **ctx.attrs)


@defop("LpPool", shape=_lp_pool_shape, grad=_lp_pool_grad)
def lp_pool(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=(), p=2,
            pads=None, strides=None):
    """ONNX LpPool: the p-norm of each window, (sum |x|^p)^(1/p); padding adds nothing."""
    k, s, pb, pe, d, out_sp, _ = _pool_setup(X, kernel_shape, strides, pads, dilations, auto_pad,
                                             ceil_mode)
    x = np.abs(X.astype(np.float32) if X.dtype == np.float16 else X)
    powered = x * x if p == 2 else x if p == 1 else x ** p
    total = _window_sum(_pad_spatial(powered, pb, pe), k, s, d, out_sp)
    out = np.sqrt(total) if p == 2 else total if p == 1 else total ** (1.0 / p)
    return out.astype(X.dtype, copy=False)


@defop("LpPoolGrad", traceable=False, shape=lambda specs, **a: TensorSpec(specs[0].shape, specs[0].dtype),
       domain="onemodel")
def lp_pool_grad(X, Y, dY, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=(),
                 p=2, pads=None, strides=None):
    """Gradient of LpPool: dY * Y^(1-p) summed back over each window, times
    sign(x) |x|^(p-1) (0 where a window's norm is 0)."""
    k, s, pb, pe, d, out_sp, _ = _pool_setup(X, kernel_shape, strides, pads, dilations, auto_pad,
                                             ceil_mode)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(Y > 0, dY * Y ** (1 - p), 0).astype(dY.dtype, copy=False)
    padded = X.shape[:2] + tuple(X.shape[2 + i] + pb[i] + pe[i] for i in range(len(k)))
    dxp = np.zeros(padded, dY.dtype)
    for _, sl in _positions(k, s, d, out_sp):
        dxp[(slice(None), slice(None), *sl)] += share
    local = X if p == 2 else np.sign(X) if p == 1 else np.sign(X) * np.abs(X) ** (p - 1)
    return (np.ascontiguousarray(_crop(dxp, pb, pe)) * local).astype(dY.dtype, copy=False)


def _lp_norm_shape(specs, *, axis=-1, p=2):
    x = specs[0]
    dt = same_dtype(specs, FLOATING)
    norm_axis(axis, len(x.shape))
    if p not in (1, 2):
        raise ShapeError(f"LpNormalization supports p = 1 or 2, got {p}")
    return TensorSpec(x.shape, dt)


def _lp_norm_grad(ctx, g):
    x = ctx.inputs[0]
    a, p = ctx.attrs["axis"], ctx.attrs["p"]
    y = ctx.outputs[0]
    if p == 2:
        norm = (x * x).sum(axis=a, keepdims=True).sqrt()
        direction = y
    else:
        norm = x.abs().sum(axis=a, keepdims=True)
        direction = call("Sign", x)
    # d(x / n) = (g - direction * sum(g * y)) / n, and 0 where the norm is 0 (as the output)
    safe = call("Where", norm == 0, norm + 1, norm)
    gx = (g - direction * (g * y).sum(axis=a, keepdims=True)) / safe
    return call("Where", norm == 0, gx * 0, gx)


@defop("LpNormalization", shape=_lp_norm_shape, grad=_lp_norm_grad)
def lp_normalization(input, *, axis=-1, p=2):
    """ONNX LpNormalization: ``input`` divided by its L1 or L2 norm along ``axis`` (0 where the
    norm is 0)."""
    x = input.astype(np.float32) if input.dtype == np.float16 else input
    norm = (np.sqrt(np.sum(x * x, axis=axis, keepdims=True)) if p == 2
            else np.sum(np.abs(x), axis=axis, keepdims=True))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(norm == 0, 0, x / norm)
    return out.astype(input.dtype, copy=False)


def _grouped_norm_shape(x, params, what):
    if len(x.shape) < 2:
        raise ShapeError(f"{what} needs an input (N, C, ...), got rank {len(x.shape)}")
    c = x.shape[1]
    for name, p in params:
        if len(p.shape) != 1 or (isinstance(c, int) and isinstance(p.shape[0], int)
                                 and p.shape[0] != c):
            raise ShapeError(f"{name} has shape {format_shape(p.shape)}; it must be [{c}], one "
                             "value per channel")


def _group_stats(x, groups, epsilon):
    """(N, G, rest) view of ``x``, its mean and inverse standard deviation per group."""
    xg = x.reshape(x.shape[0], groups, -1) if x.size else x.reshape(x.shape[0], groups, 0)
    mean = xg.mean(axis=2, keepdims=True)
    xc = xg - mean
    var = (xc * xc).mean(axis=2, keepdims=True)
    return xc, 1 / np.sqrt(var + np.asarray(epsilon, x.dtype))


def _grouped_norm(X, scale, bias, groups, epsilon, stash):
    x = X.astype(stash, copy=False)
    xc, inv = _group_stats(x, groups, epsilon)
    xhat = (xc * inv).reshape(X.shape).astype(X.dtype, copy=False)
    shape = (1, -1) + (1,) * (X.ndim - 2)
    return (xhat * scale.reshape(shape) + bias.reshape(shape)).astype(X.dtype, copy=False)


def _grouped_norm_grad(ctx, g, groups):
    """Gradients of a group normalization (groups of channels; one group per channel for
    instance normalization), written with other ops."""
    x, scale, bias = ctx.inputs
    eps = ctx.attrs["epsilon"]
    n = x.shape[0]
    shape = (1, -1) + (1,) * (x.ndim - 2)
    xg = x.reshape(n, groups, -1)
    mean = xg.mean(axis=2, keepdims=True)
    xc = xg - mean
    rstd = ((xc * xc).mean(axis=2, keepdims=True) + eps) ** -0.5
    xhat = xc * rstd
    axes = (0, *range(2, x.ndim))
    gx = None
    if x.requires_grad:
        dxhat = (g * scale.reshape(*shape)).reshape(n, groups, -1)
        gx = ((dxhat - dxhat.mean(axis=2, keepdims=True)
               - xhat * (dxhat * xhat).mean(axis=2, keepdims=True)) * rstd).reshape(*x.shape)
    gscale = (g * xhat.reshape(*x.shape)).sum(axis=axes) if scale.requires_grad else None
    gbias = g.sum(axis=axes) if bias.requires_grad else None
    return gx, gscale, gbias


def _group_norm_shape(specs, *, epsilon=1e-5, num_groups=None, stash_type=1):
    x = specs[0]
    dt = same_dtype(specs, FLOATING)
    _grouped_norm_shape(x, [("scale", specs[1]), ("bias", specs[2])], "GroupNormalization")
    if num_groups is None or num_groups < 1:
        raise ShapeError(f"GroupNormalization needs num_groups >= 1, got {num_groups}")
    c = x.shape[1]
    if isinstance(c, int) and c % num_groups:
        raise ShapeError(f"{c} channels do not split into {num_groups} groups")
    return TensorSpec(x.shape, dt)


@defop("GroupNormalization", shape=_group_norm_shape, onnx_opset=21,
       grad=lambda ctx, g: _grouped_norm_grad(ctx, g, ctx.attrs["num_groups"]))
def group_normalization(X, scale, bias, *, epsilon=1e-5, num_groups=None, stash_type=1):
    """ONNX GroupNormalization (opset 21): each group of C / num_groups channels normalized per
    instance, then a per-channel ``scale`` and ``bias``; statistics in float32 when
    ``stash_type`` is 1."""
    if X.shape[1] % num_groups:
        raise ShapeError(f"{X.shape[1]} channels do not split into {num_groups} groups")
    stash = np.float32 if stash_type == 1 and X.dtype == np.float16 else X.dtype
    return _grouped_norm(X, scale, bias, num_groups, epsilon, stash)


def _instance_norm_shape(specs, *, epsilon=1e-5):
    dt = same_dtype(specs, FLOATING)
    _grouped_norm_shape(specs[0], [("scale", specs[1]), ("B", specs[2])],
                        "InstanceNormalization")
    return TensorSpec(specs[0].shape, dt)


@defop("InstanceNormalization", shape=_instance_norm_shape,
       grad=lambda ctx, g: _grouped_norm_grad(ctx, g, ctx.inputs[0].shape[1]))
def instance_normalization(input, scale, B, *, epsilon=1e-5):
    """ONNX InstanceNormalization: each channel of each instance normalized over its spatial
    axes, then a per-channel ``scale`` and bias ``B``."""
    stash = np.float32 if input.dtype == np.float16 else input.dtype
    return _grouped_norm(input, scale, B, input.shape[1], epsilon, stash)


def _mvn_shape(specs, *, axes=(0, 2, 3)):
    x = specs[0]
    dt = same_dtype(specs, FLOATING)
    red = [norm_axis(int(a), len(x.shape)) for a in axes]
    if len(set(red)) != len(red):
        raise ShapeError(f"MeanVarianceNormalization axes {list(axes)} repeat an axis")
    return TensorSpec(x.shape, dt)


def _mvn_grad(ctx, g):
    x = ctx.inputs[0]
    axes = tuple(a % x.ndim for a in ctx.attrs["axes"])
    mean = x.mean(axis=axes, keepdims=True)
    xc = x - mean
    std = (xc * xc).mean(axis=axes, keepdims=True).sqrt()
    d = std + 1e-9
    # y = xc / d: dy/dx = (g - mean(g)) / d - xc * mean(g * xc) / (std * d^2)
    inner = (g * xc).mean(axis=axes, keepdims=True)
    safe = call("Where", std == 0, std + 1, std)
    return (g - g.mean(axis=axes, keepdims=True)) / d - xc * inner / (safe * d * d)


@defop("MeanVarianceNormalization", shape=_mvn_shape, grad=_mvn_grad)
def mean_variance_normalization(X, *, axes=(0, 2, 3)):
    """ONNX MeanVarianceNormalization: (X - E[X]) / (sqrt(Var[X]) + 1e-9) over ``axes`` (the
    epsilon of ONNX's function body)."""
    ax = tuple(int(a) % X.ndim for a in axes)
    x = X.astype(np.float32) if X.dtype == np.float16 else X
    xc = x - x.mean(axis=ax, keepdims=True)
    std = np.sqrt((xc * xc).mean(axis=ax, keepdims=True))
    return (xc / (std + np.asarray(1e-9, x.dtype))).astype(X.dtype, copy=False)


def _unpool_size(dim, k, s, pb, pe):
    return add(mul(add(dim, -1), s), k - pb - pe)


def _max_unpool_shape(specs, *, kernel_shape=(), pads=None, strides=None):
    x, idx = specs[0], specs[1]
    same_dtype(specs[:1], NUMERIC)
    if idx.dtype is not DType.I64:
        raise ShapeError(f"MaxUnpool indices must be I64, got {idx.dtype.name}")
    nd = len(x.shape) - 2
    if len(kernel_shape) != nd or nd < 1:
        raise ShapeError(f"kernel_shape {list(kernel_shape)} does not match {nd} spatial axes")
    target = specs[2] if len(specs) > 2 else None
    if target is not None:
        shape = const_ints(target, "the MaxUnpool output_shape")
        if len(shape) != len(x.shape):
            raise ShapeError(f"output_shape {list(shape)} must have rank {len(x.shape)}")
        return TensorSpec(tuple(shape), x.dtype)
    s = strides or (1,) * nd
    p = pads or (0,) * (2 * nd)
    out = [_unpool_size(x.shape[2 + i], kernel_shape[i], s[i], p[i], p[i + nd])
           for i in range(nd)]
    return TensorSpec((x.shape[0], x.shape[1], *out), x.dtype)


@defop("MaxUnpool", shape=_max_unpool_shape, static=("output_shape",))
def max_unpool(X, I, output_shape=None, *, kernel_shape=(), pads=None, strides=None):
    """ONNX MaxUnpool: zeros with each value of ``X`` written at its flat index ``I`` in the
    unpooled tensor (N, C, (in - 1) * stride - pads + kernel, ...). A larger ``output_shape``
    pads that tensor with zeros at the end of each axis, as ONNX's reference and expected
    outputs do (indices are not re-read against ``output_shape``)."""
    nd = X.ndim - 2
    s = strides or (1,) * nd
    p = pads or (0,) * (2 * nd)
    inferred = X.shape[:2] + tuple(
        (X.shape[2 + i] - 1) * s[i] - p[i] - p[i + nd] + kernel_shape[i] for i in range(nd))
    if I.shape != X.shape:
        raise ShapeError(f"MaxUnpool indices {list(I.shape)} must have the shape of X "
                         f"{list(X.shape)}")
    total = math.prod(inferred)
    flat = I.reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= total):
        raise ShapeError(f"MaxUnpool indices must lie in [0, {total}) for the unpooled shape "
                         f"{list(inferred)}")
    y = np.zeros(total, X.dtype)
    y[flat] = X.reshape(-1)
    y = y.reshape(inferred)
    if output_shape is None:
        return y
    shape = tuple(int(v) for v in output_shape)
    if any(o < i for o, i in zip(shape, inferred)) or len(shape) != X.ndim:
        raise ShapeError(f"MaxUnpool output_shape {list(shape)} is smaller than the unpooled "
                         f"shape {list(inferred)}")
    if shape == inferred:
        return y
    out = np.zeros(shape, X.dtype)
    out[tuple(slice(0, i) for i in inferred)] = y
    return out


# DeformConv, RoiAlign --------------------------------------------------------------------------

def _deform_conv_shape(specs, *, dilations=None, group=1, kernel_shape=None, offset_group=1,
                       pads=None, strides=None):
    x, w, off = specs[0], specs[1], specs[2]
    dt = same_dtype([s for s in specs if s is not None], FLOATING)
    nd, k = _conv_attrs_shape(x.shape, w.shape, "NOTSET", dilations, kernel_shape, pads,
                              strides, "DeformConv")
    c = x.shape[1]
    if isinstance(c, int) and isinstance(w.shape[1], int) and c != w.shape[1] * group:
        raise ShapeError(f"input has {c} channels but W expects {w.shape[1]} x group {group}")
    if isinstance(c, int) and c % offset_group:
        raise ShapeError(f"{c} channels do not split into {offset_group} offset groups")
    kk = math.prod(k)
    if len(off.shape) != nd + 2 or (isinstance(off.shape[1], int)
                                    and off.shape[1] != offset_group * kk * nd):
        raise ShapeError(f"offset has shape {format_shape(off.shape)}; it must be (N, "
                         f"{offset_group * kk * nd}, *output) for offset_group {offset_group} "
                         f"and kernel {list(k)}")
    s = strides or (1,) * nd
    d = dilations or (1,) * nd
    p = pads or (0,) * (2 * nd)
    out = tuple(_geometry((x.shape[2 + i],), (k[i],), (s[i],), (p[i], p[i + nd]), (d[i],))[4][0]
                if isinstance(x.shape[2 + i], int) else
                add(floordiv(add(x.shape[2 + i], p[i] + p[i + nd] - (k[i] - 1) * d[i] - 1), s[i]), 1)
                for i in range(nd))
    return TensorSpec((x.shape[0], w.shape[0], *out), dt)


def _bilinear_columns(X, pos, offset_group):
    """Values of X (N, C, *sp) at fractional positions ``pos`` (nd, N, G, P) by (multi)linear
    interpolation, zero outside: (N, C, P), each channel reading its offset group's positions."""
    n, c = X.shape[:2]
    sp = X.shape[2:]
    nd = len(sp)
    flat = X.reshape(n, offset_group, c // offset_group, math.prod(sp))
    low = [np.floor(p) for p in pos]
    out = np.zeros((n, offset_group, c // offset_group, pos.shape[-1]), X.dtype)
    for corner in np.ndindex(*(2,) * nd):
        weight = np.ones(pos.shape[1:], X.dtype)
        index = np.zeros(pos.shape[1:], np.int64)
        for i in range(nd):
            at = low[i] + corner[i]
            weight = weight * (1 - np.abs(pos[i] - at))
            inside = (at >= 0) & (at <= sp[i] - 1)
            weight = np.where(inside, weight, 0)
            index = index * sp[i] + np.clip(at, 0, sp[i] - 1).astype(np.int64)
        values = np.take_along_axis(flat, index[:, :, None, :], axis=3)
        out += values * weight[:, :, None, :]
    return out.reshape(n, c, pos.shape[-1])


@defop("DeformConv", shape=_deform_conv_shape, onnx_opset=19)
def deform_conv(X, W, offset, B=None, mask=None, *, dilations=None, group=1, kernel_shape=None,
                offset_group=1, pads=None, strides=None):
    """ONNX DeformConv: a convolution whose kernel taps are moved by ``offset`` (per output
    position, per offset group of channels) and read by linear interpolation (zero outside
    the input), each tap scaled by ``mask``."""
    nd = X.ndim - 2
    k = tuple(kernel_shape) if kernel_shape else W.shape[2:]
    s = tuple(strides) if strides else (1,) * nd
    d = tuple(dilations) if dilations else (1,) * nd
    p = tuple(pads) if pads else (0,) * (2 * nd)
    n, c = X.shape[:2]
    m = W.shape[0]
    out_sp = offset.shape[2:]
    expect = tuple((X.shape[2 + i] + p[i] + p[i + nd] - (k[i] - 1) * d[i] - 1) // s[i] + 1
                   for i in range(nd))
    kk, og = math.prod(k), offset_group
    if out_sp != expect or offset.shape[1] != og * kk * nd or c != W.shape[1] * group:
        raise ShapeError(f"DeformConv: offset {list(offset.shape)} must be (N, {og * kk * nd}, "
                         f"{', '.join(map(str, expect))}) and X's {c} channels W's "
                         f"{W.shape[1]} x group {group}")
    length = math.prod(out_sp)
    # positions (nd, N, G, K, L): the tap's place in the padded grid plus its offset
    off = offset.reshape(n, og, kk, nd, length).transpose(3, 0, 1, 2, 4)
    taps = np.stack(np.meshgrid(*[np.arange(kk_) * dd for kk_, dd in zip(k, d)],
                                indexing="ij")).reshape(nd, kk)
    grid = np.stack(np.meshgrid(*[np.arange(o) * ss - pb for o, ss, pb in zip(out_sp, s, p)],
                                indexing="ij")).reshape(nd, length)
    pos = (taps[:, None, None, :, None] + grid[:, None, None, None, :] + off).astype(X.dtype)
    cols = _bilinear_columns(X, pos.reshape(nd, n, og, kk * length), og)  # (N, C, K * L)
    cols = cols.reshape(n, og, c // og, kk, length)
    if mask is not None:
        cols = cols * mask.reshape(n, og, 1, kk, length)
    cols = cols.reshape(n, group, (c // group) * kk, length)
    w = W.reshape(group, m // group, (c // group) * kk)
    y = np.matmul(w, cols).reshape(n, m, *out_sp)
    if B is not None:
        y = y + B.reshape((1, m) + (1,) * nd)
    return y.astype(X.dtype, copy=False)


def _roi_align_shape(specs, *, coordinate_transformation_mode="half_pixel", mode="avg",
                     output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0):
    x, rois, idx = specs
    dt = same_dtype([x, rois], FLOATING)
    if len(x.shape) != 4:
        raise ShapeError(f"RoiAlign needs X (N, C, H, W), got {x}")
    if len(rois.shape) != 2 or (isinstance(rois.shape[1], int) and rois.shape[1] != 4):
        raise ShapeError(f"RoiAlign rois must be (num_rois, 4), got {rois}")
    if idx.dtype not in (DType.I64, DType.I32) or len(idx.shape) != 1:
        raise ShapeError(f"RoiAlign batch_indices must be a 1-D integer tensor, got {idx}")
    if mode not in ("avg", "max"):
        raise ShapeError(f"RoiAlign mode must be 'avg' or 'max', got {mode!r}")
    if coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        raise ShapeError("RoiAlign coordinate_transformation_mode must be 'half_pixel' or "
                         f"'output_half_pixel', got {coordinate_transformation_mode!r}")
    return TensorSpec((rois.shape[0], x.shape[1], output_height, output_width), dt)


def _roi_samples(start, size, bins, grid, extent):
    """Per bin and sample along one axis: low and high indices, their weights, and whether the
    sample lies near the map (ONNX's reference: beyond [-1, extent] a sample reads zero)."""
    t = start + np.arange(bins)[:, None] * (size / bins) + \
        (np.arange(grid)[None, :] + 0.5) * (size / bins) / max(grid, 1)  # (bins, grid)
    near = (t >= -1.0) & (t <= extent)
    t = np.maximum(t, 0)
    low = np.floor(t).astype(np.int64)
    edge = low >= extent - 1
    low = np.where(edge, extent - 1, low)
    high = np.where(edge, extent - 1, low + 1)
    frac = np.where(edge, 0.0, t - low)
    return low, high, 1 - frac, frac, near


@defop("RoiAlign", shape=_roi_align_shape)
def roi_align(X, rois, batch_indices, *, coordinate_transformation_mode="half_pixel",
              mode="avg", output_height=1, output_width=1, sampling_ratio=0,
              spatial_scale=1.0):
    """ONNX RoiAlign: each region of interest (x1, y1, x2, y2, scaled by ``spatial_scale``)
    cut into output_height x output_width bins, each the average (or, as ONNX defines "max",
    the largest weighted corner) of bilinear samples on a regular grid (``sampling_ratio`` per
    axis, or ceil(bin size) when 0)."""
    n, c, h, w = X.shape
    r = rois.shape[0]
    idx = np.asarray(batch_indices).reshape(-1)
    if idx.shape != (r,) or (r and (idx.min() < 0 or idx.max() >= n)):
        raise ShapeError(f"RoiAlign batch_indices {idx.tolist()} must hold {r} indices below {n}")
    half = coordinate_transformation_mode == "half_pixel"
    shift = 0.5 if half else 0.0
    out = np.empty((r, c, output_height, output_width), X.dtype)
    for i in range(r):
        x1, y1, x2, y2 = (float(v) * spatial_scale - shift for v in rois[i])
        rh, rw = y2 - y1, x2 - x1
        if not half:
            rh, rw = max(rh, 1.0), max(rw, 1.0)
        gh = sampling_ratio if sampling_ratio > 0 else int(np.ceil(rh / output_height))
        gw = sampling_ratio if sampling_ratio > 0 else int(np.ceil(rw / output_width))
        ylo, yhi, ywl, ywh, ynear = _roi_samples(y1, rh, output_height, gh, h)
        xlo, xhi, xwl, xwh, xnear = _roi_samples(x1, rw, output_width, gw, w)
        data = X[int(idx[i])].astype(np.float64)
        if mode == "avg":
            # separable: Y = Ay @ data @ Ax^T with each sample's two weights per axis
            ay = np.zeros((output_height, h))
            ax = np.zeros((output_width, w))
            rows = np.arange(output_height)[:, None]
            cols = np.arange(output_width)[:, None]
            np.add.at(ay, (rows, ylo), ywl * ynear)
            np.add.at(ay, (rows, yhi), ywh * ynear)
            np.add.at(ax, (cols, xlo), xwl * xnear)
            np.add.at(ax, (cols, xhi), xwh * xnear)
            count = max(gh * gw, 1)
            out[i] = (ay @ data @ ax.T / count).astype(X.dtype)
            continue
        # max: per sample, the largest of its four weighted corners; then over the bin
        near = ynear[:, :, None, None] & xnear[None, None]  # (oh, gh, ow, gw)
        best = None
        for yi, wy in ((ylo, ywl), (yhi, ywh)):
            for xi, wx in ((xlo, xwl), (xhi, xwh)):
                weight = np.where(near, wy[:, :, None, None] * wx[None, None], 0.0)
                v = data[:, yi[:, :, None, None], xi[None, None]] * weight
                best = v if best is None else np.maximum(best, v)
        if gh * gw == 0:
            out[i] = 0
        else:
            out[i] = best.max(axis=(2, 4)).astype(X.dtype)
    return out


# MaxPool's Indices output ------------------------------------------------------------------------

def _max_pool_indices_shape(specs, **attrs):
    y = _pool_shape(specs, **attrs)
    return [y, TensorSpec(y.shape, DType.I64)]


@onnx_adapter("MaxPool")
def _max_pool_with_indices(node: ImportNode) -> None:
    """A MaxPool whose second output (Indices) is used becomes MaxPoolWithIndices; the plain
    MaxPool (and its faster backend kernels) stays single-output."""
    if len(node.outputs) < 2 or not node.outputs[1]:
        return
    node.need(1)
    attrs = {k: tuple(v) if isinstance(v, list) else v for k, v in node.attrs.items()}
    node.emit("MaxPoolWithIndices", node.inputs[:1], attrs, names=node.outputs[:2])
    node.replaced = True


@defop("MaxPoolWithIndices", shape=_max_pool_indices_shape, outputs=("Y", "Indices"),
       domain="onemodel")
def max_pool_with_indices(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None,
                          kernel_shape=(), pads=None, storage_order=0, strides=None):
    """ONNX MaxPool with its Indices output: each window's maximum and the flat index of its
    first occurrence in X (N, C and the spatial axes, row-major, or column-major over the
    spatial axes when ``storage_order`` is 1; padding is never an index)."""
    k, s, pb, pe, d, out_sp, _ = _pool_setup(X, kernel_shape, strides, pads, dilations, auto_pad,
                                             ceil_mode)
    sp = X.shape[2:]
    nd = len(sp)
    lowest = -np.inf if X.dtype.kind == "f" else np.iinfo(X.dtype).min
    xp = _pad_spatial(X, pb, pe, lowest)
    best = np.full(X.shape[:2] + tuple(out_sp), lowest, X.dtype)
    where = np.full(best.shape, -1, np.int64)
    # spatial strides of the flat index: row-major, or column-major (storage_order 1)
    order = range(nd) if storage_order else reversed(range(nd))
    step, acc = [0] * nd, 1
    for i in order:
        step[i], acc = acc, acc * sp[i]
    for kidx, sl in _positions(k, s, d, out_sp):
        window = xp[(slice(None), slice(None), *sl)]
        flat = np.zeros(out_sp, np.int64)
        valid = np.ones(out_sp, bool)
        for i in range(nd):
            shape = [1] * nd
            shape[i] = out_sp[i]
            coord = (np.arange(out_sp[i]) * s[i] - pb[i] + kidx[i] * d[i]).reshape(shape)
            valid = valid & (coord >= 0) & (coord < sp[i])
            flat = flat + coord * step[i]
        take = valid & ((window > best) | (where < 0))
        best = np.where(take, window, best)
        where = np.where(take, flat, where)
    plane = math.prod(sp)
    channel = np.arange(X.shape[0] * X.shape[1], dtype=np.int64).reshape(
        X.shape[:2] + (1,) * nd) * plane
    return best, np.where(where < 0, -1, where + channel)


@onnx_adapter("GroupNormalization", before=21)
def _group_norm_per_group_parameters(node: ImportNode) -> None:
    """Opset 18: ``scale`` and ``bias`` held one value per group; opset 21 one per channel.
    Each is repeated C / num_groups times (C read from X's shape at plan time)."""
    node.need(3)
    groups = node.attrs.get("num_groups")
    if not groups:
        raise node.error("GroupNormalization needs its num_groups attribute")
    x = node.inputs[0]
    (channels,) = node.emit("Shape", [x], {"start": 1, "end": 2})
    (per_group,) = node.emit("Div", [channels, node.const([groups])])
    (target,) = node.emit("Concat", [node.const([groups]), per_group], {"axis": 0})
    repeated = []
    for name in node.inputs[1:3]:
        (column,) = node.emit("Unsqueeze", [name, node.const([1])])
        (grid,) = node.emit("Expand", [column, target])
        (flat,) = node.emit("Reshape", [grid, node.const([-1])])
        repeated.append(flat)
    node.inputs = [x, *repeated]
