"""``supports`` checks of the numba kernels: cheap, numba-free, and true only for calls the
kernel computes exactly like the reference kernel. Planning calls them with zero-strided
stand-ins of the planned shapes, so they look at dtypes, ranks and attributes only, and at the
values of small integer constants the plan knows (a ReduceMean's axes)."""

from __future__ import annotations

import numpy as np

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_ACTIVATIONS = ("", "Relu", "Sigmoid", "Tanh", "HardSwish", "Relu6", "Silu")  # conv.ACT_CODES, numba-free


def _float(*arrays) -> bool:
    dt = arrays[0].dtype
    return dt in _FLOATS and all(a is None or a.dtype == dt for a in arrays)


def conv(X, W, B=None, Z=None, *, auto_pad="NOTSET", dilations=None, group=1,
         kernel_shape=None, pads=None, strides=None, activation=""):
    """1-D and 2-D convolutions of float32/float64 with matching weight, bias and residual
    (FusedConv's Z, of the input's rank) dtypes."""
    if X.ndim not in (3, 4) or W.ndim != X.ndim or not _float(X, W, B, Z) or (
            Z is not None and Z.ndim != X.ndim):
        return False
    if kernel_shape and tuple(kernel_shape) != tuple(W.shape[2:]):
        return False
    return activation in _ACTIVATIONS and X.shape[1] == W.shape[1] * group


def fused_gemm(A, B, C=None, *, activation="Relu", alpha=1.0, beta=1.0, transA=0, transB=0):
    """FusedGemm of float32/float64 2-D matrices with Relu, Sigmoid, Tanh, HardSwish, Relu6 or
    Silu, no scaling, and a bias row of the same dtype (or none)."""
    return A.ndim == 2 and B.ndim == 2 and _float(A, B, C) and alpha == 1.0 and beta == 1.0 \
        and activation in _ACTIVATIONS[1:] and (C is None or C.ndim == 1)


def fused_matmul(A, B, C=None, *, activation=""):
    """FusedMatMul of float32/float64 A of two or more axes by a 2-D B of the same dtype, a bias
    row (or none), an activation of FusedGemm's or Gelu, or none."""
    return A.ndim >= 2 and B.ndim == 2 and _float(A, B, C) and (C is None or C.ndim == 1) and \
        activation in (*_ACTIVATIONS, "Gelu")


