"""skip-layer-norm-fusion: a residual Add (with or without the bias Add before it) whose sum a
LayerNormalization over the last axis reads becomes one SkipLayerNormalization node, equal to
PyTorch's layer_norm of the same sum; its sum stays an output where anything else reads it;
lookalikes stay."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.runtime import GraphBuilder, Session
from onemodel.runtime.passes import PassManager, SkipLayerNormFusion
from onemodel.tensors import DType

B, S, C = 2, 5, 16
EPS = 1e-3


def _block(*, bias=True, reuse_sum=False, skip_shape=(B, S, C), axis=-1, scale_input=False,
           stats=False, dtype=DType.F32, bias_left=False, residual_left=False):
    """y = LayerNorm(x @ W (+ b) + r), written out as exporters write it; with ``reuse_sum``
    the sum is read again (a pre-norm block's residual stream): out = y @ W2 + sum."""
    np_dtype = dtype.numpy
    rng = np.random.default_rng(1)
    b = GraphBuilder("block")
    x = b.input("x", dtype, (B, S, C))
    r = b.input("r", dtype, skip_shape)
    h = b.op("MatMul", x, b.const(rng.standard_normal((C, C)).astype(np_dtype)))
    if bias:
        row = b.const(rng.standard_normal(C).astype(np_dtype))
        h = b.op("Add", row, h) if bias_left else b.op("Add", h, row)
    total = b.op("Add", r, h) if residual_left else b.op("Add", h, r)
    scale = b.input("scale", dtype, (C,)) if scale_input else \
        b.const(rng.uniform(0.5, 1.5, C).astype(np_dtype))
    shift = b.const(rng.standard_normal(C).astype(np_dtype))
    outs = b.op("LayerNormalization", total, scale, shift, axis=axis, epsilon=EPS,
                outputs=3 if stats else 1)
    y = outs[0] if stats else outs
    if reuse_sum:
        y = b.op("Add", b.op("MatMul", y, b.const(rng.standard_normal((C, C)).astype(
            np_dtype))), total)
    b.output(y, "y")
    if stats:
        b.output(outs[1], "mean")
    return b.build()


def _feeds(graph, seed=0):
    rng = np.random.default_rng(seed)
    return {v.name: rng.standard_normal(tuple(v.shape)).astype(v.dtype.numpy)
            for v in graph.inputs}


def _fused(graph):
    optimized = graph.copy()
    counts = PassManager([SkipLayerNormFusion()]).run(optimized)
    return optimized, counts["skip-layer-norm-fusion"]


def _torch_block(graph, feeds):
    """The block's output computed by PyTorch from the graph's own constants."""
    import torch

    consts = [np.asarray(v) for v in graph.initializers.values()]
    w, row, scale, shift = (torch.from_numpy(c) for c in consts[:4])
    x, r = torch.from_numpy(feeds["x"]), torch.from_numpy(feeds["r"])
    total = (x @ w + row) + r
    y = torch.nn.functional.layer_norm(total, (C,), scale, shift, eps=EPS)
    if len(consts) > 4:
        y = y @ torch.from_numpy(consts[4]) + total
    return y.numpy()


@pytest.mark.parametrize("reuse_sum", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("sides", ["right", "bias-left", "residual-left"])
def test_residual_add_and_norm_become_one_node_equal_to_torch(reuse_sum, sides):
    graph = _block(reuse_sum=reuse_sum, bias_left=sides == "bias-left",
                   residual_left=sides == "residual-left")
    optimized, n = _fused(graph)
    assert n == 1
    (fused,) = [x for x in optimized.nodes if x.op == "SkipLayerNormalization"]
    assert not [x for x in optimized.nodes if x.op in ("Add", "LayerNormalization")
                and x.outputs[0] in fused.inputs + fused.outputs]
    assert len([o for o in fused.outputs if o]) == (2 if reuse_sum else 1)
    assert fused.inputs[4], "the bias Add is taken in"
    feeds = _feeds(graph)
    got = Session(optimized, optimize=False).run(feeds)["y"].numpy()
    plain = Session(graph, optimize=False).run(feeds)["y"].numpy()
    np.testing.assert_allclose(got, _torch_block(graph, feeds), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("skip_shape", [(S, C), (1, S, C), (C,), (B, 1, C)])
def test_a_broadcast_residual_fuses_and_matches_the_unfused_graph(skip_shape):
    """Positions (S, C) or a row (C,) repeat over the batch; (B, 1, C) broadcasts inside the
    rows, which the reference kernel takes (numpy broadcasting)."""
    graph = _block(skip_shape=skip_shape, bias=False)
    optimized, n = _fused(graph)
    assert n == 1
    feeds = _feeds(graph)
    for session in (Session(optimized, optimize=False), Session(graph)):
        np.testing.assert_allclose(session.run(feeds)["y"].numpy(),
                                   Session(graph, optimize=False).run(feeds)["y"].numpy(),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs", [
    {"axis": 1},  # normalized over more than the last axis
    {"scale_input": True},  # a Scale computed at run time
    {"stats": True},  # the mean is read
    {"dtype": DType.F16},  # no kernel computes it the same way
])
def test_lookalikes_are_left_alone(kwargs):
    graph = _block(**kwargs)
    _, n = _fused(graph)
    assert n == 0


def test_every_site_of_a_deep_stack_fuses_in_one_call():
    """30 residual blocks (more than the pass manager's 20 rounds): all fused in one call, the
    sums kept where the next block reads them, the result equal to the unfused graph."""
    rng = np.random.default_rng(2)
    b = GraphBuilder("stack")
    x = b.input("x", DType.F32, (B, S, C))
    stream = x
    for _ in range(30):
        h = b.op("MatMul", b.op("LayerNormalization", stream,
                                b.const(rng.uniform(0.5, 1.5, C).astype(np.float32))),
                 b.const((rng.standard_normal((C, C)) * 0.3).astype(np.float32)))
        stream = b.op("Add", stream, h)
    b.output(b.op("LayerNormalization", stream, b.const(np.ones(C, np.float32))), "y")
    graph = b.build()
    optimized = graph.copy()
    pass_ = SkipLayerNormFusion()
    assert pass_.run(optimized).rewrites == 30
    assert sum(n.op == "SkipLayerNormalization" for n in optimized.nodes) == 30
    assert sum(n.op == "LayerNormalization" for n in optimized.nodes) == 1  # the first
    feeds = _feeds(graph)
    np.testing.assert_allclose(Session(optimized, optimize=False).run(feeds)["y"].numpy(),
                               Session(graph, optimize=False).run(feeds)["y"].numpy(),
                               rtol=1e-4, atol=1e-4)


def test_the_fused_node_under_default_passes_plans_buffers_and_matches():
    """With the default passes (the numba plugin registers the fusion and its kernel) a
    pre-norm block fuses, its other steps keep planned buffers, and repeated runs on new data
    give the unfused graph's result."""
    graph = _block(reuse_sum=True)
    session = Session(graph)
    if "skip-layer-norm-fusion" not in session.optimizations:
        pytest.skip("no plugin registers skip-layer-norm-fusion (the numba plugin does)")
    assert session.optimizations["skip-layer-norm-fusion"] == 1
    plain = Session(graph, optimize=False)
    feeds = _feeds(graph)
    plan = session.plan_for({k: v.shape for k, v in feeds.items()})
    assert any(step.buf >= 0 for step in plan.steps), "the MatMuls write planned buffers"
    for seed in range(3):
        feeds = _feeds(graph, seed)
        np.testing.assert_allclose(session.run(feeds)["y"].numpy(),
                                   plain.run(feeds)["y"].numpy(), rtol=1e-5, atol=1e-5)
