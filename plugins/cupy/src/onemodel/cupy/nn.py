"""Neural-network kernels against the array namespace of their inputs: convolution (im2col and
one batched GEMM over the groups, cuBLAS on the GPU), pooling over the kernel window's
positions, batch and layer normalization, softmax, and the fused Conv/Gemm + activation nodes
the runtime's passes make.

The window geometry (auto_pad, ceil_mode, dilations) is the reference's own pure-Python code
(``onemodel.tensors.ops.nn._geometry`` and ``_pool_setup``), so both agree by construction.
"""

from __future__ import annotations

import math

import numpy as np

from onemodel.tensors.errors import ShapeError
from onemodel.tensors.ops.nn import _geometry, _pool_setup, _positions

from ._xp import namespace, scalar
from .kernels import erf, gemm, sigmoid

# padding and windows ----------------------------------------------------------------------------


def _pad_spatial(xp, x, pb, pe, value=0.0):
    if not any(pb) and not any(pe):
        return x
    widths = [(0, 0), (0, 0)] + list(zip(pb, pe))
    return xp.pad(x, widths, mode="constant", constant_values=value)


def _window_sum(xp, padded, k, s, d, out_sp):
    out = None
    for _, sl in _positions(k, s, d, out_sp):
        window = padded[(slice(None), slice(None), *sl)]
        out = window.astype(padded.dtype, copy=True) if out is None else xp.add(out, window,
                                                                                 out=out)
    return out


# convolution ----------------------------------------------------------------------------------

def conv(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
         pads=None, strides=None):
    """ONNX Conv: channels-last columns (N * L, K * C) of the padded input, one batched matmul
    over the groups (a single GEMM when ``group`` is 1)."""
    xp = namespace(X, W)
    nd = X.ndim - 2
    k = tuple(kernel_shape) if kernel_shape else tuple(W.shape[2:])
    s, pb, pe, d, out_sp, _ = _geometry(X.shape[2:], k, strides, pads, dilations, auto_pad)
    n, c, m = X.shape[0], X.shape[1], W.shape[0]
    if c != W.shape[1] * group or m % group:
        raise ValueError(f"input has {c} channels and W {tuple(W.shape)}, group {group}")
    cg, mg = c // group, m // group
    kk, ll = math.prod(k), math.prod(out_sp)
    # (N, *padded, C), then one strided copy per kernel position into (N, *out, *k, C)
    xl = xp.moveaxis(X, 1, -1)
    if any(pb) or any(pe):
        xl = xp.pad(xl, [(0, 0), *zip(pb, pe), (0, 0)])
    cols = xp.empty((n, *out_sp, *k, c), X.dtype)
    lead = (slice(None),) * (1 + nd)
    for kidx, sl in _positions(k, s, d, out_sp):
        cols[lead + kidx] = xl[(slice(None), *sl)]
    # W (M, Cg, *k) -> (G, K * Cg, Mg) in the columns' (k, c) order
    w = xp.moveaxis(W.reshape(group, mg, cg, *k), 2, -1).reshape(group, mg, kk * cg)
    w = xp.ascontiguousarray(w.transpose(0, 2, 1))  # a strided batch is no BLAS call
    if group == 1:
        y = xp.matmul(cols.reshape(n * ll, kk * c), w[0])  # (N * L, M)
    else:
        cg_cols = cols.reshape(n * ll, kk, group, cg).transpose(2, 0, 1, 3)
        y = xp.matmul(cg_cols.reshape(group, n * ll, kk * cg), w)  # (G, N * L, Mg)
        y = y.transpose(1, 0, 2).reshape(n * ll, m)
    if B is not None:
        y += B
    return xp.ascontiguousarray(xp.moveaxis(y.reshape(n, *out_sp, m), -1, 1))


def _activate(xp, y, activation):
    if activation == "":  # a residual FusedConv without an activation after its Add
        return y
    if activation == "Relu":
        return xp.maximum(y, scalar(0, y.dtype), out=y)
    if activation == "Tanh":
        return xp.tanh(y, out=y)
    if activation == "Sigmoid":
        return sigmoid(y)
    if activation == "Relu6":  # Clip to 0 and 6, as this plugin's Clip (NaN propagates)
        xp.maximum(y, scalar(0, y.dtype), out=y)
        return xp.minimum(y, scalar(6, y.dtype), out=y)
    if activation == "HardSwish":  # the formula of the HardSwish op
        gate = xp.clip(y / scalar(6, y.dtype) + scalar(0.5, y.dtype), scalar(0, y.dtype),
                       scalar(1, y.dtype))
        return xp.multiply(y, gate, out=y)
    if activation == "Silu":  # the Sigmoid and the Mul it was fused from
        return xp.multiply(y, sigmoid(y), out=y)
    raise ShapeError(f"unknown fused activation {activation!r}; expected Relu, Sigmoid, Tanh, "
                     "HardSwish, Relu6 or Silu")


def fused_conv(X, W, B=None, Z=None, *, activation="Relu", auto_pad="NOTSET", dilations=None,
               group=1, kernel_shape=None, pads=None, strides=None):
    """Conv, plus the residual ``Z`` when given, followed by ``activation`` (one of
    onemodel.tensors' fused ACTIVATIONS, or "") on its output, in place."""
    y = conv(X, W, B, auto_pad=auto_pad, dilations=dilations, group=group,
             kernel_shape=kernel_shape, pads=pads, strides=strides)
    if Z is not None:
        y = y + Z
    return _activate(namespace(y), y, activation)