def gemm(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    """Gemm of float32/float64 2-D matrices (and bias) of one dtype: the reference's own
    call, planned by constant weights where the plugin has a faster product."""
    return A.ndim == 2 and B.ndim == 2 and _float(A, B, C)


def _nchw(X) -> bool:
    return X.ndim == 4 and X.dtype in _FLOATS


def conv_transpose(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1,
                   kernel_shape=None, output_padding=None, output_shape=None, pads=None,
                   strides=None):
    """2-D ConvTranspose of float32/float64 with matching weight and bias dtypes."""
    return X.ndim == 4 and W.ndim == 4 and _float(X, W, B) and (B is None or B.ndim == 1)


def conv_grad(X, W, dY, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
              pads=None, strides=None):
    """Gradients of 2-D float convolutions (dY of the forward output's shape and dtype)."""
    return X.ndim == 4 and conv(X, W, None, kernel_shape=kernel_shape, group=group) and \
        dY.ndim == 4 and dY.dtype == X.dtype


def batch_norm(X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9,
               training_mode=0):
    return (X.ndim >= 2 and X.dtype in _FLOATS and not training_mode
            and all(p.ndim == 1 for p in (scale, B, input_mean, input_var)))


def layer_norm(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    return X.ndim >= 1 and _float(X, Scale, B) and -X.ndim <= axis < X.ndim


def rms_norm(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    return X.ndim >= 1 and _float(X, scale) and -X.ndim <= axis < X.ndim


def group_norm(X, scale, bias, *, epsilon=1e-5, num_groups=None, stash_type=1):
    """Instance and group normalization of float32/float64 with one scale and bias per
    channel (opset 21's GroupNormalization; InstanceNormalization takes the same check)."""
    return X.ndim >= 2 and _float(X, scale, bias) and scale.ndim == 1 and bias.ndim == 1 and \
        scale.shape[0] == X.shape[1] and bias.shape[0] == X.shape[1]


def lrn(X, *, alpha=1e-4, beta=0.75, bias=1.0, size=1):
    return X.ndim >= 3 and X.dtype in _FLOATS and size >= 1


def unary(X, *, approximate="none"):
    return X.dtype in _FLOATS and approximate == "none"


def relu_grad(Y, dY):
    """Relu's gradient: Y and dY float32, or both float64, of one shape."""
    return _float(Y, dY) and Y.shape == dY.shape


def cross_entropy(scores, labels, *rest, ignore_index=None, reduction="mean"):
    """SoftmaxCrossEntropyLoss (and its gradient) of (N, C) float32/float64 scores by (N,)
    integer labels; the kernels give other calls, and a label outside the classes, to the
    reference."""
    return scores.ndim == 2 and scores.dtype in _FLOATS and labels.ndim == 1 and \
        labels.dtype.kind == "i"


def same_float(*inputs, program=()):
    """Every input float32, or every input float64."""
    return bool(inputs) and _float(*inputs)


def pool(X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
         kernel_shape=(), pads=None, storage_order=0, strides=None):
    """2-D max and average pooling of float32/float64 (NCHW)."""
    return _nchw(X) and len(tuple(kernel_shape)) == 2


def pool_grad(X, dY, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
              kernel_shape=(), pads=None, storage_order=0, strides=None):
    """Gradients of 2-D max and average pooling: dY of X's float dtype, NCHW."""
    return _nchw(X) and dY.ndim == 4 and dY.dtype == X.dtype and len(tuple(kernel_shape)) == 2


def resize(X, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
           coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
           extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
           nearest_mode="round_prefer_floor"):
    """Resize of a 4-D float32/float64 tensor (the kernel hands what it does not cover, other
    axes and extrapolated positions, to the reference kernel)."""
    return _nchw(X)


def global_pool(X):
    """Global average pooling of float32/float64 with at least one spatial axis."""
    return X.ndim >= 3 and X.dtype in _FLOATS


def softmax(input, *, axis=-1):
    """Softmax/LogSoftmax of float32 over the last axis (or one followed only by size-1
    axes). float64 and other axes measured slower than the reference (docs/benchmarks.md)."""
    if input.dtype != np.float32 or input.ndim == 0 or not -input.ndim <= axis < input.ndim:
        return False
    return all(d == 1 for d in input.shape[axis % input.ndim + 1:])


def attention(Q, Kt, V, mask=None, *, scale=1.0, transpose_output=0):
    """FusedAttention of float32/float64 Q, Kt, V of one rank (2 to 4; 4 with
    ``transpose_output``) with the same leading axes (no broadcasting between them) and a mask
    of the same dtype and at most rank 4."""
    if not _float(Q, Kt, V, mask) or not 2 <= Q.ndim <= 4 or Kt.ndim != Q.ndim or \
            V.ndim != Q.ndim or (transpose_output and Q.ndim != 4):
        return False
    lead = Q.shape[:-2]
    return Kt.shape[:-2] == lead and V.shape[:-2] == lead and (mask is None or mask.ndim <= 4)


def channel_norm(X, Scale, B=None, *, epsilon=1e-5):
    """ChannelLayerNormalization of float32/float64 (one dtype) with one Scale (and B) value
    per channel."""
    return X.ndim >= 3 and _float(X, Scale, B) and Scale.shape == (X.shape[1],) and \
        (B is None or B.shape == (X.shape[1],))


def skip_norm(X, Skip, Scale, B=None, Bias=None, *, epsilon=1e-5):
    """SkipLayerNormalization of float32/float64 (one dtype) whose Scale, B and Bias are rows
    of X's last axis and whose Skip repeats whole rows: X's shape, or a trailing part of it
    (a bias row, positions). Other broadcasts go to the reference kernel."""
    if not _float(X, Skip, Scale, B, Bias) or X.ndim == 0 or Skip.ndim == 0:
        return False
    width = X.shape[-1]
    if any(p is not None and p.shape != (width,) for p in (Scale, B, Bias)):
        return False
    skip = Skip.shape
    while len(skip) > 1 and skip[0] == 1:
        skip = skip[1:]
    return len(skip) <= X.ndim and skip == X.shape[X.ndim - len(skip):]


def trailing_axes(data, axes=None, noop_with_empty_axes=0):
    """The first reduced axis when ``axes`` (ReduceMean's input, or None for every axis) are a
    non-empty block of trailing axes with elements in them, else None."""
    if data.ndim == 0:
        return None
    if axes is None or np.size(axes) == 0:
        if noop_with_empty_axes:
            return None
        wanted = set(range(data.ndim))
    else:
        flat = np.asarray(axes).reshape(-1)
        if flat.dtype.kind not in "iu" or any(not -data.ndim <= int(a) < data.ndim for a in flat):
            return None
        wanted = {int(a) % data.ndim for a in flat}
        if len(wanted) != flat.size:
            return None  # repeated axes: the reference kernel names the problem
    first = min(wanted)
    if wanted != set(range(first, data.ndim)) or 0 in data.shape[first:]:
        return None
    return first


def reduce_mean(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    """ReduceMean of float32/float64 over a block of trailing axes, none of them empty (a
    global average written as ``mean``); others go to the reference."""
    return data.dtype in _FLOATS and trailing_axes(data, axes, noop_with_empty_axes) is not None


def _recurrent(X, W, R, extra, sequence_lens, activations, clip, direction, layout) -> bool:
    return X.ndim == 3 and W.ndim == 3 and R.ndim == 3 and _float(X, W, R, *extra) and \
        sequence_lens is None and activations is None and clip is None and \
        direction in ("forward", "reverse", "bidirectional") and layout in (0, 1)


def lstm(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
         activation_alpha=None, activation_beta=None, activations=None, clip=None,
         direction="forward", hidden_size=None, input_forget=0, layout=0):
    """LSTM of float32/float64 (one dtype throughout) with the default activations, no clip
    and every sequence at full length (no ``sequence_lens``)."""
    return _recurrent(X, W, R, (B, initial_h, initial_c, P), sequence_lens, activations, clip,
                      direction, layout)


def gru(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward",
        hidden_size=None, layout=0, linear_before_reset=0):
    """GRU under the conditions of :func:`lstm`, either ``linear_before_reset``."""
    return _recurrent(X, W, R, (B, initial_h), sequence_lens, activations, clip, direction,
                      layout)
