"""attention-fusion: attention written out as exporters write it becomes one FusedAttention
node, which computes what PyTorch's scaled_dot_product_attention does; lookalikes stay."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_graphs import attention

from onemodel.runtime import GraphBuilder, Session
from onemodel.runtime.passes import AttentionFusion, PassManager
from onemodel.tensors import DType

B, H, S, D = 2, 3, 5, 8


def _graph(scale="Mul", mask="right", kt="transpose", *, axis=-1, shared_scores=False,
           pv_order="pv", scale_value=0.125, mask_shape=(B, 1, 1, S)):
    """softmax(Q @ Kt * scale + mask) @ V over (B, H, S, D) inputs, written out node by node."""
    b = GraphBuilder("sdpa")
    q = b.input("q", DType.F32, (B, H, S, D))
    k = b.input("k", DType.F32, (B, H, S, D))
    v = b.input("v", DType.F32, (B, H, S, D))
    keys = b.op("Transpose", k, perm=(0, 1, 3, 2)) if kt == "transpose" else b.input(
        "kt", DType.F32, (B, H, D, S))
    scores = b.op("MatMul", q, keys)
    if scale == "Mul":
        scores = b.op("Mul", scores, b.const(np.float32(scale_value)))
    elif scale == "MulLeft":
        scores = b.op("Mul", b.const(np.float32(scale_value)), scores)
    elif scale == "Div":
        scores = b.op("Div", scores, b.const(np.float32(1 / scale_value)))
    elif scale == "Vector":  # not a scalar: not a scale
        scores = b.op("Mul", scores, b.const(np.full(S, scale_value, np.float32)))
    if mask:
        m = b.input("mask", DType.F32, mask_shape)
        scores = b.op("Add", scores, m) if mask == "right" else b.op("Add", m, scores)
    probs = b.op("Softmax", scores, axis=axis)
    if pv_order == "pv":
        b.output(b.op("MatMul", probs, v), "y")
    else:  # (B, H, D, S) @ probs: the probabilities on the right
        b.output(b.op("MatMul", b.op("Transpose", v, perm=(0, 1, 3, 2)), probs), "y")
    if shared_scores:
        b.output(scores, "scores")
    return b.build()


def _feeds(graph, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in graph.inputs:
        x = rng.standard_normal(tuple(v.shape)).astype(np.float32)
        if v.name == "mask":
            x = np.where(x > 0.8, np.float32(-np.inf), x).astype(np.float32)
        feeds[v.name] = x
    return feeds


def _fused(graph):
    optimized = graph.copy()
    counts = PassManager([AttentionFusion()]).run(optimized)
    return optimized, counts["attention-fusion"]


@pytest.mark.parametrize("scale", ["Mul", "MulLeft", "Div", None])
@pytest.mark.parametrize("mask", ["right", "left", None])
def test_written_out_attention_becomes_one_node_equal_to_torch(scale, mask):
    import torch

    graph = _graph(scale, mask)
    optimized, n = _fused(graph)
    assert n == 1
    ops = [x.op for x in optimized.nodes if x.op != "Identity"]
    assert ops == ["Transpose", "FusedAttention"]
    feeds = _feeds(graph)
    got = Session(optimized, optimize=False).run(feeds)["y"].numpy()
    plain = Session(graph, optimize=False).run(feeds)["y"].numpy()
    t = {k: torch.from_numpy(v) for k, v in feeds.items()}
    want = torch.nn.functional.scaled_dot_product_attention(
        t["q"], t["k"], t["v"], attn_mask=t.get("mask"),
        scale=0.125 if scale else 1.0).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs", [
    {"axis": 2},  # softmax over another axis
    {"shared_scores": True},  # the scores are read elsewhere (a graph output)
    {"pv_order": "vp"},  # the probabilities are the product's right operand
    {"scale": "Vector"},  # a per-key factor, not a scale
    {"mask_shape": (B, H, S, S, 1)},  # the mask broadcasts the scores up (a different shape)
])
def test_attention_lookalikes_are_left_alone(kwargs):
    graph = _graph(**kwargs) if "mask_shape" not in kwargs else _graph(
        mask_shape=(1, B, H, S, S))
    _, n = _fused(graph)
    assert n == 0


def test_the_runtime_attention_graph_fuses_under_default_passes():
    """With the default passes (the numba plugin's kernel where installed) a self-attention
    layer with symbolic batch and sequence runs fused at several sizes, equal to the unfused
    graph."""
    graph = attention()
    session = Session(graph)
    if "attention-fusion" not in session.optimizations:
        pytest.skip("no plugin registers attention-fusion (the numba plugin does)")
    assert session.optimizations["attention-fusion"] == 1
    plain = Session(graph, optimize=False)
    rng = np.random.default_rng(3)
    for batch, seq in ((1, 3), (2, 7), (3, 40)):  # 40: the BLAS path of the numba kernel
        x = rng.standard_normal((batch, seq, 16)).astype(np.float32)
        np.testing.assert_allclose(session.run({"input": x})["output"].numpy(),
                                   plain.run({"input": x})["output"].numpy(),
                                   rtol=1e-5, atol=1e-5)


def _masked_graph(shapes, *, read_partial=False):
    """softmax(Q @ Kt * 0.125 + m0 + m1 + ...) @ V with each mask added in turn (T5's decoder
    adds its position bias, then its causal mask)."""
    b = GraphBuilder("masks")
    q = b.input("q", DType.F32, (B, H, S, D))
    k = b.input("k", DType.F32, (B, H, S, D))
    v = b.input("v", DType.F32, (B, H, S, D))
    scores = b.op("Mul", b.op("MatMul", q, b.op("Transpose", k, perm=(0, 1, 3, 2))),
                  b.const(np.float32(0.125)))
    for i, shape in enumerate(shapes):
        m = b.input(f"mask{i}", DType.F32, shape)
        scores = b.op("Add", scores, m) if i % 2 == 0 else b.op("Add", m, scores)
        if read_partial and i == 0:
            b.output(scores, "partial")
    b.output(b.op("MatMul", b.op("Softmax", scores, axis=-1), v), "y")
    return b.build()


@pytest.mark.parametrize("shapes", [[(1, H, S, S), (B, 1, S, S)],
                                    [(1, H, S, S), (B, 1, 1, S), (S, S)]])
def test_masks_added_one_after_another_are_summed_into_one(shapes):
    import torch

    graph = _masked_graph(shapes)
    optimized, n = _fused(graph)
    assert n == 1
    ops = [x.op for x in optimized.nodes if x.op != "Identity"]
    assert ops.count("FusedAttention") == 1 and "Softmax" not in ops
    assert ops.count("Add") == len(shapes) - 1  # the masks' sum, computed once
    rng = np.random.default_rng(4)
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in
             [("q", (B, H, S, D)), ("k", (B, H, S, D)), ("v", (B, H, S, D))]}
    causal = np.triu(np.full((S, S), -np.inf, np.float32), 1)
    for i, shape in enumerate(shapes):
        m = rng.standard_normal(shape).astype(np.float32)
        # the last mask holds -inf above the diagonal (causal)
        feeds[f"mask{i}"] = m + causal if i == len(shapes) - 1 else m
    got = Session(optimized, optimize=False).run(feeds)["y"].numpy()
    plain = Session(graph, optimize=False).run(feeds)["y"].numpy()
    t = {key: torch.from_numpy(val) for key, val in feeds.items()}
    total = sum(t[f"mask{i}"] for i in range(len(shapes)))
    want = torch.nn.functional.scaled_dot_product_attention(t["q"], t["k"], t["v"],
                                                            attn_mask=total,
                                                            scale=0.125).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-6)


def test_masked_scores_read_elsewhere_stay():
    _, n = _fused(_masked_graph([(1, H, S, S), (B, 1, S, S)], read_partial=True))
    assert n == 0


@pytest.mark.parametrize("perm", [(0, 2, 1, 3), (0, 1, 3, 2)])
def test_the_transpose_that_gathers_the_heads_joins_the_node(perm):
    """A Transpose (0, 2, 1, 3) after the attention (the heads gathered back before the
    output projection's Reshape) becomes the fused node's transpose_output; another
    permutation stays a Transpose. Both equal torch's result, transposed the same way."""
    import torch

    b = GraphBuilder("gathered")
    q, k, v = (b.input(n, DType.F32, (B, H, S, D)) for n in ("q", "k", "v"))
    scores = b.op("Mul", b.op("MatMul", q, b.op("Transpose", k, perm=(0, 1, 3, 2))),
                  b.const(np.float32(0.125)))
    y = b.op("Transpose", b.op("MatMul", b.op("Softmax", scores, axis=-1), v), perm=perm)
    b.output(b.op("Reshape", y, b.const(np.array([B, -1, H * D if perm == (0, 2, 1, 3)
                                                  else S], np.int64))), "y")
    graph = b.build()
    optimized, n = _fused(graph)
    assert n == 1
    fused = [x for x in optimized.nodes if x.op == "FusedAttention"]
    gathered = perm == (0, 2, 1, 3)
    assert fused[0].attrs.get("transpose_output", 0) == int(gathered)
    assert ("Transpose" in {x.op for x in optimized.nodes if x is not fused[0]
                            and x.inputs[0] not in ("k",)}) != gathered
    feeds = _feeds(graph, seed=5)
    got = Session(optimized, optimize=False).run(feeds)["y"].numpy()
    t = {key: torch.from_numpy(val) for key, val in feeds.items()}
    want = torch.nn.functional.scaled_dot_product_attention(t["q"], t["k"], t["v"],
                                                            scale=0.125).permute(*perm)
    np.testing.assert_allclose(got, want.reshape(got.shape).numpy(), rtol=1e-5, atol=1e-6)
