"""Neural-network functions on Tensors, named and parameterized as in ``torch.nn.functional``.

Each is built from ops of the op set, so it is differentiable and traceable."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

import numpy as np

from . import trace_state
from .autograd import is_grad_enabled
from .dtype import DType
from .errors import OneModelError, ShapeError
from .generator import Generator, default_generator
from .resampling import (  # noqa: F401 - torch.nn.functional names
    affine_grid,
    grid_sample,
    interpolate,
    upsample,
    upsample_bilinear,
    upsample_nearest,
)
from .symbolic import SymInt
from .tensor import Tensor, _call, _const, concat, where
from .torch_names import accept_torch_names


def _tuple(v, n: int) -> tuple[int, ...]:
    if isinstance(v, (tuple, list)):
        if len(v) != n:
            raise ShapeError(f"expected {n} values, got {list(v)}")
        return tuple(int(x) for x in v)
    return (int(v),) * n


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` with weight shaped (out, in)."""
    if x.ndim == 2:
        return _call("Gemm", x, weight, bias, transB=1)
    y = x @ weight.mT
    return y + bias if bias is not None else y


def _conv(x, weight, bias, stride, padding, dilation, groups, nd):
    if isinstance(padding, str):
        if padding == "valid":
            pads = (0,) * (2 * nd)
        elif padding == "same":
            d = _tuple(dilation, nd)
            k = weight.shape[2:]
            total = [d[i] * (k[i] - 1) for i in range(nd)]
            pads = tuple(t // 2 for t in total) + tuple(t - t // 2 for t in total)
        else:
            raise OneModelError(f"padding must be an int, a tuple, 'same' or 'valid', not {padding!r}")
    else:
        p = _tuple(padding, nd)
        pads = p + p
    return _call("Conv", x, weight, bias, strides=_tuple(stride, nd), pads=pads,
                 dilations=_tuple(dilation, nd), group=int(groups))


def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> Tensor:
    return _conv(x, weight, bias, stride, padding, dilation, groups, 1)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> Tensor:
    return _conv(x, weight, bias, stride, padding, dilation, groups, 2)


def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1) -> Tensor:
    """Weight shaped (in, out / groups, kH, kW), as in PyTorch."""
    p = _tuple(padding, 2)
    return _call("ConvTranspose", x, weight, bias, strides=_tuple(stride, 2), pads=p + p,
                 output_padding=_tuple(output_padding, 2), group=int(groups),
                 dilations=_tuple(dilation, 2))


def conv_transpose1d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1) -> Tensor:
    """Weight shaped (in, out / groups, kL), as in PyTorch."""
    p = _tuple(padding, 1)
    return _call("ConvTranspose", x, weight, bias, strides=_tuple(stride, 1), pads=p + p,
                 output_padding=_tuple(output_padding, 1), group=int(groups),
                 dilations=_tuple(dilation, 1))


def max_pool1d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False) -> Tensor:
    p = _tuple(padding, 1)
    return _call("MaxPool", x, kernel_shape=_tuple(kernel_size, 1),
                 strides=_tuple(stride or kernel_size, 1), pads=p + p,
                 dilations=_tuple(dilation, 1), ceil_mode=int(ceil_mode))


def avg_pool1d(x, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True) -> Tensor:
    p = _tuple(padding, 1)
    return _call("AveragePool", x, kernel_shape=_tuple(kernel_size, 1),
                 strides=_tuple(stride or kernel_size, 1), pads=p + p, ceil_mode=int(ceil_mode),
                 count_include_pad=int(count_include_pad))


