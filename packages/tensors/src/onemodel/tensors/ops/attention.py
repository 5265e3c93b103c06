"""Attention and its relatives: scaled dot-product attention (ONNX ``Attention``, opsets 23-25),
rotary embeddings, the Swish/SwiGLU gates, KV-cache scatter (``TensorScatter``), linear attention
and the stateful causal convolution of Mamba/DeltaNet blocks.

The kernels follow the ONNX operator text; where the text and ONNX's reference implementation
disagree (``qk_matmul_output_mode=0`` with a soft cap) the text is followed: mode 0 is the raw,
scaled QK product."""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..dtype import DType
from ..errors import AutogradError, DTypeError, ShapeError
from ..symbolic import Dim, add, floordiv, format_shape, mul
from ._grad import call, unbroadcast
from .base import TensorSpec, defop, norm_axis, same_dtype

# shape-rule helpers ------------------------------------------------------------------------


def _differ(a: Dim, b: Dim) -> bool:
    """Two dims that are certainly different (both known integers)."""
    return isinstance(a, int) and isinstance(b, int) and a != b


def _same(what: str, a: Dim, b: Dim) -> None:
    if _differ(a, b):
        raise ShapeError(f"{what}: {a} and {b} must be equal")


def _rank(name: str, spec: TensorSpec, ranks: tuple[int, ...]) -> None:
    if len(spec.shape) not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise ShapeError(f"{name} must have rank {want}, got {format_shape(spec.shape)}")


def _split_heads(name: str, hidden: Dim, heads: int) -> Dim:
    """head size of a packed (B, S, heads * head_size) input."""
    if isinstance(hidden, int) and hidden % heads:
        raise ShapeError(f"{name}'s hidden size {hidden} is not a multiple of its {heads} heads")
    return floordiv(hidden, heads)


def _float(name: str, spec: TensorSpec) -> DType:
    """The dtype of a floating input (float16/32/64, and bfloat16 where the DType set has it)."""
    if not spec.dtype.is_floating:
        raise DTypeError(f"{name} must be a floating tensor, got {spec.dtype.name}; cast it "
                         "first")
    return spec.dtype


def _floats(specs, names) -> DType:
    """The one floating dtype that all these inputs share."""
    dt = _float(names[0], specs[0])
    for name, s in zip(names[1:], specs[1:]):
        if s is not None and s.dtype is not dt:
            raise DTypeError(f"{name} must have {names[0]}'s dtype {dt.name}, got "
                             f"{s.dtype.name}")
    return dt


def _num_heads(name: str, value) -> int:
    if value is None or int(value) <= 0:
        raise ShapeError(f"{name} must be a positive number of heads for 3-D inputs, got {value}")
    return int(value)


# Attention ---------------------------------------------------------------------------------

_SOFTMAX_PRECISION = {1: np.float32, 10: np.float16, 11: np.float64, 16: "bfloat16"}


def _attention_geometry(specs, q_num_heads, kv_num_heads):
    """(batch, q heads, kv heads, q length, kv length, head size, v head size) of the inputs,
    all as dims, checking they fit together."""
    q, k, v = specs[0], specs[1], specs[2]
    _rank("Q", q, (3, 4))
    if len(k.shape) != len(q.shape) or len(v.shape) != len(q.shape):
        raise ShapeError(f"Q, K and V must have the same rank (3 or 4), got "
                         f"{format_shape(q.shape)}, {format_shape(k.shape)}, "
                         f"{format_shape(v.shape)}")
    if len(q.shape) == 3:
        hq = _num_heads("q_num_heads", q_num_heads)
        hkv = _num_heads("kv_num_heads", kv_num_heads)
        d = _split_heads("Q", q.shape[2], hq)
        dk = _split_heads("K", k.shape[2], hkv)
        dv = _split_heads("V", v.shape[2], hkv)
        sq, skv, skv_v = q.shape[1], k.shape[1], v.shape[1]
    else:
        hq, hkv, sq, d = q.shape[1], k.shape[1], q.shape[2], q.shape[3]
        dk, skv, skv_v, dv = k.shape[3], k.shape[2], v.shape[2], v.shape[3]
        _same("the heads of K and V", k.shape[1], v.shape[1])
        if q_num_heads is not None:
            _same("q_num_heads and the heads of 4-D Q", int(q_num_heads), hq)
        if kv_num_heads is not None:
            _same("kv_num_heads and the heads of 4-D K", int(kv_num_heads), hkv)
    _same("the batch sizes of Q and K", q.shape[0], k.shape[0])
    _same("the batch sizes of Q and V", q.shape[0], v.shape[0])
    _same("the head sizes of Q and K", d, dk)
    _same("the sequence lengths of K and V", skv, skv_v)
    if isinstance(hq, int) and isinstance(hkv, int) and (hkv <= 0 or hq % hkv):
        raise ShapeError(f"the {hq} query heads must be a multiple of the {hkv} key/value heads")
    return q.shape[0], hq, hkv, sq, skv, d, dv


