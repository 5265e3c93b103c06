"""MultiheadAttention and the transformer layers (TransformerEncoderLayer, TransformerEncoder,
TransformerDecoderLayer, TransformerDecoder), with PyTorch's parameters, names and masks."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

from onemodel.tensors import DType, Generator, OneModelError, Tensor, trace_state, where
from onemodel.tensors import functional as F
from onemodel.tensors.dispatch import dispatch

from .. import init
from ..module import Module
from .activation import Dropout
from .container import ModuleList
from .linear import Linear
from .normalization import LayerNorm


class MultiheadAttention(Module):
    """``torch.nn.MultiheadAttention``: inputs (L, N, E), or (N, L, E) with ``batch_first``.

    Boolean masks mark positions that may **not** attend (PyTorch's convention); float masks are
    added to the attention scores."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = False, *, generator: Generator | None = None):
        super().__init__()
        if embed_dim % num_heads:
            raise OneModelError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, dropout
        self.batch_first, self.head_dim = batch_first, embed_dim // num_heads
        self.generator = generator
        self.in_proj_weight = init.xavier_uniform((3 * embed_dim, embed_dim), generator)
        self.in_proj_bias = init.zeros((3 * embed_dim,)) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, generator, bias=bias)
        if bias:
            self.out_proj.bias._data[...] = 0

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                key_padding_mask: Tensor | None = None, need_weights: bool = True,
                attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False):
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        n, length, e = query.shape
        source = key.shape[1]
        h, d = self.num_heads, self.head_dim
        w, b = self.in_proj_weight, self.in_proj_bias
        q = F.linear(query, w[:e], None if b is None else b[:e])
        k = F.linear(key, w[e : 2 * e], None if b is None else b[e : 2 * e])
        v = F.linear(value, w[2 * e :], None if b is None else b[2 * e :])
        q = _reshape(q, n, length, h, d).transpose(1, 2)
        k = _reshape(k, n, source, h, d).transpose(1, 2)
        v = _reshape(v, n, source, h, d).transpose(1, 2)
        scores = (q @ k.mT) * (1.0 / math.sqrt(d))
        if is_causal and attn_mask is None:
            attn_mask = ~F.causal_mask(scores)  # True marks what may not attend
        if attn_mask is not None:
            scores = _apply_mask(scores, attn_mask)
        if key_padding_mask is not None:
            scores = _apply_mask(scores, key_padding_mask.reshape(n, 1, 1, source))
        weights = scores.softmax(-1)
        if self.training and self.dropout > 0:
            weights = F.dropout(weights, self.dropout, True, self.generator)
        out = _reshape((weights @ v).transpose(1, 2), n, length, e)
        out = self.out_proj(out)
        if not self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        return out, (weights.mean(axis=1) if average_attn_weights else weights)

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}"


def _reshape(x: Tensor, *dims) -> Tensor:
    """Reshape to ``dims`` as given: the head count and width are the layer's own constants, so
    the tracer must not take one for a symbolic axis whose example size happens to be equal (a
    sequence of 4 with 4 heads), as it would a user's plain int."""
    return dispatch("Reshape", (x, trace_state.shape_operand(dims, of=x, sizes=False)))


def _apply_mask(scores: Tensor, mask: Tensor) -> Tensor:
    if mask.dtype is DType.BOOL:
        return where(mask, float("-inf"), scores)
    return scores + mask