def adaptive_avg_pool1d(x: Tensor, output_size) -> Tensor:
    """PyTorch's adaptive average pooling over the last axis: window i spans
    [floor(i*L/o), ceil((i+1)*L/o))."""
    if x.ndim not in (2, 3):
        raise ShapeError(f"adaptive_avg_pool1d takes (N, C, L) or (C, L), got shape "
                         f"{list(x.shape)}")
    if x.ndim == 2:
        return adaptive_avg_pool1d(x.unsqueeze(0), output_size).squeeze(0)
    length = x.shape[-1]
    (o,) = _tuple(output_size, 1)
    if isinstance(length, SymInt) and o != 1:
        trace_state.refuse("adaptive_avg_pool1d over a symbolic length",
                           "its windows depend on the length, so the graph would hold the "
                           "example's windows", "trace with a fixed length, or use "
                           "output_size=1 (global average pooling)")
    if o == 1:
        return x.mean(axis=-1, keepdims=True)
    if length % o == 0:
        k = length // o
        return _call("AveragePool", x, kernel_shape=(k,), strides=(k,))
    parts = [x[..., (i * length) // o : -((-(i + 1) * length) // o)].mean(axis=-1, keepdims=True)
             for i in range(o)]
    return concat(parts, axis=-1)


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False) -> Tensor:
    k = _tuple(kernel_size, 2)
    p = _tuple(padding, 2)
    return _call("MaxPool", x, kernel_shape=k, strides=_tuple(stride or kernel_size, 2),
                 pads=p + p, dilations=_tuple(dilation, 2), ceil_mode=int(ceil_mode))


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True) -> Tensor:
    k = _tuple(kernel_size, 2)
    p = _tuple(padding, 2)
    return _call("AveragePool", x, kernel_shape=k, strides=_tuple(stride or kernel_size, 2),
                 pads=p + p, ceil_mode=int(ceil_mode), count_include_pad=int(count_include_pad))


def adaptive_avg_pool2d(x: Tensor, output_size) -> Tensor:
    """PyTorch's adaptive average pooling: window i spans [floor(i*H/o), ceil((i+1)*H/o))."""
    h, w = x.shape[-2:]
    if output_size is None:
        output_size = (h, w)
    elif not isinstance(output_size, (tuple, list)):
        output_size = (output_size, output_size)
    if len(output_size) != 2:
        raise ShapeError(f"adaptive_avg_pool2d: output_size has 2 values, got {output_size}")
    # None keeps that axis' size, as in PyTorch
    if all(o == 1 for o in output_size):
        return _call("GlobalAveragePool", x)
    if any(isinstance(d, SymInt) for d in (h, w)):
        # window bounds are floor/ceil of i * size / out: they depend on the size itself
        trace_state.refuse("adaptive_avg_pool2d over symbolic height or width",
                           "its windows depend on the input size, so the graph would hold the "
                           "example's windows", "trace with fixed spatial axes, or use "
                           "output_size=1 (global average pooling)")
    oh, ow = (int(d if o is None else o) for o, d in zip(output_size, (h, w)))
    if h % oh == 0 and w % ow == 0:
        kh, kw = h // oh, w // ow
        return _call("AveragePool", x, kernel_shape=(kh, kw), strides=(kh, kw))
    rows = []
    for i in range(oh):
        r0, r1 = (i * h) // oh, -((-(i + 1) * h) // oh)
        cols = []
        for j in range(ow):
            c0, c1 = (j * w) // ow, -((-(j + 1) * w) // ow)
            cols.append(x[..., r0:r1, c0:c1].mean(axis=(-2, -1), keepdims=True))
        rows.append(concat(cols, axis=-1))
    return concat(rows, axis=-2)