def _attention_checks(past_k, past_v, nonpad, qk_matmul_output_mode, softmax_precision,
                      left_window_size, right_window_size) -> None:
    """What the kernel checks too (eager calls check shape rules once per dtype signature):
    attribute values and which optional inputs go together."""
    if qk_matmul_output_mode not in (0, 1, 2, 3):
        raise ShapeError(f"qk_matmul_output_mode must be 0, 1, 2 or 3, got "
                         f"{qk_matmul_output_mode}")
    if softmax_precision is not None and softmax_precision not in _SOFTMAX_PRECISION:
        raise DTypeError(f"softmax_precision must be 1 (float), 10 (float16), 11 (double) or "
                         f"16 (bfloat16), got {softmax_precision}")
    for name, w in (("left_window_size", left_window_size),
                    ("right_window_size", right_window_size)):
        if int(w) < -1:
            raise ShapeError(f"{name} must be -1 (unbounded) or >= 0, got {w}")
    if (past_k is None) != (past_v is None):
        raise ShapeError("past_key and past_value must be given together")
    if past_k is not None and nonpad is not None:
        raise ShapeError("nonpad_kv_seqlen cannot be combined with past_key/past_value; "
                         "use one KV-cache form")


def _attention_shape(specs, *, is_causal=0, kv_num_heads=None, q_num_heads=None,
                     qk_matmul_output_mode=0, scale=None, softcap=0.0, softmax_precision=None,
                     left_window_size=-1, right_window_size=-1):
    specs = list(specs) + [None] * (7 - len(specs))
    q, k, v, mask, past_k, past_v, nonpad = specs
    t1 = _float("Q", q)
    if k.dtype is not t1:
        raise DTypeError(f"K must have Q's dtype {t1.name}, got {k.dtype.name}")
    t2 = _float("V", v)
    b, hq, hkv, sq, skv, d, dv = _attention_geometry(specs, q_num_heads, kv_num_heads)
    _attention_checks(past_k, past_v, nonpad, qk_matmul_output_mode, softmax_precision,
                      left_window_size, right_window_size)
    total: Dim = skv
    if past_k is not None:
        _rank("past_key", past_k, (4,))
        _rank("past_value", past_v, (4,))
        if past_k.dtype is not t1 or past_v.dtype is not t2:
            raise DTypeError(f"past_key must be {t1.name} and past_value {t2.name}, got "
                             f"{past_k.dtype.name} and {past_v.dtype.name}")
        for name, p, last in (("past_key", past_k, d), ("past_value", past_v, dv)):
            _same(f"{name}'s batch size and Q's", p.shape[0], b)
            _same(f"{name}'s heads and the key/value heads", p.shape[1], hkv)
            _same(f"{name}'s head size", p.shape[3], last)
        _same("the past lengths of past_key and past_value", past_k.shape[2], past_v.shape[2])
        total = add(past_k.shape[2], skv)
    if mask is not None:
        if not (mask.dtype is DType.BOOL or mask.dtype.is_floating
                or mask.dtype.numpy.kind in "iu"):
            raise DTypeError(f"attn_mask must be bool or numeric, got {mask.dtype.name}")
        if not 1 <= len(mask.shape) <= 4:
            raise ShapeError(f"attn_mask must have rank 1 to 4, got {format_shape(mask.shape)}")
        if isinstance(mask.shape[-1], int) and isinstance(total, int) and mask.shape[-1] > total:
            raise ShapeError(f"attn_mask covers {mask.shape[-1]} keys, more than the "
                             f"{total} keys (past + current) there are")
        target = (b, hq, sq)
        for i, dm in enumerate(reversed(mask.shape[:-1])):
            dt = target[len(target) - 1 - i]
            if not (isinstance(dm, int) and dm == 1) and _differ(dm, dt):
                raise ShapeError(f"attn_mask {format_shape(mask.shape)} does not broadcast to "
                                 f"(batch, q_heads, q_length) {format_shape(target)}")
    if nonpad is not None:
        if nonpad.dtype is not DType.I64 or len(nonpad.shape) != 1:
            raise DTypeError(f"nonpad_kv_seqlen must be an int64 vector (batch,), got {nonpad}")
        _same("nonpad_kv_seqlen's length and the batch size", nonpad.shape[0], b)
    if len(q.shape) == 3:
        y = TensorSpec((b, sq, mul(hq, dv)), t1)
    else:
        y = TensorSpec((b, hq, sq, dv), t1)
    return [y, TensorSpec((b, hkv, total, d), t1), TensorSpec((b, hkv, total, dv), t2),
            TensorSpec((b, hq, sq, total), t1)]


def _to_heads(x: np.ndarray, heads: int) -> np.ndarray:
    """(B, S, heads * D) -> (B, heads, S, D), a view."""
    b, s, hidden = x.shape
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 precision (nearest, ties to even), kept as float32."""
    x = np.asarray(x, np.float32)
    bits = x.view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
               & np.uint32(0xFFFF0000)).view(np.float32)
    return np.where(np.isnan(x), x, rounded)


def _safe_softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis where a row of -inf (no key allowed) gives zeros, not NaN."""
    if x.shape[-1] == 0:
        return np.zeros_like(x)
    zero = x.dtype.type(0)
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isneginf(m), zero, m))
    s = e.sum(axis=-1, keepdims=True)
    return e / np.where(s == zero, x.dtype.type(1), s)