def fused_gemm(A, B, C=None, *, activation="Relu", alpha=1.0, beta=1.0, transA=0, transB=0):
    """Gemm followed by ``activation`` (one of onemodel.tensors' fused ACTIVATIONS)."""
    y = gemm(A, B, C, alpha=alpha, beta=beta, transA=transA, transB=transB)
    return _activate(namespace(y), y, activation)


def fused_matmul(A, B, C=None, *, activation=""):
    """MatMul (cuBLAS), plus the bias row ``C``, then ``activation`` (one of onemodel.tensors'
    fused ACTIVATIONS, "Gelu" as the reference writes it, or "")."""
    xp = namespace(A, B)
    y = xp.matmul(A, B)
    if C is not None:
        y = y + C
    if activation == "Gelu":  # (y * (erf(y / sqrt 2) + 1)) * 0.5, the reference's order
        g = erf(y / scalar(math.sqrt(2), y.dtype)) + scalar(1, y.dtype)
        return (y * g) * scalar(0.5, y.dtype)
    return _activate(xp, y, activation)


# pooling --------------------------------------------------------------------------------------

def max_pool(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=(), pads=None,
             storage_order=0, strides=None):
    """ONNX MaxPool: the maximum of one strided view per kernel position (padding never wins)."""
    xp = namespace(X)
    k, s, pb, pe, d, out_sp, _ = _pool_setup(X, kernel_shape, strides, pads, dilations, auto_pad,
                                             ceil_mode)
    lowest = -np.inf if X.dtype.kind == "f" else np.iinfo(X.dtype).min
    padded = _pad_spatial(xp, X, pb, pe, lowest)
    out = None
    for _, sl in _positions(k, s, d, out_sp):
        window = padded[(slice(None), slice(None), *sl)]
        out = window.copy() if out is None else xp.maximum(out, window, out=out)
    return out


def _avg_counts(xp, X, k, s, pb, pe, pe_explicit, d, out_sp, count_include_pad):
    ones = xp.ones((1, 1, *X.shape[2:]), X.dtype)
    if count_include_pad:
        ones = _pad_spatial(xp, ones, pb, pe_explicit, 1.0)
        ones = _pad_spatial(xp, ones, (0,) * len(k), tuple(a - b for a, b in zip(pe, pe_explicit)))
    else:
        ones = _pad_spatial(xp, ones, pb, pe)
    return _window_sum(xp, ones, k, s, d, out_sp)


def average_pool(X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=(), pads=None, strides=None):
    """ONNX AveragePool: window sums over the kernel positions divided by the counts of the
    elements each window covers (with or without the explicit padding)."""
    xp = namespace(X)
    k, s, pb, pe, d, out_sp, pe_explicit = _pool_setup(X, kernel_shape, strides, pads, dilations,
                                                       auto_pad, ceil_mode)
    total = _window_sum(xp, _pad_spatial(xp, X, pb, pe), k, s, d, out_sp)
    counts = _avg_counts(xp, X, k, s, pb, pe, pe_explicit, d, out_sp, count_include_pad)
    return (total / counts).astype(X.dtype, copy=False)


def global_average_pool(X):
    return X.mean(axis=tuple(range(2, X.ndim)), keepdims=True).astype(X.dtype, copy=False)


def global_max_pool(X):
    return X.max(axis=tuple(range(2, X.ndim)), keepdims=True)


# normalization and softmax ----------------------------------------------------------------------

def batch_normalization(X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9,
                        training_mode=0):
    """Inference-mode batch normalization with running statistics."""
    if training_mode:
        raise ValueError("BatchNormalization with training_mode=1 is not supported")
    xp = namespace(X)
    shape = (1, -1) + (1,) * (X.ndim - 2)
    inv = (1.0 / xp.sqrt(input_var.astype(np.float64) + epsilon)).astype(X.dtype)
    factor = (scale * inv).reshape(shape)
    return (X - input_mean.reshape(shape)) * factor + B.reshape(shape)


def layer_normalization(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    """ONNX LayerNormalization (opset 17): the normalized output, the mean and the inverse
    standard deviation (float32 when ``stash_type`` is 1)."""
    xp = namespace(X)
    a = axis % X.ndim
    axes = tuple(range(a, X.ndim))
    stash = np.dtype(np.float32) if stash_type == 1 else X.dtype
    x = X.astype(stash, copy=False) if X.dtype == np.float16 else X
    mean = x.mean(axis=axes, keepdims=True)
    xc = x - mean
    var = (xc * xc).mean(axis=axes, keepdims=True)
    inv = 1 / xp.sqrt(var + scalar(epsilon, x.dtype))
    y = xc * inv * Scale
    if B is not None:
        y = y + B
    return (y.astype(X.dtype, copy=False), mean.astype(stash, copy=False),
            inv.astype(stash, copy=False))


def channel_layer_normalization(X, Scale, B=None, *, epsilon=1e-5):
    """ChannelLayerNormalization: LayerNormalization over the channels (axis 1) at each pixel,
    ConvNeXt's channels-first LayerNorm, as the reference computes it."""
    xp = namespace(X)
    shape = (1, -1) + (1,) * (X.ndim - 2)
    mean = X.mean(axis=1, keepdims=True)
    xc = X - mean
    var = (xc * xc).mean(axis=1, keepdims=True)
    y = xc * (1 / xp.sqrt(var + scalar(epsilon, X.dtype))) * Scale.reshape(shape)
    return y if B is None else y + B.reshape(shape)


def softmax(input, *, axis=-1):
    xp = namespace(input)
    if input.size == 0:
        return xp.empty_like(input)
    e = xp.exp(input - input.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(input, *, axis=-1):
    xp = namespace(input)
    if input.size == 0:
        return xp.empty_like(input)
    shifted = input - input.max(axis=axis, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))