class TransformerEncoderLayer(Module):
    """``torch.nn.TransformerEncoderLayer``: self-attention and a feed-forward block, each with
    a residual connection and LayerNorm (after, or before with ``norm_first``)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation: str = "relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True, *,
                 generator: Generator | None = None):
        super().__init__()
        _check_activation(activation)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout, bias, batch_first,
                                            generator=generator)
        self.linear1 = Linear(d_model, dim_feedforward, generator, bias=bias)
        self.dropout = Dropout(dropout, generator)
        self.linear2 = Linear(dim_feedforward, d_model, generator, bias=bias)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout, generator)
        self.dropout2 = Dropout(dropout, generator)
        self.activation = activation

    def _sa(self, x, mask, padding, is_causal):
        out, _ = self.self_attn(x, x, x, key_padding_mask=padding, need_weights=False,
                                attn_mask=mask, is_causal=is_causal)
        return self.dropout1(out)

    def _ff(self, x):
        h = _activate(self.activation, self.linear1(x))
        return self.dropout2(self.linear2(self.dropout(h)))

    def forward(self, src: Tensor, src_mask: Tensor | None = None,
                src_key_padding_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        x = src
        if self.norm_first:
            x = x + self._sa(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff(self.norm2(x))
        x = self.norm1(x + self._sa(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff(x))


def _check_activation(activation) -> None:
    if not (activation in ("relu", "gelu") or callable(activation)):
        raise OneModelError(f"activation must be 'relu', 'gelu' or a callable, not {activation!r}")


def _activate(activation: str | Callable[[Tensor], Tensor], h: Tensor) -> Tensor:
    if activation == "relu":
        return h.relu()
    if activation == "gelu":
        return h.gelu()
    return activation(h)


def _clones(layer: Module, n: int) -> ModuleList:
    """``n`` independent copies of ``layer`` (same initial weights, as in PyTorch)."""
    if not isinstance(n, int) or n < 1:
        raise OneModelError(f"num_layers must be a positive integer, got {n!r}")
    return ModuleList(copy.deepcopy(layer) for _ in range(n))


class TransformerEncoder(Module):
    """``torch.nn.TransformerEncoder``: ``num_layers`` copies of ``encoder_layer`` (parameters
    ``layers.<i>.*``) and an optional final ``norm``."""

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int,
                 norm: Module | None = None, enable_nested_tensor: bool = True,
                 mask_check: bool = True):
        super().__init__()
        # enable_nested_tensor and mask_check select PyTorch's fast paths; the result is the
        # same without them, so they are accepted and ignored
        self.layers = _clones(encoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src: Tensor, mask: Tensor | None = None,
                src_key_padding_mask: Tensor | None = None,
                is_causal: bool | None = None) -> Tensor:
        out = src
        for layer in self.layers:
            out = layer(out, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                        is_causal=bool(is_causal))
        return self.norm(out) if self.norm is not None else out


class TransformerDecoderLayer(Module):
    """``torch.nn.TransformerDecoderLayer``: self-attention over the target, attention over the
    encoder's ``memory``, and a feed-forward block, each with a residual connection and LayerNorm
    (after, or before with ``norm_first``)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation: str | Callable = "relu",
                 layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, *,
                 generator: Generator | None = None):
        super().__init__()
        _check_activation(activation)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout, bias, batch_first,
                                            generator=generator)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout, bias, batch_first,
                                                 generator=generator)
        self.linear1 = Linear(d_model, dim_feedforward, generator, bias=bias)
        self.dropout = Dropout(dropout, generator)
        self.linear2 = Linear(dim_feedforward, d_model, generator, bias=bias)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, layer_norm_eps, bias=bias)
        self.norm3 = LayerNorm(d_model, layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout, generator)
        self.dropout2 = Dropout(dropout, generator)
        self.dropout3 = Dropout(dropout, generator)
        self.activation = activation

    def _sa(self, x, mask, padding, is_causal):
        out, _ = self.self_attn(x, x, x, key_padding_mask=padding, need_weights=False,
                                attn_mask=mask, is_causal=is_causal)
        return self.dropout1(out)

    def _mha(self, x, memory, mask, padding, is_causal):
        out, _ = self.multihead_attn(x, memory, memory, key_padding_mask=padding,
                                     need_weights=False, attn_mask=mask, is_causal=is_causal)
        return self.dropout2(out)

    def _ff(self, x):
        h = _activate(self.activation, self.linear1(x))
        return self.dropout3(self.linear2(self.dropout(h)))

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, tgt_key_padding_mask: Tensor | None = None,
                memory_key_padding_mask: Tensor | None = None, tgt_is_causal: bool = False,
                memory_is_causal: bool = False) -> Tensor:
        x = tgt
        if self.norm_first:
            x = x + self._sa(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha(self.norm2(x), memory, memory_mask, memory_key_padding_mask,
                              memory_is_causal)
            return x + self._ff(self.norm3(x))
        x = self.norm1(x + self._sa(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._mha(x, memory, memory_mask, memory_key_padding_mask,
                                     memory_is_causal))
        return self.norm3(x + self._ff(x))


class TransformerDecoder(Module):
    """``torch.nn.TransformerDecoder``: ``num_layers`` copies of ``decoder_layer`` (parameters
    ``layers.<i>.*``) and an optional final ``norm``."""

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int,
                 norm: Module | None = None):
        super().__init__()
        self.layers = _clones(decoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, tgt_key_padding_mask: Tensor | None = None,
                memory_key_padding_mask: Tensor | None = None,
                tgt_is_causal: bool | None = None, memory_is_causal: bool = False) -> Tensor:
        out = tgt
        for layer in self.layers:
            out = layer(out, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                        tgt_key_padding_mask=tgt_key_padding_mask,
                        memory_key_padding_mask=memory_key_padding_mask,
                        tgt_is_causal=bool(tgt_is_causal), memory_is_causal=memory_is_causal)
        return self.norm(out) if self.norm is not None else out