def _attention_bias(mask, dtype, q_len, kv_len, is_causal, offset, left, right, nonpad):
    """The additive bias, broadcastable to (B, H, q, kv): 0 (or the float mask's value) where a
    key may be attended, -inf where the mask, the causal frontier, the window or the padding
    forbids it; None when nothing restricts attention."""
    allowed = None
    if is_causal or left >= 0 or right >= 0:
        pos = np.arange(q_len).reshape(q_len, 1) + offset  # absolute query positions
        j = np.arange(kv_len)
        if is_causal:
            allowed = j <= pos
        if left >= 0:
            near = pos - j <= left
            allowed = near if allowed is None else allowed & near
        if right >= 0:
            near = j - pos <= right
            allowed = near if allowed is None else allowed & near
    if nonpad is not None:
        valid = np.arange(kv_len) < nonpad.reshape(-1, 1, 1, 1)
        allowed = valid if allowed is None else allowed & valid
    if mask is not None and mask.dtype != np.bool_ and mask.dtype.kind != "f":
        mask = mask.astype(dtype)  # an integer (or bfloat16) mask is an additive bias
    if mask is not None and mask.shape[-1] < kv_len:  # a shorter mask: the rest is masked
        widths = [(0, 0)] * (mask.ndim - 1) + [(0, kv_len - mask.shape[-1])]
        fill = False if mask.dtype == np.bool_ else -np.inf
        mask = np.pad(mask, widths, constant_values=fill)
    ninf = dtype.type(-np.inf)
    if mask is None:
        return None if allowed is None else np.where(allowed, dtype.type(0), ninf)
    if mask.dtype == np.bool_:
        allowed = mask if allowed is None else allowed & mask
        return np.where(allowed, dtype.type(0), ninf)
    if mask.dtype.kind == "f" and dtype.kind == "f":
        mask = mask.astype(np.result_type(dtype, mask.dtype), copy=False)
    return mask if allowed is None else np.where(allowed, mask, mask.dtype.type(-np.inf))


def _attention_parts(Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen, a):
    """Everything the forward and the gradient share: 4-D Q, the present K and V, the bias,
    the scale factor applied to Q and K, and the raw and soft-capped scores."""
    if Q.ndim == 3:
        q = _to_heads(Q, a["q_num_heads"])
        k = _to_heads(K, a["kv_num_heads"])
        v = _to_heads(V, a["kv_num_heads"])
    else:
        q, k, v = Q, K, V
    scale = a["scale"]
    if scale is None:
        scale = 1 / math.sqrt(q.shape[3]) if q.shape[3] else 1.0  # no features: scores are 0
    s = Q.dtype.type(np.sqrt(scale))
    if past_key is not None:
        k = np.concatenate((past_key, k), axis=2)
        v = np.concatenate((past_value, v), axis=2)
    q_len, kv_len = q.shape[2], k.shape[2]
    if nonpad_kv_seqlen is not None and past_key is None:
        offset = (nonpad_kv_seqlen.astype(np.int64) - q_len).reshape(-1, 1, 1, 1)
    else:
        offset = 0 if past_key is None else past_key.shape[2]
    bias = _attention_bias(attn_mask, Q.dtype, q_len, kv_len, a["is_causal"], offset,
                           int(a["left_window_size"]), int(a["right_window_size"]),
                           nonpad_kv_seqlen)
    raw = _grouped_matmul(q * s, np.swapaxes(k * s, -1, -2))
    return q, k, v, bias, s, raw