def batch_norm(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
               weight: Tensor | None = None, bias: Tensor | None = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Batch normalization over axis 1. In training mode, normalizes with batch statistics and
    updates the running statistics in place (PyTorch's momentum convention)."""
    c = x.shape[1]
    if weight is None:
        weight = Tensor._wrap(np.ones(c, x._data.dtype))
    if bias is None:
        bias = Tensor._wrap(np.zeros(c, x._data.dtype))
    if not training:
        if running_mean is None or running_var is None:
            raise OneModelError("batch_norm in eval mode needs running_mean and running_var")
        return _call("BatchNormalization", x, weight, bias, running_mean, running_var,
                     epsilon=float(eps))
    if trace_state.is_traced(x):
        trace_state.refuse("batch_norm in training mode",
                           "it updates running statistics from batch data",
                           "trace in eval mode (Module.trace does this)")
    axes = (0, *range(2, x.ndim))
    shape = (1, c) + (1,) * (x.ndim - 2)
    mean = x.mean(axis=axes, keepdims=True)
    xc = x - mean
    var = (xc * xc).mean(axis=axes, keepdims=True)
    y = xc * (var + eps) ** -0.5 * weight.reshape(*shape) + bias.reshape(*shape)
    if running_mean is not None and running_var is not None:
        n = x.numel() // c
        m = x._data.dtype.type(momentum)
        running_mean._data *= 1 - m
        running_mean._data += m * mean._data.reshape(c)
        running_var._data *= 1 - m
        running_var._data += m * var._data.reshape(c) * (n / max(n - 1, 1))
    return y


def layer_norm(x: Tensor, normalized_shape, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    shape = _normalized(normalized_shape)
    if tuple(x.shape[-len(shape):]) != shape:
        raise ShapeError(f"layer_norm: input shape {list(x.shape)} does not end with {list(shape)}")
    if weight is None:
        weight = Tensor._wrap(np.ones(shape, x._data.dtype))
    return _call("LayerNormalization", x, weight, bias, axis=-len(shape), epsilon=float(eps))[0]


def _normalized(shape) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, int) else tuple(int(s) for s in shape)


def group_norm(x: Tensor, num_groups: int, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    n, c = x.shape[:2]
    if c % num_groups:
        raise ShapeError(f"group_norm: {c} channels do not split into {num_groups} groups")
    grouped = x.reshape(n, num_groups, -1)
    mean = grouped.mean(axis=-1, keepdims=True)
    xc = grouped - mean
    var = (xc * xc).mean(axis=-1, keepdims=True)
    y = (xc * (var + eps) ** -0.5).reshape(*x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * weight.reshape(*shape)
    if bias is not None:
        y = y + bias.reshape(*shape)
    return y


def dropout(x: Tensor, p: float = 0.5, training: bool = True,
            generator: Generator | None = None) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by 1/(1-p) in training."""
    if not 0 <= p <= 1:
        raise OneModelError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0:
        return x
    if trace_state.is_traced(x):
        trace_state.refuse("dropout in training mode", "random masks have no graph form",
                           "trace in eval mode (Module.trace does this) or pass training=False")
    if p == 1:
        return x * 0
    keep = (generator or default_generator()).bernoulli(x.shape, 1 - p)
    mask = Tensor._wrap((keep / (1 - p)).astype(x._data.dtype))
    return x * mask


def embedding(indices: Tensor, weight: Tensor, padding_idx: int | None = None) -> Tensor:
    """Rows of ``weight`` at ``indices``; the row at ``padding_idx`` gets no gradient."""
    if not isinstance(indices, Tensor):
        indices = Tensor(np.asarray(indices, np.int64))
    if indices.dtype not in (DType.I64, DType.I32):
        raise OneModelError(f"embedding indices must be integers, got {indices.dtype.name}")
    out = _call("Gather", weight, indices.cast(DType.I64), axis=0)
    if padding_idx is not None and weight.requires_grad and is_grad_enabled():
        keep = (indices != padding_idx).unsqueeze(-1)
        out = where(keep, out, out.detach())
    return out


def pad(x: Tensor, pad: Sequence[int], mode: str = "constant", value: float = 0.0) -> Tensor:
    """PyTorch's pad: ``pad`` lists (before, after) pairs from the last axis backwards."""
    if len(pad) % 2:
        raise OneModelError("pad needs an even number of values: (before, after) per axis")
    n = len(pad) // 2
    if n > x.ndim:
        raise ShapeError(f"pad gives {n} axes but the input has rank {x.ndim}")
    begins = [0] * x.ndim
    ends = [0] * x.ndim
    for i in range(n):
        begins[x.ndim - 1 - i] = int(pad[2 * i])
        ends[x.ndim - 1 - i] = int(pad[2 * i + 1])
    onnx_mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge",
                 "circular": "wrap"}.get(mode)
    if onnx_mode is None:
        raise OneModelError(f"pad mode must be constant, reflect, replicate or circular, not {mode!r}")
    value_t = Tensor._wrap(np.asarray(value, x._data.dtype)) if mode == "constant" else None
    return _call("Pad", x, _const(begins + ends), value_t, mode=onnx_mode)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 generator: Generator | None = None) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v. A BOOL mask marks the positions that may attend."""
    s = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = (query @ key.mT) * s
    if is_causal:
        scores = where(causal_mask(scores), scores, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype is DType.BOOL:
            scores = where(attn_mask, scores, float("-inf"))
        else:
            scores = scores + attn_mask
    weights = scores.softmax(-1)
    if dropout_p > 0:
        weights = dropout(weights, dropout_p, True, generator)
    return weights @ value


def causal_mask(scores: Tensor) -> Tensor:
    """BOOL mask, True on and below the diagonal of the last two axes of ``scores``: built
    with ops (Expand, Trilu) from the scores' shape, so it follows symbolic lengths in a trace."""
    dims = scores.shape[-2:]
    ones = Tensor._wrap(np.ones((), scores._data.dtype)).expand(*dims)
    return _call("Trilu", ones, upper=0) > 0.5


def one_hot(indices: Tensor, num_classes: int = -1) -> Tensor:
    """I64 one-hot encoding along a new last axis."""
    if num_classes < 0:
        num_classes = int(indices._data.max()) + 1
    values = Tensor._wrap(np.asarray([0, 1], np.int64))
    return _call("OneHot", indices.cast(DType.I64), _const([num_classes]), values, axis=-1)


def relu(x: Tensor) -> Tensor:
    return x.relu()


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    return x.gelu(approximate)


def sigmoid(x: Tensor) -> Tensor:
    return x.sigmoid()


def tanh(x: Tensor) -> Tensor:
    return x.tanh()


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    return x.softmax(dim)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    return x.log_softmax(dim)


# activations built from differentiable ops (so they train and trace; see docs/pytorch-names.md)

def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    return where(x > 0, x, x * negative_slope)


def silu(x: Tensor) -> Tensor:
    """x * sigmoid(x) (also called swish)."""
    return x * x.sigmoid()


def elu(x: Tensor, alpha: float = 1.0) -> Tensor:
    """x for x > 0, alpha * (exp(x) - 1) otherwise; exp sees min(x, 0) so it cannot overflow."""
    neg = where(x > 0, x * 0, x)
    return where(x > 0, x, (neg.exp() - 1) * alpha)


def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta x)) / beta; linear where beta x > threshold, as in PyTorch. exp only
    sees values up to the threshold, so neither it nor its gradient overflows."""
    z = x * beta if beta != 1 else x
    above = z > threshold
    soft = (where(above, z * 0, z).exp() + 1).log()
    soft = soft / beta if beta != 1 else soft
    return where(z > threshold, x, soft)


def mish(x: Tensor) -> Tensor:
    """x * tanh(softplus(x))."""
    return x * softplus(x).tanh()


def hardsigmoid(x: Tensor) -> Tensor:
    """clip(x / 6 + 1/2, 0, 1) (PyTorch's slope; ONNX's HardSigmoid defaults to 0.2)."""
    return (x / 6 + 0.5).clip(0, 1)


def hardswish(x: Tensor) -> Tensor:
    """x * hardsigmoid(x)."""
    return x * hardsigmoid(x)


def prelu(x: Tensor, weight: Tensor) -> Tensor:
    """leaky_relu with a learned slope per channel (axis 1), or one shared slope."""
    n = weight.numel()
    if n != 1:
        if x.ndim < 2 or x.shape[1] != n:
            raise ShapeError(f"prelu: {n} slopes need {n} channels on axis 1, got input shape "
                             f"{list(x.shape)}")
        weight = weight.reshape(1, n, *([1] * (x.ndim - 2)))
    return where(x >= 0, x, x * weight)


def normalize(x: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """x divided by its p-norm along ``dim``, the norm clamped below at ``eps``."""
    return x / x.norm(p, dim, keepdims=True).clamp(min=eps)


accept_torch_names(sys.modules[__name__])  # dim= and axis=, keepdim= and keepdims= (one place)
