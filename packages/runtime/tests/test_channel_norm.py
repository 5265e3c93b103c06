"""channel-layer-norm-fusion: a Transpose of (N, C, ...) data to channels-last, a
LayerNormalization over its last axis and the Transpose back (ConvNeXt's channels-first
LayerNorm) become one ChannelLayerNormalization node, which gives PyTorch's layer_norm over the
permuted tensor; lookalikes that would compute something else stay as they are."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_graphs import f32

from onemodel.runtime import GraphBuilder, Session
from onemodel.runtime.passes import ChannelLayerNormFusion, PassManager
from onemodel.tensors import DType

torch = pytest.importorskip("torch")


def _graph(rank=4, channels=6, *, to_last=None, to_first=None, bias=True, axis=-1,
           scale_input=False, stash_type=None, read_ln_twice=False, read_first_twice=False,
           square=False):
    rng = np.random.default_rng(rank)
    b = GraphBuilder("channel-norm")
    spatial = [5] * (rank - 2) if square else [f"s{i}" for i in range(rank - 2)]
    x = b.input("x", DType.F32, ("batch", channels, *spatial))
    to_last = to_last or [0, *range(2, rank), 1]
    to_first = to_first or [0, rank - 1, *range(1, rank - 1)]
    t = b.op("Transpose", x, perm=to_last)
    scale = b.input("scale", DType.F32, (channels,)) if scale_input else \
        b.initializer("scale", f32(rng, channels))
    inputs = [t, scale] + ([b.initializer("bias", f32(rng, channels))] if bias else [])
    attrs = {"axis": axis, "epsilon": 1e-3}
    if stash_type is not None:
        attrs["stash_type"] = stash_type
    y = b.op("LayerNormalization", *inputs, **attrs)
    if read_ln_twice:
        b.output(y, "normalized")
    if read_first_twice:
        b.output(b.op("Relu", t), "permuted")
    b.output(b.op("Tanh", b.op("Transpose", y, perm=to_first)), "out")
    return b.build()


def _torch(graph, x):
    init = graph.initializers
    t = torch.from_numpy(x)
    rank = x.ndim
    last = t.permute(0, *range(2, rank), 1)
    bias = torch.from_numpy(init["bias"]) if "bias" in init else None
    y = torch.nn.functional.layer_norm(last, (x.shape[1],), torch.from_numpy(init["scale"]),
                                       bias, eps=1e-3)
    return torch.tanh(y.permute(0, rank - 1, *range(1, rank - 1))).numpy()


@pytest.mark.parametrize("rank, bias", [(4, True), (4, False), (3, True), (5, True)])
def test_the_transposes_and_the_norm_become_one_channels_first_node(rank, bias):
    graph = _graph(rank, bias=bias)
    optimized = graph.copy()
    counts = PassManager([ChannelLayerNormFusion()]).run(optimized)
    assert counts["channel-layer-norm-fusion"] == 1
    ops = [n.op for n in optimized.nodes]
    assert ops.count("ChannelLayerNormalization") == 1
    assert "Transpose" not in ops and "LayerNormalization" not in ops
    fused, plain = Session(optimized, optimize=False), Session(graph, optimize=False)
    rng = np.random.default_rng(1)
    for size in (5, 1, 8):
        x = rng.standard_normal((2, 6, *[size + i for i in range(rank - 2)])).astype(np.float32)
        got = fused.run({"x": x})["out"].numpy()
        np.testing.assert_allclose(got, _torch(graph, x), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got, plain.run({"x": x})["out"].numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_the_default_passes_take_it():
    session = Session(_graph())
    assert session.optimizations.get("channel-layer-norm-fusion") == 1
    x = np.random.default_rng(2).standard_normal((3, 6, 4, 5)).astype(np.float32)
    x[0, 2, 1, 1] = np.nan  # one pixel's channels become NaN, the others stay finite
    got = session.run({"x": x})["out"].numpy()
    want = _torch(session.graph, x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("kwargs", [
    {"to_last": [0, 3, 2, 1]},                          # another permutation
    {"to_last": [0, 3, 2, 1], "square": True},          # ... over square planes: same shape
    {"to_first": [0, 3, 2, 1]},                         # not the way back
    {"to_first": [0, 3, 2, 1], "square": True},         # ... over square planes: same shape
    {"axis": 2},                                        # over the last two axes
    {"scale_input": True},                              # a scale given at run time
    {"stash_type": 0},                                  # statistics in the input's dtype
    {"read_ln_twice": True},                            # the channels-last value is read
    {"read_first_twice": True},                         # the permuted input is read
])
def test_lookalikes_stay(kwargs):
    graph = _graph(**kwargs)
    optimized = graph.copy()
    counts = PassManager([ChannelLayerNormFusion()]).run(optimized)
    assert counts["channel-layer-norm-fusion"] == 0
    assert "ChannelLayerNormalization" not in {n.op for n in optimized.nodes}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_reference_op_is_torchs_layer_norm_over_the_channels(dtype):
    from onemodel.tensors.ops import OPS

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 3, 4)).astype(dtype)
    scale, bias = rng.standard_normal(5).astype(dtype), rng.standard_normal(5).astype(dtype)
    got = OPS["ChannelLayerNormalization"].kernel(x, scale, bias, epsilon=1e-4)
    want = torch.nn.functional.layer_norm(torch.from_numpy(x).permute(0, 2, 3, 1), (5,),
                                          torch.from_numpy(scale), torch.from_numpy(bias),
                                          eps=1e-4).permute(0, 3, 1, 2).numpy()
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    out = np.full_like(x, np.nan)
    assert OPS["ChannelLayerNormalization"].kernel(x, scale, bias, epsilon=1e-4, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_the_shape_rule_wants_one_scale_per_channel():
    from onemodel.tensors.errors import ShapeError
    from onemodel.tensors.ops import OPS
    from onemodel.tensors.ops.base import TensorSpec

    rule = OPS["ChannelLayerNormalization"].shape_rule
    x = TensorSpec((2, 5, 3, 4), DType.F32)
    assert rule([x, TensorSpec((5,), DType.F32), None]).shape == (2, 5, 3, 4)
    with pytest.raises(ShapeError, match="Scale"):
        rule([x, TensorSpec((4,), DType.F32)])
    with pytest.raises(ShapeError, match="B"):
        rule([x, TensorSpec((5,), DType.F32), TensorSpec((1, 5), DType.F32)])
    with pytest.raises(ShapeError, match="spatial"):
        rule([TensorSpec((2, 5), DType.F32), TensorSpec((5,), DType.F32)])
