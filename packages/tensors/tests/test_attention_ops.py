"""The attention family (ops/attention.py) against PyTorch: forward and gradients of Attention,
RotaryEmbedding, Swish and SwiGLU; CausalConvWithState against a grouped conv1d; shape rules on
a symbolic sequence axis; the errors that name what is wrong."""

from __future__ import annotations

import math

import numpy as np
import pytest

from onemodel.tensors import OPS, DimExpr, DType, ShapeError, Tensor, TensorSpec
from onemodel.tensors.dispatch import dispatch
from onemodel.tensors.errors import DTypeError, OneModelError
from onemodel.tensors.symbolic import evaluate

torch = pytest.importorskip("torch")
TF = torch.nn.functional

S = DimExpr.symbol("seq")
B = DimExpr.symbol("batch")


def _t(a, grad=False):
    return Tensor(np.asarray(a), requires_grad=grad)


def _attention(q, k, v, mask=None, past_k=None, past_v=None, nonpad=None, **attrs):
    ins = [q, k, v, mask, past_k, past_v, nonpad]
    while ins[-1] is None:
        ins.pop()
    return dispatch("Attention", ins, attrs)


def _torch_attention(q, k, v, mask=None, is_causal=False, scale=None, softcap=0.0):
    """softmax(q k^T * scale (soft-capped) + mask) v in PyTorch; GQA by repeating KV heads."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    if not softcap:
        return TF.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                               scale=scale)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale
    s = softcap * torch.tanh(s / softcap)
    if mask is not None:
        s = s + mask if mask.dtype != torch.bool else s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ v


def _rand(rng, *shape):
    return rng.standard_normal(shape)


CONFIGS = [
    # (q heads, kv heads, q length, kv length, head size, v head size, attrs, mask kind)
    (4, 4, 5, 7, 8, 8, {}, None),
    (4, 2, 5, 7, 8, 6, {}, None),  # GQA, different v head size
    (4, 1, 3, 3, 8, 8, {"is_causal": 1}, None),  # MQA, causal
    (2, 2, 4, 6, 8, 8, {"scale": 0.3}, "float"),
    (4, 2, 4, 6, 8, 8, {}, "bool"),
    (2, 2, 4, 6, 8, 8, {"softcap": 2.0}, "float"),
]


@pytest.mark.parametrize("hq,hkv,sq,skv,d,dv,attrs,mask_kind", CONFIGS)
def test_attention_forward_and_gradients_match_torch(hq, hkv, sq, skv, d, dv, attrs, mask_kind):
    rng = np.random.default_rng(0)
    q, k, v = _rand(rng, 2, hq, sq, d), _rand(rng, 2, hkv, skv, d), _rand(rng, 2, hkv, skv, dv)
    mask = None
    if mask_kind == "float":
        mask = _rand(rng, 1, hq, sq, skv)
    elif mask_kind == "bool":
        mask = rng.random((sq, skv)) > 0.3
        mask[:, 0] = True  # every query row keeps a key (torch gives NaN rows otherwise)
    ours = [_t(x, grad=True) for x in (q, k, v)]
    m = None if mask is None else _t(mask, grad=mask_kind == "float")
    y = _attention(*ours, m, **attrs)[0]
    theirs = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    tm = None if mask is None else torch.tensor(mask, requires_grad=mask_kind == "float")
    ty = _torch_attention(*theirs, tm, is_causal=bool(attrs.get("is_causal")),
                          scale=attrs.get("scale"), softcap=attrs.get("softcap", 0.0))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-10)
    w = rng.standard_normal(y.shape)
    (y * _t(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    for a, b in zip(ours + ([m] if mask_kind == "float" else []),
                    theirs + ([tm] if mask_kind == "float" else [])):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-9, atol=1e-10)


def test_attention_3d_inputs_with_past_cache_match_torch():
    """Packed (B, S, H * D) inputs, a KV cache of 3 past positions and the bottom-right causal
    frontier: query i sees keys j <= i + 3. present_key/value are the concatenated caches."""
    rng = np.random.default_rng(1)
    b, hq, hkv, sq, skv, past, d = 2, 4, 2, 2, 2, 3, 4
    q, k, v = _rand(rng, b, sq, hq * d), _rand(rng, b, skv, hkv * d), _rand(rng, b, skv, hkv * d)
    pk, pv = _rand(rng, b, hkv, past, d), _rand(rng, b, hkv, past, d)
    ours = [_t(x, grad=True) for x in (q, k, v, pk, pv)]
    y, present_k, present_v, _ = _attention(*ours[:3], None, *ours[3:], is_causal=1,
                                            q_num_heads=hq, kv_num_heads=hkv)
    tq, tk, tv, tpk, tpv = [torch.tensor(x, requires_grad=True) for x in (q, k, v, pk, pv)]
    heads = lambda x, h: x.reshape(b, -1, h, d).transpose(1, 2)
    kf, vf = torch.cat([tpk, heads(tk, hkv)], 2), torch.cat([tpv, heads(tv, hkv)], 2)
    allowed = torch.arange(past + skv)[None, :] <= torch.arange(sq)[:, None] + past
    ty = _torch_attention(heads(tq, hq), kf, vf, allowed).transpose(1, 2).reshape(b, sq, -1)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(present_k.numpy(), kf.detach().numpy())
    np.testing.assert_array_equal(present_v.numpy(), vf.detach().numpy())
    w = rng.standard_normal(y.shape)
    (y * _t(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    for a, t in zip(ours, (tq, tk, tv, tpk, tpv)):
        np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_attention_external_cache_window_and_empty_rows():
    """nonpad_kv_seqlen: keys past each row's length are padding and the causal frontier is
    bottom-right per batch row; with a left window of 1, each query sees two keys. A batch row
    whose valid keys are fewer than the queries gets zero rows (no NaN)."""
    rng = np.random.default_rng(2)
    q, k, v = _rand(rng, 2, 2, 3, 4), _rand(rng, 2, 2, 6, 4), _rand(rng, 2, 2, 6, 4)
    lengths = np.array([5, 1], np.int64)
    y, *_ = _attention(_t(q), _t(k), _t(v), None, None, None, _t(lengths), is_causal=1,
                       left_window_size=1)
    for bi, n in enumerate(lengths):
        pos = np.arange(3)[:, None] + n - 3
        j = np.arange(6)[None, :]
        allowed = torch.tensor((j <= pos) & (pos - j <= 1) & (j < n))
        rows = allowed.any(-1)
        ty = _torch_attention(*(torch.tensor(x[bi:bi + 1]) for x in (q, k, v)),
                              allowed)[0].numpy()
        np.testing.assert_allclose(y.numpy()[bi][:, rows], ty[:, rows.numpy()], rtol=1e-10)
        assert not y.numpy()[bi][:, ~rows.numpy()].any()  # fully masked rows are zeros
    assert np.isfinite(y.numpy()).all()


def test_attention_qk_matmul_output_modes_and_softmax_precision():
    rng = np.random.default_rng(3)
    q, k, v = _rand(rng, 1, 2, 3, 4), _rand(rng, 1, 2, 5, 4), _rand(rng, 1, 2, 5, 4)
    mask = _rand(rng, 3, 5)
    raw = q @ k.transpose(0, 1, 3, 2) / 2  # scale 1/sqrt(4)
    capped = 1.5 * np.tanh(raw / 1.5)
    probs = torch.softmax(torch.tensor(capped + mask), -1).numpy()
    for mode, want in enumerate((raw, capped, capped + mask, probs)):
        out = _attention(_t(q), _t(k), _t(v), _t(mask), softcap=1.5, qk_matmul_output_mode=mode)
        np.testing.assert_allclose(out[3].numpy(), want, rtol=1e-12, atol=1e-12)
    q16, k16, v16 = (x.astype(np.float16) for x in (q, k, v))
    y16 = _attention(_t(q16), _t(k16), _t(v16), softmax_precision=1)[0]
    assert y16.dtype is DType.F16
    ty = _torch_attention(*(torch.tensor(x) for x in (q, k, v))).numpy()
    np.testing.assert_allclose(y16.numpy(), ty, rtol=1e-2, atol=1e-2)


def test_attention_shape_rule_on_symbolic_sequences():
    f32 = DType.F32
    specs = [TensorSpec((B, 8, S, 16), f32), TensorSpec((B, 2, S, 16), f32),
             TensorSpec((B, 2, S, 12), f32), TensorSpec((S, S), DType.BOOL),
             TensorSpec((B, 2, 5, 16), f32), TensorSpec((B, 2, 5, 12), f32)]
    y, pk, pv, qk = OPS["Attention"].infer(specs, {"is_causal": 1})
    assert y.shape == (B, 8, S, 12) and y.dtype is f32
    assert pk.shape == (B, 2, S + 5, 16) and pv.shape == (B, 2, S + 5, 12)
    assert qk.shape == (B, 8, S, S + 5)
    assert evaluate(pk.shape[2], {"seq": 3}) == 8
    packed = [TensorSpec((B, S, 64), f32), TensorSpec((B, S, 32), f32),
              TensorSpec((B, S, 48), f32)]
    (y, pk, _, _) = OPS["Attention"].infer(packed, {"q_num_heads": 4, "kv_num_heads": 2})
    assert y.shape == (B, S, 96) and pk.shape == (B, 2, S, 16)
    (out,) = OPS["RotaryEmbedding"].infer(
        [TensorSpec((B, S, 64), f32), TensorSpec((128, 8), f32), TensorSpec((128, 8), f32),
         TensorSpec((B, S), DType.I64)], {"num_heads": 4})
    assert out.shape == (B, S, 64)
    (out,) = OPS["TensorScatter"].infer([TensorSpec((B, 2, 64, 8), f32),
                                         TensorSpec((B, 2, S, 8), f32)])
    assert out.shape == (B, 2, 64, 8)
    out, state = OPS["CausalConvWithState"].infer([TensorSpec((B, 6, S), f32),
                                                   TensorSpec((6, 1, 4), f32)])
    assert out.shape == (B, 6, S) and state.shape == (B, 6, 3)
    out, state = OPS["LinearAttention"].infer(
        [TensorSpec((B, S, 32), f32)] * 3 + [None, TensorSpec((B, S, 4), f32)],
        {"q_num_heads": 4, "kv_num_heads": 4, "update_rule": "gated"})
    assert out.shape == (B, S, 32) and state.shape == (B, 4, 8, 8)


@pytest.mark.parametrize("specs,attrs,message", [
    ([(2, 6, 4, 8), (2, 4, 4, 8), (2, 4, 4, 8)], {}, "multiple of the 4 key/value heads"),
    ([(2, 4, 4, 8), (2, 4, 4, 6), (2, 4, 4, 8)], {}, "head sizes of Q and K"),
    ([(2, 4, 24), (2, 4, 24), (2, 4, 24)], {}, "q_num_heads must be a positive"),
    ([(2, 4, 24), (2, 4, 24), (2, 4, 24)], {"q_num_heads": 5, "kv_num_heads": 3},
     "not a multiple of its 5 heads"),
    ([(2, 4, 4, 8), (2, 4, 6, 8), (2, 4, 6, 8), (4, 7)], {}, "covers 7 keys"),
    ([(2, 4, 4, 8), (2, 4, 6, 8), (2, 4, 6, 8)], {"qk_matmul_output_mode": 4},
     "qk_matmul_output_mode"),
])
def test_attention_shape_errors_name_the_problem(specs, attrs, message):
    ts = [TensorSpec(s, DType.F32) for s in specs]
    with pytest.raises(ShapeError, match=message):
        OPS["Attention"].infer(ts, attrs)


def test_attention_dtype_errors():
    f, h = DType.F32, DType.F16
    with pytest.raises(DTypeError, match="K must have Q's dtype F32"):
        OPS["Attention"].infer([TensorSpec((1, 1, 2, 4), f), TensorSpec((1, 1, 2, 4), h),
                                TensorSpec((1, 1, 2, 4), f)])
    with pytest.raises(DTypeError, match="Q must be a floating tensor"):
        OPS["Attention"].infer([TensorSpec((1, 1, 2, 4), DType.I64)] * 3)
    with pytest.raises(DTypeError, match="softmax_precision"):
        OPS["Attention"].infer([TensorSpec((1, 1, 2, 4), f)] * 3, {"softmax_precision": 7})


def _torch_rope(x, cos, sin, interleaved, rot):
    xr, rest = x[..., :rot], x[..., rot:]
    x1, x2 = (xr[..., 0::2], xr[..., 1::2]) if interleaved else xr.chunk(2, -1)
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    out = torch.stack((real, imag), -1).flatten(-2) if interleaved else torch.cat((real, imag), -1)
    return torch.cat((out, rest), -1)


@pytest.mark.parametrize("interleaved,rot,three_d", [(0, 0, False), (1, 0, False), (0, 4, True),
                                                     (1, 4, False)])
def test_rotary_embedding_forward_and_gradient_match_torch(interleaved, rot, three_d):
    rng = np.random.default_rng(4)
    b, h, s, d = 2, 3, 5, 8
    r = rot or d
    angles = rng.uniform(0, 6, (10, r // 2))
    cos, sin = np.cos(angles), np.sin(angles)
    pos = rng.integers(0, 10, (b, s))
    x = _rand(rng, b, h, s, d)
    xin = x.transpose(0, 2, 1, 3).reshape(b, s, h * d) if three_d else x
    ours = _t(xin, grad=True)
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rot}
    if three_d:
        attrs["num_heads"] = h
    y = dispatch("RotaryEmbedding", [ours, _t(cos), _t(sin), _t(pos)], attrs)
    tx = torch.tensor(xin, requires_grad=True)
    t4 = tx.reshape(b, s, h, d).transpose(1, 2) if three_d else tx
    tc, ts = torch.tensor(cos)[pos][:, None], torch.tensor(sin)[pos][:, None]
    ty = _torch_rope(t4, tc, ts, interleaved, r)
    if three_d:
        ty = ty.transpose(1, 2).reshape(b, s, h * d)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    w = rng.standard_normal(y.shape)
    (y * _t(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(ours.grad.numpy(), tx.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_rotary_embedding_refuses_positions_outside_the_tables():
    x = _t(np.zeros((1, 1, 2, 4)))
    table = _t(np.ones((3, 2)))
    with pytest.raises(ShapeError, match=r"position_ids must lie in \[0, 3\)"):
        dispatch("RotaryEmbedding", [x, table, table, _t(np.array([[0, 3]]))], {})


def test_swish_and_swiglu_match_torch():
    rng = np.random.default_rng(5)
    a, b = _rand(rng, 3, 7) * 4, _rand(rng, 3, 7)
    for alpha in (1.0, 0.6):
        ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
        oa, ob = _t(a, grad=True), _t(b, grad=True)
        y = dispatch("Swish", [oa], {"alpha": alpha})
        ty = ta * torch.sigmoid(alpha * ta)
        np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-12)
        y.sum().backward()
        ty.sum().backward()
        np.testing.assert_allclose(oa.grad.numpy(), ta.grad.numpy(), rtol=1e-12)
        oa.grad = ta.grad = None
        y = dispatch("SwiGLU", [oa, ob], {"alpha": alpha})
        ty = ta * torch.sigmoid(alpha * ta) * tb
        np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-12)
        (y * y).sum().backward()
        (ty * ty).sum().backward()
        np.testing.assert_allclose(oa.grad.numpy(), ta.grad.numpy(), rtol=1e-12)
        np.testing.assert_allclose(ob.grad.numpy(), tb.grad.numpy(), rtol=1e-12)
    with pytest.raises(ShapeError, match="does not broadcast"):
        OPS["SwiGLU"].infer([TensorSpec((3, 7), DType.F32), TensorSpec((1, 7), DType.F32)])


def test_causal_conv_with_state_matches_grouped_conv1d_and_carries_state():
    """Running a sequence in two chunks with the state carried between them equals one run,
    and equals a depthwise conv1d over the left-zero-padded sequence, with fused SiLU."""
    rng = np.random.default_rng(6)
    x, w, bias = _rand(rng, 2, 3, 9), _rand(rng, 3, 1, 4), _rand(rng, 3)
    y, state = dispatch("CausalConvWithState", [_t(x), _t(w), _t(bias)], {"activation": "silu"})
    ty = TF.silu(TF.conv1d(TF.pad(torch.tensor(x), (3, 0)), torch.tensor(w), torch.tensor(bias),
                           groups=3))
    np.testing.assert_allclose(y.numpy(), ty.numpy(), rtol=1e-12)
    np.testing.assert_array_equal(state.numpy(), x[:, :, -3:])
    y1, s1 = dispatch("CausalConvWithState", [_t(x[:, :, :5]), _t(w), _t(bias)],
                      {"activation": "silu"})
    y2, s2 = dispatch("CausalConvWithState", [_t(x[:, :, 5:]), _t(w), _t(bias), s1],
                      {"activation": "silu"})
    np.testing.assert_allclose(np.concatenate([y1.numpy(), y2.numpy()], 2), y.numpy(),
                               rtol=1e-12)
    np.testing.assert_array_equal(s2.numpy(), state.numpy())


def test_tensor_scatter_linear_and_circular_and_bounds():
    rng = np.random.default_rng(7)
    cache, update = _rand(rng, 2, 2, 5, 3), _rand(rng, 2, 2, 3, 3)
    out = dispatch("TensorScatter", [_t(cache), _t(update), _t(np.array([1, 2]))], {})
    want = torch.tensor(cache).clone()
    want[0, :, 1:4], want[1, :, 2:5] = torch.tensor(update[0]), torch.tensor(update[1])
    np.testing.assert_array_equal(out.numpy(), want.numpy())
    out = dispatch("TensorScatter", [_t(cache), _t(update), _t(np.array([4, 0]))],
                   {"mode": "circular"})
    want = torch.tensor(cache).clone()
    want[0, :, [4, 0, 1]], want[1, :, 0:3] = torch.tensor(update[0]), torch.tensor(update[1])
    np.testing.assert_array_equal(out.numpy(), want.numpy())
    with pytest.raises(OneModelError, match="leaves the cache of 5 positions"):
        dispatch("TensorScatter", [_t(cache), _t(update), _t(np.array([3, 0]))], {})
    with pytest.raises(ShapeError, match="axis cannot be 0"):
        OPS["TensorScatter"].infer([TensorSpec((2, 5), DType.F32)] * 2, {"axis": 0})


def test_linear_attention_gated_delta_matches_a_torch_recurrence():
    rng = np.random.default_rng(8)
    b, t, hq, hkv, dk, dv = 2, 4, 4, 2, 3, 5
    q, k, v = _rand(rng, b, t, hq * dk), _rand(rng, b, t, hkv * dk), _rand(rng, b, t, hkv * dv)
    decay, beta = -rng.uniform(0, 1, (b, t, hkv)), rng.uniform(0, 1, (b, t, hkv))
    state0 = _rand(rng, b, hkv, dk, dv).astype(np.float32)
    f32 = [x.astype(np.float32) for x in (q, k, v)]
    out, state = dispatch("LinearAttention",
                          [*(_t(x) for x in f32), _t(state0), _t(decay.astype(np.float32)),
                           _t(beta.astype(np.float32))],
                          {"q_num_heads": hq, "kv_num_heads": hkv})
    heads = lambda x, h: torch.tensor(x).reshape(b, t, h, -1).transpose(1, 2)
    tq, tk, tv = heads(f32[0], hq), heads(f32[1], hkv), heads(f32[2], hkv)
    s = torch.tensor(state0)
    outs = []
    for i in range(t):
        g = torch.exp(torch.tensor(decay[:, i], dtype=torch.float32))[..., None, None]
        be = torch.tensor(beta[:, i], dtype=torch.float32)[..., None]
        s = g * s
        delta = be * (tv[:, :, i] - torch.einsum("bhdm,bhd->bhm", s, tk[:, :, i]))
        s = s + tk[:, :, i, :, None] * delta[..., None, :]
        outs.append(torch.einsum("bhd,bhdm->bhm", tq[:, :, i],
                                 s.repeat_interleave(hq // hkv, 1)) / math.sqrt(dk))
    want = torch.stack(outs, 2).transpose(1, 2).reshape(b, t, -1)
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state.numpy(), s.numpy(), rtol=1e-5, atol=1e-5)


def test_eager_calls_refuse_what_the_shape_rule_refuses():
    """Eager dispatch checks shape rules once per dtype signature, so the kernels check the
    attribute values and input combinations themselves."""
    x = _t(np.zeros((1, 1, 2, 4)))
    with pytest.raises(ShapeError, match="nonpad_kv_seqlen cannot be combined"):
        _attention(x, x, x, None, x, x, _t(np.array([2])))
    with pytest.raises(DTypeError, match="softmax_precision"):
        _attention(x, x, x, softmax_precision=3)
    with pytest.raises(ShapeError, match="left_window_size"):
        _attention(x, x, x, left_window_size=-2)
    q = _t(np.zeros((1, 2, 4), np.float32))
    with pytest.raises(ShapeError, match="takes no decay input"):
        dispatch("LinearAttention", [q, q, q, None, q],
                 {"q_num_heads": 1, "kv_num_heads": 1, "update_rule": "linear"})
    with pytest.raises(ShapeError, match="activation must be"):
        dispatch("CausalConvWithState", [q, _t(np.zeros((1, 1, 2), np.float32))],
                 {"activation": "relu"})
    with pytest.raises(ShapeError, match="mode must be"):
        dispatch("TensorScatter", [q, q], {"mode": "wrap"})


def test_bfloat16_softmax_precision_rounds_like_torch():
    from onemodel.tensors.ops.attention import _round_bf16

    rng = np.random.default_rng(9)
    x = np.concatenate([rng.standard_normal(1000) * 10.0 ** rng.integers(-30, 30, 1000),
                        [0.0, -0.0, np.inf, -np.inf, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8]])
    x = x.astype(np.float32)
    want = torch.tensor(x).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(_round_bf16(x), want)
    q, k, v = (_rand(rng, 1, 2, 3, 4) for _ in range(3))
    y = _attention(*(_t(a.astype(np.float32)) for a in (q, k, v)), softmax_precision=16)[0]
    tq, tk, tv = (torch.tensor(a, dtype=torch.float32) for a in (q, k, v))
    p = torch.softmax((tq @ tk.transpose(-1, -2) / 2).to(torch.bfloat16).float(), -1)
    ty = p.to(torch.bfloat16).float() @ tv
    np.testing.assert_allclose(y.numpy(), ty.numpy(), rtol=1e-6, atol=1e-6)


def test_attention_gradient_is_itself_differentiable():
    """The gradient rule is written with ops, so create_graph=True gives second derivatives
    (GQA, soft cap, float mask and causal frontier together), checked against torch."""
    rng = np.random.default_rng(10)
    q, k, v, m = _rand(rng, 1, 4, 3, 4), _rand(rng, 1, 2, 3, 4), _rand(rng, 1, 2, 3, 4), \
        _rand(rng, 3, 3)
    ours = [_t(x, grad=True) for x in (q, k, v)]
    y = _attention(*ours, _t(m), is_causal=1, softcap=1.5)[0]
    (y * y).sum().backward(create_graph=True)
    gq = ours[0].grad
    for t in ours:
        t.grad = None
    gq.sum().backward()
    theirs = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    causal = torch.full((3, 3), float("-inf")).triu(1)
    ty = _torch_attention(*theirs, torch.tensor(m) + causal, softcap=1.5)
    (tgq,) = torch.autograd.grad((ty * ty).sum(), theirs[0], create_graph=True)
    tgq.sum().backward()
    np.testing.assert_allclose(gq.numpy(), tgq.detach().numpy(), rtol=1e-9, atol=1e-12)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-9, atol=1e-12)