def _grouped_matmul(x: np.ndarray, kv: np.ndarray) -> np.ndarray:
    """``x @ kv`` where x has H query heads and kv has H / G heads: query head h reads kv head
    h // G (grouped-query attention) without copying kv G times."""
    b, h = x.shape[:2]
    hkv = kv.shape[1]
    if h == hkv:
        out = np.matmul(x, kv)
    elif hkv == 0 or h % hkv:
        raise ShapeError(f"Attention: the {h} query heads must be a multiple of the {hkv} "
                         "key/value heads")
    else:
        out = np.matmul(x.reshape(b, hkv, h // hkv, *x.shape[2:]), kv[:, :, None])
        out = out.reshape(b, h, *out.shape[3:])
    return out.astype(x.dtype, copy=False)  # numpy gives float32 for bfloat16: round back


def _probabilities(x: np.ndarray, bias, softmax_precision) -> np.ndarray:
    if softmax_precision == 16:
        p = _round_bf16(_safe_softmax(_round_bf16(x)))
    elif softmax_precision is not None:
        p = _safe_softmax(x.astype(_SOFTMAX_PRECISION[softmax_precision], copy=False))
    else:
        p = _safe_softmax(x)
    if bias is not None and bias.shape[-1]:
        # a query row with no key allowed (decided on the bias, not on possibly-NaN scores)
        blocked = np.isneginf(bias.max(axis=-1, keepdims=True))
        if blocked.any():
            p = np.where(blocked, p.dtype.type(0), p)
    return p


def _grouped(x, kv, hkv: int):
    """Tensor form of :func:`_grouped_matmul`: ``x`` (B, H, M, N) @ ``kv`` (B, H / G, N, P)."""
    b, h = x.shape[0], x.shape[1]
    if h == hkv:
        return x @ kv
    out = x.reshape(b, hkv, h // hkv, x.shape[2], x.shape[3]) @ kv.unsqueeze(2)
    return out.reshape(b, h, out.shape[3], out.shape[4])


def _group_sum(x, hkv: int):
    """(B, H, M, N) -> (B, H / G, M, N): the gradient of sharing a KV head by G query heads."""
    b, h = x.shape[0], x.shape[1]
    if h == hkv:
        return x
    return x.reshape(b, hkv, h // hkv, x.shape[2], x.shape[3]).sum(axis=2)


def _attention_grad(ctx, gy, g_present_k, g_present_v, g_qk):
    """Gradients for Q, K, V, past_key, past_value and a float attn_mask, written with other
    ops (so they can be differentiated again). The bias is a constant of the masks' values;
    softmax_precision is a forward precision choice and the gradient uses the inputs' dtype."""
    from ..tensor import Tensor, concat, where

    ins = list(ctx.inputs) + [None] * (7 - len(ctx.inputs))
    Q, K, V, mask, past_k, past_v, nonpad = ins
    a = ctx.attrs
    three_d = Q.ndim == 3
    if three_d:
        b, sq, skv = Q.shape[0], Q.shape[1], K.shape[1]
        hq, hkv = int(a["q_num_heads"]), int(a["kv_num_heads"])
        q = Q.reshape(b, sq, hq, Q.shape[2] // hq).transpose(1, 2)
        k = K.reshape(b, skv, hkv, K.shape[2] // hkv).transpose(1, 2)
        v = V.reshape(b, skv, hkv, V.shape[2] // hkv).transpose(1, 2)
    else:
        q, k, v = Q, K, V
        b, hq, sq = Q.shape[0], Q.shape[1], Q.shape[2]
        hkv = K.shape[1]
    scale = a["scale"]
    if scale is None:
        scale = 1 / math.sqrt(q.shape[3]) if q.shape[3] else 1.0
    past = 0 if past_k is None else past_k.shape[2]
    kf = k if past_k is None else concat([past_k, k], axis=2)
    vf = v if past_v is None else concat([past_v, v], axis=2)
    kv_len = kf.shape[2]
    offset = past
    npv = None
    if nonpad is not None and past_k is None:
        npv = nonpad.numpy()
        offset = (npv.astype(np.int64) - sq).reshape(-1, 1, 1, 1)
    bias = _attention_bias(None if mask is None else mask.numpy(),
                           Q.numpy().dtype, sq, kv_len, a["is_causal"], offset,
                           int(a["left_window_size"]), int(a["right_window_size"]), npv)
    root = math.sqrt(scale)
    raw = _grouped(q * root, (kf * root).mT, hkv)
    cap = a["softcap"]
    capped = (raw * (1 / cap)).tanh() * cap if cap > 0 else raw
    x = capped
    blocked = None
    if bias is not None:
        blocked = np.isneginf(bias.max(axis=-1, keepdims=True)) if bias.shape[-1] else None
        if blocked is not None and blocked.any():
            bias = np.where(blocked, bias.dtype.type(0), bias)  # no NaN rows; zeroed below
        else:
            blocked = None
        x = capped + Tensor._wrap(bias.astype(Q.numpy().dtype, copy=False))
    p = x.softmax(axis=-1)
    if blocked is not None:
        p = where(Tensor._wrap(np.broadcast_to(blocked, p.shape).copy()), 0.0, p)
    gy4 = gy.reshape(b, sq, hq, gy.shape[2] // hq).transpose(1, 2) if three_d else gy
    dp = _grouped(gy4, vf.mT, hkv)
    mode = a["qk_matmul_output_mode"]
    if mode == 3:
        dp = dp + g_qk
    dx = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    if mode == 2:
        dx = dx + g_qk
    g_mask = None
    if mask is not None and mask.requires_grad:
        lm = mask.shape[-1]
        g_mask = unbroadcast(dx if lm == kv_len else dx[..., :lm], mask.shape)
    dcap = dx + g_qk if mode == 1 else dx
    draw = dcap * (1 - (capped * (1 / cap)) * (capped * (1 / cap))) if cap > 0 else dcap
    if mode == 0:
        draw = draw + g_qk
    dq = _grouped(draw, kf, hkv) * scale
    dkf = _group_sum(draw.mT @ q, hkv) * scale + g_present_k
    dvf = _group_sum(p.mT @ gy4, hkv) + g_present_v
    g_past_k = dkf[:, :, :past] if past_k is not None else None
    g_past_v = dvf[:, :, :past] if past_v is not None else None
    dk = dkf[:, :, past:] if past_k is not None else dkf
    dv = dvf[:, :, past:] if past_v is not None else dvf
    if three_d:
        dq = dq.transpose(1, 2).reshape(*Q.shape)
        dk = dk.transpose(1, 2).reshape(*K.shape)
        dv = dv.transpose(1, 2).reshape(*V.shape)
    return (dq, dk, dv, g_mask, g_past_k, g_past_v, None)[:len(ctx.inputs)]


def _attention_opset(attrs: dict) -> int:
    """Attention-24 (nonpad_kv_seqlen, offset-aware causal masks); 25 for sliding windows."""
    windowed = (attrs.get("left_window_size", -1) != -1
                or attrs.get("right_window_size", -1) != -1)
    return 25 if windowed else 24


@defop("Attention", shape=_attention_shape, grad=_attention_grad, onnx_opset=_attention_opset,
       outputs=("Y", "present_key", "present_value", "qk_matmul_output"))
def attention(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
              is_causal=0, kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0,
              scale=None, softcap=0.0, softmax_precision=None, left_window_size=-1,
              right_window_size=-1):
    """ONNX Attention (opsets 23-25): softmax(Q K^T * scale, soft-capped, + mask) V with
    grouped-query heads, causal and sliding-window masks, an in-op KV cache (past/present) or an
    external one (``nonpad_kv_seqlen``). A query row with no key allowed gives zeros."""
    _attention_checks(past_key, past_value, nonpad_kv_seqlen, qk_matmul_output_mode,
                      softmax_precision, left_window_size, right_window_size)
    a = dict(is_causal=is_causal, q_num_heads=q_num_heads, kv_num_heads=kv_num_heads,
             scale=scale, left_window_size=left_window_size, right_window_size=right_window_size)
    _, k, v, bias, _, raw = _attention_parts(Q, K, V, attn_mask, past_key, past_value,
                                             nonpad_kv_seqlen, a)
    capped = raw
    if softcap > 0:
        capped = (np.tanh(raw / raw.dtype.type(softcap)) * raw.dtype.type(softcap))
    x = capped if bias is None else capped + bias
    p = _probabilities(x, bias, softmax_precision).astype(Q.dtype, copy=False)
    y = _grouped_matmul(p, v).astype(Q.dtype, copy=False)
    if Q.ndim == 3:
        y = y.transpose(0, 2, 1, 3).reshape(y.shape[0], y.shape[2], -1)
    qk = (raw, capped, x, p)[qk_matmul_output_mode].astype(Q.dtype, copy=False)
    present_k = k if past_key is not None or k is not K else k.copy()
    present_v = v if past_value is not None or v is not V else v.copy()
    return (np.ascontiguousarray(y), np.ascontiguousarray(present_k),
            np.ascontiguousarray(present_v), np.ascontiguousarray(qk))


# RotaryEmbedding -------------------------------------------------------------------------------

def _rotary_shape(specs, *, interleaved=0, num_heads=0, rotary_embedding_dim=0):
    x, cos, sin = specs[0], specs[1], specs[2]
    pos = specs[3] if len(specs) > 3 else None
    dt = _floats([x, cos, sin], ("input", "cos_cache", "sin_cache"))
    _rank("input", x, (3, 4))
    if len(x.shape) == 3:
        heads = _num_heads("num_heads", num_heads)
        head = _split_heads("input", x.shape[2], heads)
        b, s = x.shape[0], x.shape[1]
    else:
        b, s, head = x.shape[0], x.shape[2], x.shape[3]
    rot = rotary_embedding_dim or head
    if isinstance(rot, int) and rot % 2:
        raise ShapeError(f"the rotated size {rot} (rotary_embedding_dim or the head size) must "
                         "be even")
    if isinstance(rot, int) and isinstance(head, int) and rot > head:
        raise ShapeError(f"rotary_embedding_dim {rot} is larger than the head size {head}")
    for name, c in (("cos_cache", cos), ("sin_cache", sin)):
        want = 2 if pos is not None else 3
        if len(c.shape) != want:
            form = ("(max_position + 1, rotary_dim / 2) when position_ids are given" if want == 2
                    else "(batch, sequence, rotary_dim / 2) without position_ids")
            raise ShapeError(f"{name} must be {form}, got {format_shape(c.shape)}")
        _same(f"{name}'s last size and half the rotated size", c.shape[-1], floordiv(rot, 2))
        if pos is None:
            _same(f"{name}'s batch size and the input's", c.shape[0], b)
            _same(f"{name}'s sequence length and the input's", c.shape[1], s)
    _same("the shapes of cos_cache and sin_cache", len(cos.shape), len(sin.shape))
    if pos is not None:
        if pos.dtype is not DType.I64 or len(pos.shape) != 2:
            raise DTypeError(f"position_ids must be int64 (batch, sequence), got {pos}")
        _same("position_ids' batch size and the input's", pos.shape[0], b)
        _same("position_ids' sequence length and the input's", pos.shape[1], s)
    return TensorSpec(x.shape, dt)


def _rotary_tables(X, cos_cache, sin_cache, position_ids):
    """cos and sin per (batch, position), shaped to broadcast against the input's layout."""
    if position_ids is not None:
        n = cos_cache.shape[0]
        if position_ids.size and (position_ids.min() < 0 or position_ids.max() >= n):
            raise ShapeError(f"RotaryEmbedding: position_ids must lie in [0, {n}) (the rows of "
                             f"cos_cache), got values from {position_ids.min()} to "
                             f"{position_ids.max()}")
        cos_cache, sin_cache = cos_cache[position_ids], sin_cache[position_ids]
    # (B, S, half) -> (B, 1, S, half) for (B, H, S, D) inputs, (B, S, 1, half) for (B, S, H, D)
    axis = 1 if X.ndim == 4 else 2
    return np.expand_dims(cos_cache, axis), np.expand_dims(sin_cache, axis)


def _rotate(x, cos, sin, interleaved, rot, inverse=False):
    """Rotate the first ``rot`` features of the last axis of ``x`` by the angles of cos/sin
    (backwards when ``inverse``: the rotation's transpose, which is its gradient)."""
    xr = x[..., :rot]
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    else:
        x1, x2 = xr[..., : rot // 2], xr[..., rot // 2:]
    if inverse:
        sin = -sin
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        out = np.stack((real, imag), axis=-1).reshape(xr.shape)
    else:
        out = np.concatenate((real, imag), axis=-1)
    return np.concatenate((out.astype(x.dtype, copy=False), x[..., rot:]), axis=-1)


def _rotary_grad(ctx, g):
    cos, sin = ctx.inputs[1], ctx.inputs[2]
    pos = ctx.inputs[3] if len(ctx.inputs) > 3 else None
    if cos.requires_grad or sin.requires_grad:
        raise AutogradError("RotaryEmbedding is differentiable with respect to its input only, "
                            "not cos_cache/sin_cache; detach the tables (they are constants)")
    return call("RotaryEmbeddingGrad", g, cos, sin, pos, **ctx.attrs), None, None, None


def _rotary(X, cos_cache, sin_cache, position_ids, interleaved, num_heads, rotary_embedding_dim,
            inverse):
    cos, sin = _rotary_tables(X, cos_cache, sin_cache, position_ids)
    x = X.reshape(X.shape[0], X.shape[1], num_heads, -1) if X.ndim == 3 else X
    rot = rotary_embedding_dim or x.shape[-1]
    return _rotate(x, cos, sin, interleaved, rot, inverse).reshape(X.shape)


@defop("RotaryEmbedding", shape=_rotary_shape, grad=_rotary_grad, onnx_opset=23)
def rotary_embedding(X, cos_cache, sin_cache, position_ids=None, *, interleaved=0, num_heads=0,
                     rotary_embedding_dim=0):
    """ONNX RotaryEmbedding (opset 23): rotate pairs of features (the two halves, or even/odd
    when ``interleaved``) of each head by position-dependent angles given as cos/sin tables."""
    return _rotary(X, cos_cache, sin_cache, position_ids, interleaved, num_heads,
                   rotary_embedding_dim, False)


@defop("RotaryEmbeddingGrad", shape=_rotary_shape, domain="onemodel", traceable=False)
def rotary_embedding_grad(dY, cos_cache, sin_cache, position_ids=None, *, interleaved=0,
                          num_heads=0, rotary_embedding_dim=0):
    """Gradient of RotaryEmbedding with respect to its input: the inverse rotation of dY."""
    return _rotary(dY, cos_cache, sin_cache, position_ids, interleaved, num_heads,
                   rotary_embedding_dim, True)


# Swish and SwiGLU ------------------------------------------------------------------------------

def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))  # exp of non-positive numbers only: no overflow
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


def _swish_shape(specs, *, alpha=1.0):
    return TensorSpec(specs[0].shape, _float("X", specs[0]))


def _swish_grad(ctx, g):
    x = ctx.inputs[0]
    alpha = ctx.attrs["alpha"]
    s = (x * alpha).sigmoid()
    return g * (s + x * s * (1 - s) * alpha)


@defop("Swish", shape=_swish_shape, grad=_swish_grad, onnx_opset=24)
def swish(X, *, alpha=1.0):
    """x * sigmoid(alpha * x) (ONNX Swish, opset 24; SiLU when alpha is 1)."""
    return X * _sigmoid(X * X.dtype.type(alpha))


def _swiglu_shape(specs, *, alpha=1.0):
    a, b = specs
    dt = _floats(specs, ("A", "B"))
    if len(a.shape) != len(b.shape) or any(_differ(x, y) for x, y in zip(a.shape, b.shape)):
        raise ShapeError(f"A {format_shape(a.shape)} and B {format_shape(b.shape)} must have the "
                         "same shape (SwiGLU does not broadcast)")
    return TensorSpec(a.shape, dt)


def _swiglu_grad(ctx, g):
    a, b = ctx.inputs
    alpha = ctx.attrs["alpha"]
    s = (a * alpha).sigmoid()
    ga = g * b * (s + a * s * (1 - s) * alpha) if a.requires_grad else None
    gb = g * (a * s) if b.requires_grad else None
    return ga, gb


@defop("SwiGLU", shape=_swiglu_shape, grad=_swiglu_grad, onnx_opset=28)
def swiglu(A, B, *, alpha=1.0):
    """Swish_alpha(A) * B: the gated linear unit of Llama-style MLPs (ONNX SwiGLU)."""
    if A.shape != B.shape:
        raise ShapeError(f"SwiGLU: A {list(A.shape)} and B {list(B.shape)} must have the same "
                         "shape (it does not broadcast)")
    return A * _sigmoid(A * A.dtype.type(alpha)) * B


# TensorScatter ---------------------------------------------------------------------------------

def _tensor_scatter_shape(specs, *, axis=-2, mode="linear"):
    past, update = specs[0], specs[1]
    idx = specs[2] if len(specs) > 2 else None
    same_dtype([past, update])
    if mode not in ("linear", "circular"):
        raise ShapeError(f"mode must be 'linear' or 'circular', got {mode!r}")
    nd = len(past.shape)
    if nd < 2 or len(update.shape) != nd:
        raise ShapeError(f"past_cache and update must have one rank >= 2, got "
                         f"{format_shape(past.shape)} and {format_shape(update.shape)}")
    ax = norm_axis(axis, nd)
    if ax == 0:
        raise ShapeError("axis cannot be 0 (the batch axis)")
    for i, (p, u) in enumerate(zip(past.shape, update.shape)):
        if i != ax:
            _same(f"past_cache and update on axis {i}", p, u)
        elif isinstance(p, int) and isinstance(u, int) and u > p:
            raise ShapeError(f"update has {u} positions on axis {ax}, more than the cache's {p}")
    if idx is not None:
        if idx.dtype is not DType.I64 or len(idx.shape) != 1:
            raise DTypeError(f"write_indices must be an int64 vector (batch,), got {idx}")
        _same("write_indices' length and the batch size", idx.shape[0], past.shape[0])
    return TensorSpec(past.shape, past.dtype)


@defop("TensorScatter", shape=_tensor_scatter_shape, onnx_opset=24)
def tensor_scatter(past_cache, update, write_indices=None, *, axis=-2, mode="linear"):
    """Write ``update`` into a copy of ``past_cache`` along the sequence ``axis``, from each batch
    row's write index on (wrapping around the cache when ``mode`` is circular): a KV-cache
    update (ONNX TensorScatter, opset 24)."""
    if mode not in ("linear", "circular"):
        raise ShapeError(f"TensorScatter: mode must be 'linear' or 'circular', got {mode!r}")
    ax = axis % past_cache.ndim
    b, size, n = past_cache.shape[0], past_cache.shape[ax], update.shape[ax]
    start = (np.zeros(b, np.int64) if write_indices is None
             else write_indices.astype(np.int64, copy=False))
    pos = start[:, None] + np.arange(n)
    if mode == "circular":
        pos %= max(size, 1)
    elif pos.size and (pos.min() < 0 or pos.max() >= size):
        raise ShapeError(f"TensorScatter: writing {n} positions from write_indices "
                         f"{start.tolist()} leaves the cache of {size} positions (mode 'linear' "
                         "needs 0 <= write_index and write_index + length <= cache length)")
    out = past_cache.copy()
    view = np.moveaxis(out, ax, 1)  # (B, cache, ...): writes go to ``out``
    view[np.arange(b)[:, None], pos] = np.moveaxis(update, ax, 1)
    return out


# LinearAttention -------------------------------------------------------------------------------

_UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


def _linear_attention_checks(update_rule, q_num_heads, kv_num_heads, decay, beta):
    """The update rule, the head counts and which of decay/beta the rule takes (the kernel checks
    them too: eager calls check shape rules once per dtype signature)."""
    if update_rule not in _UPDATE_RULES:
        raise ShapeError(f"update_rule must be one of {', '.join(_UPDATE_RULES)}, got "
                         f"{update_rule!r}")
    hq = _num_heads("q_num_heads", q_num_heads)
    hkv = _num_heads("kv_num_heads", kv_num_heads)
    if hq % hkv:
        raise ShapeError(f"q_num_heads {hq} must be a multiple of kv_num_heads {hkv}")
    gated = update_rule in ("gated", "gated_delta")
    delta = update_rule in ("delta", "gated_delta")
    for name, given, needed in (("decay", decay, gated), ("beta", beta, delta)):
        if needed and given is None:
            raise ShapeError(f"update_rule {update_rule!r} needs the {name} input")
        if not needed and given is not None:
            raise ShapeError(f"update_rule {update_rule!r} takes no {name} input")
    return hq, hkv


def _linear_attention_shape(specs, *, chunk_size=64, kv_num_heads=None, q_num_heads=None,
                            scale=0.0, update_rule="gated_delta"):
    specs = list(specs) + [None] * (6 - len(specs))
    q, k, v, past, decay, beta = specs
    dt = _floats([q, k, v, decay, beta], ("query", "key", "value", "decay", "beta"))
    hq, hkv = _linear_attention_checks(update_rule, q_num_heads, kv_num_heads, decay, beta)
    for name, s in (("query", q), ("key", k), ("value", v)):
        _rank(name, s, (3,))
        _same(f"{name}'s batch size and query's", s.shape[0], q.shape[0])
        _same(f"{name}'s sequence length and query's", s.shape[1], q.shape[1])
    b, t = q.shape[0], q.shape[1]
    dk = _split_heads("query", q.shape[2], hq)
    _same("key's hidden size and kv_num_heads * head size", k.shape[2], mul(dk, hkv))
    dv = _split_heads("value", v.shape[2], hkv)
    if decay is not None:
        _rank("decay", decay, (3,))
        last = decay.shape[2]
        if _differ(last, hkv) and _differ(last, mul(hkv, dk)):
            raise ShapeError(f"decay's last size {last} must be kv_num_heads ({hkv}) or "
                             f"kv_num_heads * head size ({mul(hkv, dk)})")
    if beta is not None:
        _rank("beta", beta, (3,))
        if _differ(beta.shape[2], hkv) and _differ(beta.shape[2], 1):
            raise ShapeError(f"beta's last size {beta.shape[2]} must be kv_num_heads ({hkv}) "
                             "or 1")
    for name, s in (("decay", decay), ("beta", beta)):
        if s is not None:
            _same(f"{name}'s batch size and query's", s.shape[0], b)
            _same(f"{name}'s sequence length and query's", s.shape[1], t)
    state = (b, hkv, dk, dv)
    sdt = dt
    if past is not None:
        sdt = _float("past_state", past)
        if len(past.shape) != 4 or any(_differ(x, y) for x, y in zip(past.shape, state)):
            raise ShapeError(f"past_state must be (batch, kv_heads, d_k, d_v) "
                             f"{format_shape(state)}, got {format_shape(past.shape)}")
    return [TensorSpec((b, t, mul(hq, dv)), dt), TensorSpec(state, sdt)]


@defop("LinearAttention", shape=_linear_attention_shape, onnx_opset=27,
       outputs=("output", "present_state"))
def linear_attention(query, key, value, past_state=None, decay=None, beta=None, *, chunk_size=64,
                     kv_num_heads=None, q_num_heads=None, scale=0.0, update_rule="gated_delta"):
    """ONNX LinearAttention (opset 27): a recurrent state S (d_k x d_v per KV head) updated per
    token by the linear, gated (decay), delta (beta) or gated-delta rule, read by each query:
    o_t = scale * q_t^T S_t. Computed token by token in float32 (``chunk_size`` is a tuning
    hint of chunked implementations; it does not change the result)."""
    hq, hkv = _linear_attention_checks(update_rule, q_num_heads, kv_num_heads, decay, beta)
    b, t, _ = query.shape
    group = hq // hkv
    q = _to_heads(query, hq).astype(np.float32)
    k = _to_heads(key, hkv).astype(np.float32)
    v = _to_heads(value, hkv).astype(np.float32)
    dk, dv = q.shape[3], v.shape[3]
    if decay is not None:
        per_head = decay.shape[2] == hkv and hkv != hkv * dk
        g = (decay.reshape(b, t, hkv, 1).transpose(0, 2, 1, 3) if per_head
             else _to_heads(decay, hkv))
        g = np.exp(g.astype(np.float32))  # (B, Hkv, T, 1 or d_k)
    if beta is not None:
        be = beta.reshape(b, t, beta.shape[2], 1).transpose(0, 2, 1, 3).astype(np.float32)
    state = (np.zeros((b, hkv, dk, dv), np.float32) if past_state is None
             else past_state.astype(np.float32))
    factor = np.float32(scale if scale else (1 / math.sqrt(dk) if dk else 1.0))
    out = np.empty((b, hq, t, dv), np.float32)
    for i in range(t):
        if decay is not None:
            state = state * g[:, :, i, :, None]
        k_t, v_t = k[:, :, i], v[:, :, i]
        if beta is not None:  # v_t <- beta_t * (v_t - S^T k_t)
            v_t = be[:, :, i] * (v_t - np.einsum("bhdm,bhd->bhm", state, k_t))
        state = state + k_t[..., :, None] * v_t[..., None, :]
        q_t = q[:, :, i].reshape(b, hkv, group, dk)
        out[:, :, i] = factor * np.einsum("bhgd,bhdm->bhgm", q_t, state).reshape(b, hq, dv)
    output = out.transpose(0, 2, 1, 3).reshape(b, t, hq * dv).astype(query.dtype)
    state_dtype = query.dtype if past_state is None else past_state.dtype
    return output, state.astype(state_dtype)


# CausalConvWithState ---------------------------------------------------------------------------

def _causal_conv_shape(specs, *, activation="none"):
    specs = list(specs) + [None] * (4 - len(specs))
    x, w, bias, past = specs
    dt = _floats([x, w, bias, past], ("input", "weight", "bias", "past_state"))
    if activation not in ("none", "silu", "swish"):
        raise ShapeError(f"activation must be 'none', 'silu' or 'swish', got {activation!r}")
    _rank("input", x, (3,))
    _rank("weight", w, (3,))
    b, c = x.shape[0], x.shape[1]
    _same("weight's channels and input's", w.shape[0], c)
    _same("weight's middle size (depthwise: 1)", w.shape[1], 1)
    k = w.shape[2]
    if isinstance(k, int) and k < 1:
        raise ShapeError(f"the kernel size must be at least 1, got {k}")
    if bias is not None and (len(bias.shape) != 1 or _differ(bias.shape[0], c)):
        raise ShapeError(f"bias must be (channels,) [{c}], got {format_shape(bias.shape)}")
    state = (b, c, add(k, -1))
    if past is not None and (len(past.shape) != 3
                             or any(_differ(p, s) for p, s in zip(past.shape, state))):
        raise ShapeError(f"past_state must be (batch, channels, k - 1) {format_shape(state)}, "
                         f"got {format_shape(past.shape)}")
    return [TensorSpec(x.shape, dt), TensorSpec(state, dt)]


@defop("CausalConvWithState", shape=_causal_conv_shape, onnx_opset=27,
       outputs=("output", "present_state"))
def causal_conv_with_state(input, weight, bias=None, past_state=None, *, activation="none"):
    """ONNX CausalConvWithState (opset 27): a depthwise causal 1-D convolution over
    (batch, channels, length) whose left context is ``past_state`` (zeros when omitted), with an
    optional fused SiLU; ``present_state`` is the last k - 1 positions, for the next call."""
    if activation not in ("none", "silu", "swish"):
        raise ShapeError(f"CausalConvWithState: activation must be 'none', 'silu' or 'swish', "
                         f"got {activation!r}")
    b, c, _ = input.shape
    k = weight.shape[2]
    pad = np.zeros((b, c, k - 1), input.dtype) if past_state is None else past_state
    padded = np.concatenate((pad, input), axis=2)
    work = np.float32 if input.dtype != np.float64 else np.float64
    windows = sliding_window_view(padded.astype(work, copy=False), k, axis=2)  # (B, C, L, k)
    y = np.einsum("bclk,ck->bcl", windows, weight[:, 0].astype(work, copy=False))
    if bias is not None:
        y = y + bias.astype(work, copy=False)[:, None]
    y = y.astype(input.dtype)
    if activation in ("silu", "swish"):
        y32 = y.astype(work)
        y = (y32 * _sigmoid(y32)).astype(input.dtype)
    return y, np.ascontiguousarray(padded[:, :, padded.shape[2] - (k - 1):])
