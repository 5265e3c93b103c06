"""Each pass, alone: it changes the graph it targets (and says so), and the optimized graph
computes what the unoptimized one does on random inputs."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_graphs import attention, conv_net, f32, frozen_bytes, mlp, random_feeds

from onemodel.runtime import GraphBuilder, Session
from onemodel.runtime.passes import (
    ActivationFusion,
    BatchNormFolding,
    CommonSubexpressionElimination,
    ConstantFolding,
    ConvResidualFusion,
    DeadCodeElimination,
    GemmWeightLayout,
    IdentityElimination,
    MatMulAddToGemm,
    MatMulEpilogueFusion,
    MatMulScaleFolding,
    PassManager,
    RMSNormFusion,
)
from onemodel.tensors import DType


def _check(graph, passes, expect_ops_gone=(), bindings=None):
    optimized = graph.copy()
    counts = PassManager(passes).run(optimized)
    assert any(counts.values()), f"no pass changed the graph: {counts}"
    ops = {n.op for n in optimized.nodes}
    for op in expect_ops_gone:
        assert op not in ops, f"{op} still in the graph"
    plain, fast = Session(graph, optimize=False), Session(optimized, optimize=False)
    for b in (1, 3, 5):
        feeds = random_feeds(graph, {"batch": b, "seq": 4, **(bindings or {})}, seed=b)
        for name, want in plain.run(feeds).items():
            np.testing.assert_allclose(fast.run(feeds)[name].numpy(), want.numpy(), rtol=1e-4,
                                       atol=1e-5)
    return optimized, counts


def _chain():
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", 6))
    w = b.initializer("w", f32(rng, 6, 6))
    dead = b.op("Exp", x)  # noqa: F841 - no output depends on it
    y = b.op("Identity", b.op("MatMul", x, w))
    y = b.op("Dropout", y)  # inference mode: an identity
    folded = b.op("Mul", b.op("Add", w, w), b.const(np.float32(0.5)))  # constant: w
    z = b.op("Add", b.op("Tanh", y), b.op("Tanh", y))  # a common subexpression
    b.output(b.op("MatMul", z, folded), "out")
    return b.build()


def test_dead_code():
    g, _ = _check(_chain(), [DeadCodeElimination()])
    assert "Exp" not in {n.op for n in g.nodes}


def test_identity_and_inference_dropout():
    _check(_chain(), [IdentityElimination()], expect_ops_gone=("Identity", "Dropout"))


def test_constant_folding():
    g, _ = _check(_chain(), [ConstantFolding()])
    assert sum(n.op == "Mul" for n in g.nodes) == 0
    assert sum(n.op == "Add" for n in g.nodes) == 1


def test_common_subexpressions():
    g, _ = _check(_chain(), [CommonSubexpressionElimination()])
    assert sum(n.op == "Tanh" for n in g.nodes) == 1


def test_batchnorm_folding_into_conv():
    _g, counts = _check(conv_net(), [BatchNormFolding()], expect_ops_gone=("BatchNormalization",))
    assert counts["batchnorm-folding"] == 2


def test_batchnorm_folding_into_gemm():
    rng = np.random.default_rng(1)
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", 5))
    for trans in (0, 1):
        w = f32(rng, 4, 5) if trans else f32(rng, 5, 4)
        x = b.op("Gemm", x, b.initializer(f"w{trans}", w), b.initializer(f"c{trans}", f32(rng, 4)),
                 transB=trans)
        x = b.op("BatchNormalization", x, *(b.initializer(f"{n}{trans}", v) for n, v in (
            ("s", rng.uniform(0.5, 2, 4).astype(np.float32)), ("o", f32(rng, 4)),
            ("m", f32(rng, 4)), ("v", rng.uniform(0.5, 2, 4).astype(np.float32)))))
        if not trans:
            x = b.op("Gemm", x, b.initializer("w_mid", f32(rng, 4, 5)))
    b.output(x, "out")
    _check(b.build(), [BatchNormFolding()], expect_ops_gone=("BatchNormalization",))


def test_matmul_add_to_gemm():
    g, _ = _check(mlp(sizes=(8, 6, 3)), [MatMulAddToGemm()], expect_ops_gone=("MatMul", "Add"))
    assert [n.op for n in g.nodes].count("Gemm") == 2


def test_matmul_add_is_left_alone_for_3d_inputs():
    g = attention()
    optimized = g.copy()
    MatMulAddToGemm().run(optimized)
    assert [n.op for n in optimized.nodes] == [n.op for n in g.nodes]


@pytest.mark.parametrize("activation", ["Relu", "Sigmoid", "Tanh", "HardSwish"])
def test_activation_fusion(activation):
    rng = np.random.default_rng(2)
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", 2, 5, 5))
    h = b.op(activation, b.op("Conv", x, b.initializer("w", f32(rng, 3, 2, 3, 3)),
                              b.initializer("b", f32(rng, 3)), pads=(1, 1, 1, 1)))
    h = b.op("Reshape", h, b.const([0, -1], "I64"))
    h = b.op(activation, b.op("Gemm", h, b.initializer("w2", f32(rng, 75, 4, scale=0.2))))
    b.output(h, "out")
    g, _ = _check(b.build(), [ActivationFusion()], expect_ops_gone=(activation,))
    assert {n.op for n in g.nodes} >= {"FusedConv", "FusedGemm"}


def _conv_clip(lo, hi, *, bound_input=False):
    rng = np.random.default_rng(4)
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", 2, 5, 5))
    y = b.op("Conv", x, b.initializer("w", f32(rng, 3, 2, 3, 3, scale=3.0)),
             b.initializer("b", f32(rng, 3)), pads=(1, 1, 1, 1))
    top = b.input("top", DType.F32, ()) if bound_input else b.const(np.float32(hi))
    b.output(b.op("Clip", y, b.const(np.float32(lo)), top), "out")
    return b.build()


def test_relu6_written_as_clip_fuses_into_the_conv_equal_to_torch():
    """Clip to the constant bounds 0 and 6 after a Conv (ReLU6, as PyTorch exports it)
    becomes FusedConv with activation Relu6; other bounds, or a bound given at run time,
    stay a Clip."""
    import torch

    graph = _conv_clip(0.0, 6.0)
    g, _ = _check(graph, [ActivationFusion()], expect_ops_gone=("Clip",))
    (fused,) = [n for n in g.nodes if n.op == "FusedConv"]
    assert fused.attrs["activation"] == "Relu6"
    x = np.random.default_rng(5).standard_normal((2, 2, 5, 5)).astype(np.float32)
    init = {k: torch.from_numpy(np.asarray(v)) for k, v in graph.initializers.items()}
    want = torch.nn.functional.relu6(torch.nn.functional.conv2d(
        torch.from_numpy(x), init["w"], init["b"], padding=1)).numpy()
    assert want.max() == 6.0 and want.min() == 0.0  # both bounds are reached
    for session in (Session(g, optimize=False), Session(graph)):
        np.testing.assert_allclose(session.run({"x": x})["out"].numpy(), want, rtol=1e-5,
                                   atol=1e-5)
    for other in (_conv_clip(0.0, 5.0), _conv_clip(-1.0, 6.0), _conv_clip(0.0, 6.0,
                                                                         bound_input=True)):
        optimized = other.copy()
        assert not ActivationFusion().run(optimized)


def _silu_stack(sites: int, *, swap_every: int = 2):
    """``sites`` Conv layers each followed by x * Sigmoid(x) (SiLU as PyTorch exports it: a
    Sigmoid and a Mul reading the Conv's output), the Mul's operands in both orders, then a
    Gemm with its own SiLU; and the same stack in torch."""
    import torch

    rng = np.random.default_rng(7)
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", 4, 5, 5))
    h, layers = x, []
    for k in range(sites):
        w, bias = f32(rng, 4, 4, 3, 3, scale=0.4), f32(rng, 4)
        layers.append((w, bias))
        y = b.op("Conv", h, b.initializer(f"w{k}", w), b.initializer(f"b{k}", bias),
                 pads=(1, 1, 1, 1))
        gate = b.op("Sigmoid", y)
        h = b.op("Mul", gate, y) if k % swap_every else b.op("Mul", y, gate)
    h = b.op("Reshape", h, b.const([0, -1], "I64"))
    wg, bg = f32(rng, 100, 6, scale=0.2), f32(rng, 6)
    y = b.op("Gemm", h, b.initializer("wg", wg), b.initializer("bg", bg))
    b.output(b.op("Mul", y, b.op("Sigmoid", y)), "out")

    def torch_stack(feed):
        t = torch.from_numpy(feed)
        for w, bias in layers:
            t = torch.nn.functional.silu(torch.nn.functional.conv2d(
                t, torch.from_numpy(w), torch.from_numpy(bias), padding=1))
        t = t.reshape(t.shape[0], -1) @ torch.from_numpy(wg) + torch.from_numpy(bg)
        return torch.nn.functional.silu(t).numpy()
    return b.build(), torch_stack


def test_silu_written_as_sigmoid_and_mul_fuses_at_every_site_equal_to_torch():
    """Each Conv or Gemm whose output only a Sigmoid and the Mul by it read becomes one node
    with activation Silu: all 25 sites in one pass call (more than the pass manager's rounds),
    and the result is torch's silu(conv) with the default passes and the plugins installed."""
    graph, torch_stack = _silu_stack(25)
    g, counts = _check(graph, [ActivationFusion()], expect_ops_gone=("Sigmoid", "Mul"))
    assert counts["activation-fusion"] == 26
    assert [n.attrs["activation"] for n in g.nodes if n.op in ("FusedConv", "FusedGemm")] == \
        ["Silu"] * 26
    x = np.random.default_rng(8).standard_normal((3, 4, 5, 5)).astype(np.float32) * 3
    want = torch_stack(x)
    for session in (Session(g, optimize=False), Session(graph)):
        np.testing.assert_allclose(session.run({"x": x})["out"].numpy(), want, rtol=1e-4,
                                   atol=1e-5)


def _conv_gate(reads):
    """A Conv, a Sigmoid of its output and a Mul of the two, plus what ``reads`` adds."""
    rng = np.random.default_rng(9)
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", 2, 5, 5))
    y = b.op("Conv", x, b.initializer("w", f32(rng, 3, 2, 3, 3)), b.initializer("b", f32(rng, 3)))
    gate = b.op("Sigmoid", y)
    b.output(b.op("Mul", y, gate) if reads != "other" else b.op("Mul", b.op("Neg", y), gate),
             "out")
    if reads == "gate":
        b.output(b.op("Tanh", gate), "also")
    elif reads == "conv":
        b.output(b.op("Tanh", y), "also")
    elif reads == "output":
        b.output(y, "also")
    return b.build()


@pytest.mark.parametrize("reads", ["gate", "conv", "output", "other"])
def test_silu_is_not_fused_when_anything_else_reads_its_parts(reads):
    """The gate or the Conv's output read elsewhere (or an output of the graph), or a Mul of
    the gate by another value: no SiLU, nothing changes."""
    optimized = _conv_gate(reads).copy()
    assert not ActivationFusion().run(optimized)
    assert "FusedConv" not in {n.op for n in optimized.nodes}


@pytest.mark.parametrize("bounds", [(np.nan, 6.0), (0.0, np.nan)])
@pytest.mark.parametrize("chained", [False, True])
def test_a_clip_to_a_nan_bound_is_not_fused(bounds, chained):
    """A fused program writes an omitted Clip bound as nan, so a Clip whose constant bound IS
    NaN (np.maximum with NaN: every element NaN) must stay a Clip, alone or in a chain."""
    from onemodel.runtime.passes.fusion import ElementwiseFusion

    b = GraphBuilder()
    x = b.input("x", DType.F32, (4, 8))
    y = b.op("Clip", b.op("Tanh", x) if chained else x, b.const(np.float32(bounds[0])),
             b.const(np.float32(bounds[1])))
    b.output(y, "out")
    graph = b.build()
    optimized = graph.copy()
    ElementwiseFusion().run(optimized)
    assert "Clip" in {n.op for n in optimized.nodes}
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}
    got = Session(graph).run(feeds)["out"].numpy()
    assert np.isnan(got).all()  # as the Clip op's reference kernel computes it
    np.testing.assert_array_equal(got, Session(graph, optimize=False).run(feeds)["out"].numpy())


def test_full_pipeline_on_every_model():
    from onemodel.runtime.session import default_passes

    for graph in (mlp(sizes=(10, 8, 4)), conv_net(), attention(), _chain()):
        _check(graph, default_passes())


def test_passes_come_from_the_registry_and_declare_their_changes(isolated_registry):
    from onemodel.runtime.session import default_passes

    passes = default_passes()
    assert [p.name for p in passes] == ["identity", "constant-folding", "cse", "batchnorm-folding",
                                        "batchnorm-to-affine", "conv-affine-folding",
                                        "matmul-add-to-gemm", "matmul-scale-folding",
                                        "sibling-matmul-merge", "rms-norm-fusion",
                                        "channel-layer-norm-fusion", "activation-fusion",
                                        "gemm-weight-layout", "dead-code"]
    assert all(p.changes for p in passes)


def test_a_plugin_pass_runs_in_sessions(isolated_registry):
    from onemodel.runtime.passes import Pass
    from onemodel.tensors import registry
    from onemodel.tensors.registry import hookimpl

    class TanhToRelu(Pass):
        changes = "replaces Tanh with Relu (a test of plugin passes)"

        def run(self, graph):
            hits = [n for n in graph.nodes if n.op == "Tanh"]
            for n in hits:
                n.op = "Relu"
            return bool(hits)

    class Plugin:
        @hookimpl
        def onemodel_register_passes(self, register):
            register("tanh-to-relu", TanhToRelu, order=5)

    registry.register_plugin(Plugin(), "test-pass")
    s = Session(_chain())
    assert s.optimizations["tanh-to-relu"] == 1
    assert "Tanh" not in {n.op for n in s.graph.nodes}


def _deep_mlp(layers=30, width=6):
    """``layers`` MatMul+Add+Relu blocks: one site per block for Gemm and activation fusion."""
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    h = b.input("x", DType.F32, ("batch", width))
    for i in range(layers):
        w = b.initializer(f"w{i}", f32(rng, width, width, scale=1 / np.sqrt(width)))
        h = b.op("Relu", b.op("Add", b.op("MatMul", h, w), b.initializer(f"b{i}", f32(rng, width))))
    b.output(h, "out")
    return b.build()


def _deep_conv_bn(blocks=25, c=3):
    rng = np.random.default_rng(4)
    b = GraphBuilder()
    h = b.input("x", DType.F32, ("batch", c, 5, 5))
    for i in range(blocks):
        h = b.op("Conv", h, b.initializer(f"w{i}", f32(rng, c, c, 3, 3, scale=0.15)),
                 b.initializer(f"cb{i}", f32(rng, c, scale=0.1)), pads=(1, 1, 1, 1))
        h = b.op("BatchNormalization", h, *(b.initializer(f"{n}{i}", v) for n, v in (
            ("s", rng.uniform(0.5, 1.5, c).astype(np.float32)), ("o", f32(rng, c, scale=0.1)),
            ("m", f32(rng, c, scale=0.1)), ("v", rng.uniform(0.5, 1.5, c).astype(np.float32)))))
    b.output(h, "out")
    return b.build()


def test_every_site_is_rewritten_past_twenty():
    """30 Gemm+Relu and 25 Conv+BN sites: all of them, none left behind by a round cap."""
    from onemodel.runtime.session import default_passes

    g, counts = _check(_deep_mlp(), default_passes(),
                       expect_ops_gone=("MatMul", "Add", "Relu", "Gemm"))
    assert [n.op for n in g.nodes] == ["FusedGemm"] * 30
    assert counts["matmul-add-to-gemm"] == 30 and counts["activation-fusion"] == 30
    g, counts = _check(_deep_conv_bn(), default_passes(), expect_ops_gone=("BatchNormalization",))
    assert [n.op for n in g.nodes] == ["Conv"] * 25
    assert counts["batchnorm-folding"] == 25


def test_each_pass_rewrites_all_matches_in_one_call():
    g = _deep_mlp()
    result = MatMulAddToGemm().run(g)
    assert result.modified and result.rewrites == 30
    assert ActivationFusion().run(g).rewrites == 30
    assert not MatMulAddToGemm().run(g)
    g = _deep_conv_bn()
    assert BatchNormFolding().run(g).rewrites == 25


def test_integer_matmul_add_is_not_made_a_gemm():
    b = GraphBuilder()
    x = b.input("x", DType.I64, ("batch", 3))
    w = b.initializer("w", np.arange(12, dtype=np.int64).reshape(3, 4))
    b.output(b.op("Add", b.op("MatMul", x, w), b.initializer("b", np.arange(4, dtype=np.int64))),
             "out")
    g = b.build()
    assert not MatMulAddToGemm().run(g.copy())
    s = Session(g)
    x_val = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int64)
    got = s.run({"x": x_val})["out"].numpy()
    np.testing.assert_array_equal(got, x_val @ np.arange(12).reshape(3, 4) + np.arange(4))
    assert {n.op for n in s.graph.nodes} == {"MatMul", "Add"}


def test_a_rewrite_that_changes_a_shape_is_refused():
    """same_spec is the shape-rule check every rewrite passes: it refuses a node whose result
    differs in shape or dtype from the value it would replace, or that the op rejects."""
    from onemodel.runtime.graph import Node
    from onemodel.runtime.passes.base import same_spec
    from onemodel.tensors import TensorSpec

    specs = {"a": TensorSpec((2, 3), DType.F32), "b": TensorSpec((3, 4), DType.F32),
             "i": TensorSpec((2, 3), DType.I64), "j": TensorSpec((3, 4), DType.I64)}
    gemm = Node("Gemm", ["a", "b"], ["y"])
    assert same_spec(gemm, specs, [TensorSpec((2, 4), DType.F32)])
    assert not same_spec(gemm, specs, [TensorSpec((4, 2), DType.F32)])
    assert not same_spec(gemm, specs, [TensorSpec((2, 4), DType.F64)])
    assert not same_spec(Node("Gemm", ["i", "j"], ["y"]), specs, [TensorSpec((2, 4), DType.I64)])


def test_the_manager_warns_when_it_hits_its_cap():
    from onemodel.runtime.passes import Pass, PassManager
    from onemodel.runtime.passes.base import FixpointWarning

    class Flip(Pass):
        name = "flip"
        changes = "turns Tanh into Sigmoid and back (never settles)"

        def run(self, graph):
            for n in graph.nodes:
                if n.op in ("Tanh", "Sigmoid"):
                    n.op = "Sigmoid" if n.op == "Tanh" else "Tanh"
            return True

    with pytest.warns(FixpointWarning, match="fixpoint in 3 rounds"):
        counts = PassManager([Flip()], max_rounds=3).run(_chain())
    assert counts == {"flip": 3}


def _chains():
    """Elementwise chains over a conv output: bias, scale, residual add, clip, activations."""
    rng = np.random.default_rng(5)
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", 3, 6, 6))
    h = b.op("Conv", x, b.initializer("w", f32(rng, 4, 3, 3, 3, scale=0.3)), pads=(1, 1, 1, 1))
    bias = b.initializer("bias", f32(rng, 1, 4, 1, 1))
    y = b.op("Mul", b.op("Add", h, bias), b.const(np.float32(0.5)))
    y = b.op("Clip", b.op("Add", y, h), b.const(np.float32(-1.0)), b.const(np.float32(1.5)))
    y = b.op("Sigmoid", y)
    z = b.op("Tanh", b.op("Erf", b.op("Sub", y, b.const(np.float32(0.25)))))
    b.output(z, "out")
    b.output(b.op("Relu", b.op("Neg", h)), "side")
    return b.build()


def test_elementwise_fusion_makes_one_node_per_chain():
    from onemodel.runtime.passes.fusion import ElementwiseFusion

    g, counts = _check(_chains(), [ElementwiseFusion()])
    assert counts == {"elementwise-fusion": 2}
    ops = [n.op for n in g.nodes if n.op != "Identity"]  # the builder names outputs so
    assert ops == ["Conv", "FusedElementwise", "FusedElementwise"]
    main = next(n for n in g.nodes if n.op == "FusedElementwise")
    assert main.attrs["program"][:2] == ["Add x0 x1", "Mul t0 x2"]
    assert main.attrs["program"][2:4] == ["Add t1 x0", "Clip t2 -1.0 1.5"]  # residual: x0 again


def test_elementwise_fusion_leaves_shared_and_integer_values():
    from onemodel.runtime.passes.fusion import ElementwiseFusion

    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", 4))
    i = b.input("i", DType.I64, ("batch", 4))
    shared = b.op("Relu", x)
    b.output(b.op("Add", shared, shared), "a")  # Relu's value is read twice by one node: fine
    b.output(b.op("Neg", shared), "b")  # ... but also by another: not fused
    b.output(b.op("Abs", b.op("Neg", i)), "c")  # integers stay
    g = b.build()
    assert not ElementwiseFusion().run(g)


def test_a_residual_sum_joins_the_chain():
    from onemodel.runtime.passes.fusion import ElementwiseFusion

    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", 5))
    y = b.input("y", DType.F32, ("batch", 5))
    b.output(b.op("Relu", b.op("Sum", x, y)), "out")
    g, _ = _check(b.build(), [ElementwiseFusion()], expect_ops_gone=("Sum", "Relu"))
    fused = next(n for n in g.nodes if n.op == "FusedElementwise")
    assert fused.attrs["program"] == ["Add x0 x1", "Relu t0"]


def test_parameterized_activations_and_constant_powers_join_chains():
    """HardSigmoid/LeakyRelu carry their attributes and Pow its constant exponent as literals;
    HardSwish, HardSigmoid and LeakyRelu become a FusedElementwise node even alone (their
    references make several passes), a Relu alone stays, a Pow with a tensor exponent stays."""
    from onemodel.runtime.passes.fusion import ElementwiseFusion

    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", 3, 4))
    b.output(b.op("Mul", x, b.op("HardSigmoid", x, alpha=0.25, beta=0.4)), "se")
    b.output(b.op("HardSwish", x), "hs")
    cube = b.op("Pow", x, b.const(np.float32(3.0)))
    b.output(b.op("Add", x, b.op("Mul", cube, b.const(np.float32(0.044715)))), "cubic")
    b.output(b.op("LeakyRelu", b.op("Add", x, x), alpha=0.1), "leaky")
    b.output(b.op("Pow", x, b.initializer("p", np.full((1, 4), 2.0, np.float32))), "pow")
    b.output(b.op("Relu", x), "relu")
    b.output(b.op("HardSigmoid", x), "hsig")
    b.output(b.op("Sigmoid", x), "sig")  # float32: alone too
    b.output(b.op("Sigmoid", b.input("d", DType.F64, ("batch", 4))), "sig64")  # float64: stays
    g, _ = _check(b.build(), [ElementwiseFusion()])
    programs = sorted(n.attrs["program"] for n in g.nodes if n.op == "FusedElementwise")
    assert programs == sorted([
        ["HardSigmoid x0 0.25 0.4", "Mul x0 t0"], ["HardSwish x0"],
        ["Pow x0 3.0", "Mul t0 x1", "Add x0 t1"], ["Add x0 x0", "LeakyRelu t0 0.1"],
        ["HardSigmoid x0 0.2 0.5"], ["Sigmoid x0"]])
    assert sorted(n.op for n in g.nodes if n.op in ("Pow", "Relu", "Sigmoid")) == [
        "Pow", "Relu", "Sigmoid"]


def test_a_lone_float32_mul_is_fused_for_its_buffer_a_lone_add_is_not():
    """A squeeze-and-excitation scale (channels' weights broadcast over the planes) becomes a
    FusedElementwise node of its own in float32, for its planned buffer; a lone Add, and a
    float64 Mul, stay as they are. Values equal the unfused graph's (``_check``)."""
    from onemodel.runtime.passes.fusion import ElementwiseFusion

    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", 4, 5, 5))
    s = b.input("s", DType.F32, ("batch", 4, 1, 1))
    b.output(b.op("Mul", x, s), "scaled")
    b.output(b.op("Add", x, x), "added")
    d = b.input("d", DType.F64, ("batch", 4))
    b.output(b.op("Mul", d, d), "squared64")
    g, _ = _check(b.build(), [ElementwiseFusion()])
    assert [n.attrs["program"] for n in g.nodes if n.op == "FusedElementwise"] == [
        ["Mul x0 x1"]]
    assert sorted(n.op for n in g.nodes if n.op in ("Add", "Mul")) == ["Add", "Mul"]


def test_a_producer_read_only_by_the_chain_joins_it():
    """Gelu written out after a bias Add: x = MatMul + b feeds both the Div and the last Mul, so
    the chain is a DAG over x; the Add is absorbed. A producer also read elsewhere, or of a
    smaller (broadcast) shape, stays."""
    from onemodel.runtime.passes.fusion import ElementwiseFusion

    rng = np.random.default_rng(2)
    b = GraphBuilder()
    h = b.input("h", DType.F32, ("batch", 4, 6))
    x = b.op("Add", b.initializer("bias", f32(rng, 6)), b.op("MatMul", h, b.initializer(
        "w", f32(rng, 6, 6))))
    erf = b.op("Erf", b.op("Div", x, b.const(np.float32(1.4142135))))
    gelu = b.op("Mul", b.op("Mul", x, b.op("Add", erf, b.const(np.float32(1.0)))),
                b.const(np.float32(0.5)))
    b.output(gelu, "gelu")
    shared = b.op("Add", h, h)  # also a graph output: stays
    b.output(shared, "shared")
    b.output(b.op("Mul", b.op("Tanh", shared), shared), "tanh")
    small = b.op("Neg", b.initializer("v", f32(rng, 6)))  # (6,): not recomputed per element
    b.output(b.op("Mul", b.op("Add", b.op("Sigmoid", h), small), small), "small")
    g, _ = _check(b.build(), [ElementwiseFusion()])
    programs = {n.outputs[0]: n.attrs["program"] for n in g.nodes if n.op == "FusedElementwise"}
    assert programs[gelu] == ["Add x0 x1", "Div t0 x2", "Erf t1", "Add t2 x3", "Mul t0 t3",
                              "Mul t4 x4"]
    assert [n.op for n in g.nodes if n.op in ("Add", "Neg")] == ["Add", "Neg"]


def test_identity_removes_casts_to_the_dtype_the_input_has():
    """F32->F32 Casts (llama's RMSNorm tail) go, keeping a graph output's name; a Cast that
    changes the dtype stays."""
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", 5))
    h = b.input("h", DType.F16, ("batch", 5))
    w = b.initializer("w", f32(rng, 5))
    y = b.op("Cast", b.op("Mul", x, w), to=DType.F32)
    half = b.op("Cast", y, to=DType.F16)  # changes the dtype: stays
    b.output(b.op("Add", half, h), "sum16")
    b.output(b.op("Cast", b.op("Tanh", y), to=DType.F32), "act")  # graph output: name kept
    b.output(b.op("Cast", h, to=DType.F16), "passthrough")
    g, _ = _check(b.build(), [IdentityElimination()])
    # the input passed to an output keeps one node (an Identity) that writes the output's name
    assert sorted(n.op for n in g.nodes) == ["Add", "Cast", "Identity", "Mul", "Tanh"]
    (to_half,) = [n for n in g.nodes if n.op == "Cast"]
    assert to_half.attrs["to"] == DType.F16
    assert to_half.inputs == next(n for n in g.nodes if n.op == "Mul").outputs
    (passthrough,) = [n for n in g.nodes if n.op == "Identity"]
    assert (passthrough.inputs, passthrough.outputs) == (["h"], ["passthrough"])
    assert next(n for n in g.nodes if n.op == "Tanh").outputs == ["act"]
    assert [o.name for o in g.outputs] == ["sum16", "act", "passthrough"]


def test_gemm_weights_read_transposed_are_stored_transposed_once():
    """Linear layers exported by PyTorch read their (out, in) weight with transB=1; the pass
    stores one (in, out) copy per weight, shared by the Gemms that read it, and leaves a B
    computed at run time alone. Results equal the unoptimized graph's."""
    rng = np.random.default_rng(4)
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", 6))
    w = b.initializer("w", f32(rng, 5, 6))
    bias = b.initializer("bias", f32(rng, 5))
    h = b.op("Relu", b.op("Gemm", x, w, bias, transB=1))
    b.output(b.op("Gemm", x, w, transB=1, alpha=0.5), "shared")
    fed = b.input("fed", DType.F32, (4, 5))
    b.output(b.op("Gemm", h, fed, transB=1), "computed")
    g, counts = _check(b.build(), [ActivationFusion(), GemmWeightLayout(),
                                   DeadCodeElimination()])
    assert counts["gemm-weight-layout"] == 2
    gemms = [n for n in g.nodes if n.op in ("Gemm", "FusedGemm")]
    assert [n.attrs.get("transB", 0) for n in gemms] == [0, 0, 1]
    assert gemms[0].inputs[1] == gemms[1].inputs[1] and "w" not in g.initializers
    np.testing.assert_array_equal(g.initializers[gemms[0].inputs[1]],
                                  b.build().initializers["w"].T)
    assert frozen_bytes(g.initializers[gemms[0].inputs[1]])


def _rms_graph(square="Pow", reciprocal="Div1", weight_first=True, axes=(-1,), shared=False,
               weight_const=True):
    """RMS normalization written out as exporters write it (LLaMA's, Mistral's, T5's)."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("rms")
    x = b.input("x", DType.F32, ("batch", "seq", 16))
    sq = b.op("Pow", x, b.const(np.float32(2.0))) if square == "Pow" else b.op("Mul", x, x)
    mean = b.op("ReduceMean", sq, b.const(list(axes), "I64"), keepdims=1)
    root = b.op("Sqrt", b.op("Add", mean, b.const(np.float32(1e-6))))
    if reciprocal == "Div1":
        normed = b.op("Mul", x, b.op("Div", b.const(np.float32(1.0)), root))
    elif reciprocal == "Reciprocal":
        normed = b.op("Mul", b.op("Reciprocal", root), x)
    else:  # x / sqrt(...)
        normed = b.op("Div", x, root)
    w = b.initializer("norm.weight", f32(rng, 16)) if weight_const else b.input(
        "w", DType.F32, (16,))
    b.output(b.op("Mul", w, normed) if weight_first else b.op("Mul", normed, w), "y")
    if shared:
        b.output(mean, "mean")
    return b.build()


@pytest.mark.parametrize("square,reciprocal,weight_first", [
    ("Pow", "Div1", True), ("Mul", "Reciprocal", False), ("Pow", "DivX", False)])
def test_rms_norm_written_out_becomes_one_node(square, reciprocal, weight_first):
    import torch

    graph = _rms_graph(square, reciprocal, weight_first)
    optimized, counts = _check(graph, [RMSNormFusion()])
    assert counts["rms-norm-fusion"] == 1
    assert [n.op for n in optimized.nodes if n.op != "Identity"] == ["RMSNormalization"]
    x = np.random.default_rng(1).standard_normal((2, 3, 16)).astype(np.float32)
    got = Session(graph).run({"x": x})["y"].numpy()  # the default passes, numba if installed
    w = torch.from_numpy(np.array(graph.initializers["norm.weight"]))
    want = torch.nn.functional.rms_norm(torch.from_numpy(x), (16,), w, eps=1e-6).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs", [{"axes": (1,)}, {"shared": True}, {"weight_const": False}])
def test_rms_norm_lookalikes_are_left_alone(kwargs):
    graph = _rms_graph(**kwargs)
    optimized = graph.copy()
    counts = PassManager([RMSNormFusion()]).run(optimized)
    assert counts["rms-norm-fusion"] == 0
    assert "RMSNormalization" not in {n.op for n in optimized.nodes}


def _residual_stack(blocks: int, *, activation: str | None = "Relu"):
    """``blocks`` residual blocks h = act(conv(h) + h), ``act`` Relu (ResNet) or none
    (MobileNetV2), and the torch function computing the same."""
    rng = np.random.default_rng(5)
    b = GraphBuilder()
    h = b.input("x", DType.F32, ("batch", 4, 5, 5))
    params = []
    for k in range(blocks):
        w, bias = f32(rng, 4, 4, 3, 3, scale=0.3), f32(rng, 4)
        params.append((w, bias))
        y = b.op("Conv", h, b.initializer(f"w{k}", w), b.initializer(f"b{k}", bias),
                 pads=(1, 1, 1, 1))
        h = b.op("Add", y, h) if k % 2 else b.op("Add", h, y)  # the addends either way round
        if activation:
            h = b.op(activation, h)
    b.output(h, "out")

    def torch_stack(x):
        import torch

        t = torch.from_numpy(x)
        for w, bias in params:
            t = torch.nn.functional.conv2d(t, torch.from_numpy(w), torch.from_numpy(bias),
                                           padding=1) + t
            if activation:
                t = torch.relu(t)
        return t.numpy()
    return b.build(), torch_stack


@pytest.mark.parametrize("activation", ["Relu", None])
def test_residual_adds_fuse_into_the_conv_at_every_site_equal_to_torch(activation):
    """Each Conv whose only reader is an Add of a value of its shape (a residual block), and
    the Relu that alone reads the sum, become one FusedConv(X, W, B, Z): all 25 sites in one
    pass call, equal to torch's conv2d(h) + h (then relu)."""
    graph, torch_stack = _residual_stack(25, activation=activation)
    gone = ("Add", "Relu") if activation else ("Add",)
    g, counts = _check(graph, [ConvResidualFusion()], expect_ops_gone=gone)
    assert counts["conv-residual-fusion"] == 25
    fused = [n for n in g.nodes if n.op == "FusedConv"]
    assert len(fused) == 25 and {n.attrs["activation"] for n in fused} == {activation or ""}
    assert all(n.inputs[3] in (g.inputs[0].name, *(m.outputs[0] for m in fused))
               for n in fused)
    x = np.random.default_rng(9).standard_normal((3, 4, 5, 5)).astype(np.float32)
    want = torch_stack(x)
    for session in (Session(g, optimize=False), Session(graph)):  # (sums grow block by block)
        np.testing.assert_allclose(session.run({"x": x})["out"].numpy(), want, rtol=1e-4,
                                   atol=1e-6 * float(np.abs(want).max()))


def test_a_sum_of_two_convolutions_fuses_one_of_them():
    """Add(conv_a(x), conv_b(x)): one Conv takes the other's output as Z; the other stays a
    Conv, and the graph still computes the sum."""
    rng = np.random.default_rng(6)
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", 3, 4, 4))
    ya = b.op("Conv", x, b.initializer("wa", f32(rng, 5, 3, 1, 1)))
    yb = b.op("Conv", x, b.initializer("wb", f32(rng, 5, 3, 3, 3)), pads=(1, 1, 1, 1))
    b.output(b.op("Add", ya, yb), "out")
    g, counts = _check(b.build(), [ConvResidualFusion()], expect_ops_gone=("Add",))
    assert counts["conv-residual-fusion"] == 1
    assert sorted(n.op for n in g.nodes if n.op != "Identity") == ["Conv", "FusedConv"]
    fused = next(n for n in g.nodes if n.op == "FusedConv")
    assert len(fused.inputs) == 4 and fused.inputs[2] == ""  # no bias: its place kept empty


@pytest.mark.parametrize("case", ["broadcast", "read_twice", "output", "shared_sum"])
def test_residual_fusion_leaves_what_it_cannot_fuse(case):
    """An addend that broadcasts (a per-channel shift), a Conv output read by anything else
    or a graph output, stay an Add; an activation read by anything else stays separate."""
    rng = np.random.default_rng(7)
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", 3, 4, 4))
    y = b.op("Conv", x, b.initializer("w", f32(rng, 3, 3, 3, 3)), pads=(1, 1, 1, 1))
    if case == "broadcast":
        b.output(b.op("Add", y, b.initializer("shift", f32(rng, 1, 3, 1, 1))), "out")
    elif case == "read_twice":
        b.output(b.op("Add", y, x), "out")
        b.output(b.op("Tanh", y), "other")
    elif case == "output":
        b.output(b.op("Add", y, x), "out")
        b.output(y, "conv")
    else:  # the Relu's input also a graph output: the Add fuses, the Relu stays
        s = b.op("Add", y, x)
        b.output(b.op("Relu", s), "out")
        b.output(s, "sum")
    graph = b.build()
    optimized = graph.copy()
    counts = PassManager([ConvResidualFusion()]).run(optimized)
    ops = sorted(n.op for n in optimized.nodes if n.op != "Identity")  # (outputs' names)
    if case == "shared_sum":
        assert counts["conv-residual-fusion"] == 1 and ops == ["FusedConv", "Relu"]
        assert next(n for n in optimized.nodes if n.op == "FusedConv").attrs["activation"] == ""
    else:
        assert counts["conv-residual-fusion"] == 0 and "FusedConv" not in ops
    feeds = random_feeds(graph, {"batch": 2}, seed=1)
    plain, fast = Session(graph, optimize=False), Session(optimized, optimize=False)
    for name, want in plain.run(feeds).items():
        np.testing.assert_allclose(fast.run(feeds)[name].numpy(), want.numpy(), rtol=1e-5,
                                   atol=1e-6)


def _linear_stack(form: str, layers: int = 25):
    """``layers`` Linear layers on (batch, 5, 6) activations (MatMul by a constant (6, 6), the
    Add of a constant bias row, either way round) each followed by the activation ``form``
    writes out: GELU as nn.GELU exports it ("gelu", Div by sqrt 2) or as BERT's gelu
    ("bert_gelu", x * 0.5 first, a Mul by 1/sqrt 2), "relu", or nothing ("bias")."""
    rng = np.random.default_rng(11)
    b = GraphBuilder()
    h = b.input("x", DType.F32, ("batch", 5, 6))
    params = []
    for k in range(layers):
        w, bias = f32(rng, 6, 6, scale=0.5), f32(rng, 6)
        params.append((w, bias))
        y = b.op("MatMul", h, b.initializer(f"w{k}", w))
        c = b.initializer(f"c{k}", bias)
        y = b.op("Add", y, c) if k % 2 else b.op("Add", c, y)
        if form == "gelu":
            e = b.op("Erf", b.op("Div", y, b.const(np.float32(np.sqrt(2)))))
            y = b.op("Mul", b.op("Mul", y, b.op("Add", e, b.const(np.float32(1)))),
                     b.const(np.float32(0.5)))
        elif form == "bert_gelu":
            e = b.op("Erf", b.op("Mul", y, b.const(np.float32(np.sqrt(0.5)))))
            y = b.op("Mul", b.op("Mul", y, b.const(np.float32(0.5))),
                     b.op("Add", e, b.const(np.float32(1))))
        elif form == "relu":
            y = b.op("Relu", y)
        h = y
    b.output(h, "out")

    def torch_stack(x):
        import torch

        t = torch.from_numpy(x)
        for w, bias in params:
            t = t @ torch.from_numpy(w) + torch.from_numpy(bias)
            if form in ("gelu", "bert_gelu"):
                t = torch.nn.functional.gelu(t)
            elif form == "relu":
                t = torch.relu(t)
        return t.numpy()
    return b.build(), torch_stack


@pytest.mark.parametrize(("form", "activation"), [("gelu", "Gelu"), ("bert_gelu", "Gelu"),
                                                  ("relu", "Relu"), ("bias", "")])
def test_matmul_bias_and_activation_fuse_at_every_site_equal_to_torch(form, activation):
    """Each MatMul of 3-D activations by constant weights, the Add of its constant bias row
    and the activation that alone reads the sum (GELU in PyTorch's two written-out forms)
    become one FusedMatMul: all 25 sites in one pass call, equal to torch's Linear layers."""
    graph, torch_stack = _linear_stack(form)
    gone = {"gelu": ("Add", "Erf", "Div", "Mul"), "bert_gelu": ("Add", "Erf", "Mul"),
            "relu": ("Add", "Relu"), "bias": ("Add",)}[form]
    g, counts = _check(graph, [MatMulEpilogueFusion()], expect_ops_gone=gone)
    assert counts["matmul-epilogue-fusion"] == 25
    fused = [n for n in g.nodes if n.op == "FusedMatMul"]
    assert len(fused) == 25 and {n.attrs["activation"] for n in fused} == {activation}
    assert all(len(n.inputs) == 3 for n in fused)
    x = np.random.default_rng(3).standard_normal((3, 5, 6)).astype(np.float32)
    want = torch_stack(x)
    for session in (Session(g, optimize=False), Session(graph)):  # (without an activation
        # the values grow layer by layer)
        np.testing.assert_allclose(session.run({"x": x})["out"].numpy(), want, rtol=1e-4,
                                   atol=1e-6 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("case", ["bias_at_run_time", "bias_broadcasts", "not_sqrt2",
                                  "erf_read_twice", "weights_at_run_time"])
def test_matmul_epilogue_fusion_leaves_what_is_not_a_bias_or_gelu(case):
    """A bias given at run time or of another shape than a row of the columns, a Div by
    another constant than sqrt 2, GELU's Erf read by anything else, or weights given at run
    time: no FusedMatMul takes them (a lone activation after an unfused Add stays too)."""
    rng = np.random.default_rng(12)
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", 5, 6))
    w = b.input("w", DType.F32, (6, 4)) if case == "weights_at_run_time" else \
        b.initializer("w", f32(rng, 6, 4))
    if case == "bias_at_run_time":
        c = b.input("c", DType.F32, (4,))
    elif case == "bias_broadcasts":
        c = b.initializer("c", f32(rng, 5, 4))
    else:
        c = b.initializer("c", f32(rng, 4))
    y = b.op("Add", b.op("MatMul", x, w), c)
    if case in ("not_sqrt2", "erf_read_twice"):
        e = b.op("Erf", b.op("Div", y, b.const(np.float32(2.0 if case == "not_sqrt2"
                                                          else np.sqrt(2)))))
        y = b.op("Mul", b.op("Mul", y, b.op("Add", e, b.const(np.float32(1)))),
                 b.const(np.float32(0.5)))
        if case == "erf_read_twice":
            b.output(e, "erf")
    b.output(y, "out")
    graph = b.build()
    optimized = graph.copy()
    counts = PassManager([MatMulEpilogueFusion()]).run(optimized)
    fused = [n for n in optimized.nodes if n.op == "FusedMatMul"]
    if case in ("not_sqrt2", "erf_read_twice"):  # the bias still fuses, the GELU stays
        assert counts["matmul-epilogue-fusion"] == 1 and fused[0].attrs["activation"] == ""
        assert "Erf" in {n.op for n in optimized.nodes}
    else:
        assert counts["matmul-epilogue-fusion"] == 0 and not fused
    feeds = random_feeds(graph, {"batch": 2}, seed=4)
    plain, fast = Session(graph, optimize=False), Session(optimized, optimize=False)
    for name, want in plain.run(feeds).items():
        np.testing.assert_allclose(fast.run(feeds)[name].numpy(), want.numpy(), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("case", ["bias", "no_bias", "scalar", "row_of_rank_three", "bias_left"])
def test_a_layer_scale_folds_into_the_linear_before_it(case, fused):
    """A Mul by a constant row of scales after a MatMul by constant weights (with its bias,
    fused or not) becomes the weights' columns and the bias scaled: ConvNeXt's layer scale
    after its second Linear, Whisper's query scale after its bias. The result equals
    (x @ W + b) * g, and the weights the file gave are left as they were (another node may
    read them)."""
    rng = np.random.default_rng(13)
    w, bias = f32(rng, 6, 4), f32(rng, 4)
    g = {"scalar": np.array(0.25, np.float32), "row_of_rank_three": f32(rng, 1, 1, 4)}.get(
        case, f32(rng, 4))
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", 5, 6))
    y = b.op("MatMul", x, b.initializer("w", w))
    if case == "bias_left":
        y = b.op("Add", b.initializer("c", bias), y)
    elif case != "no_bias":
        y = b.op("Add", y, b.initializer("c", bias))
    b.output(b.op("Mul", b.initializer("g", g), y), "out")
    b.output(b.op("MatMul", x, b.initializer("w", w)), "plain")  # the weights read again
    passes = [MatMulEpilogueFusion(), MatMulScaleFolding()] if fused and case != "no_bias" \
        else [MatMulScaleFolding()]  # unfused: the bias Add stays, the scale folded before it
    gone = ("Mul", "Add") if fused or case == "no_bias" else ("Mul",)
    opt, counts = _check(b.build(), passes, expect_ops_gone=gone)
    assert counts["matmul-scale-folding"] == 1
    np.testing.assert_array_equal(opt.initializers["w"], w)
    xv = np.random.default_rng(14).standard_normal((3, 5, 6)).astype(np.float32)
    want = xv @ w + (0 if case == "no_bias" else bias)
    want = want * g
    got = Session(opt, optimize=False).run({"x": xv})["out"].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["after_gelu", "per_row", "adds_axes", "scale_at_run_time",
                                  "biased_value_read_twice", "bias_per_row"])
def test_a_scale_that_is_not_a_row_after_a_linear_stays(case):
    """A Mul after an activation, by scales that differ along the rows, by a constant of more
    axes than the product, or by a scale given at run time stays a Mul; so does one after a
    bias Add whose value is read elsewhere too, or whose bias is not a row."""
    rng = np.random.default_rng(15)
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", 6))
    y = b.op("MatMul", x, b.initializer("w", f32(rng, 6, 4)))
    if case == "after_gelu":
        y = b.op("Relu", b.op("Add", y, b.initializer("c", f32(rng, 4))))
    elif case == "biased_value_read_twice":
        y = b.op("Add", y, b.initializer("c", f32(rng, 4)))
        b.output(y, "biased")
    elif case == "bias_per_row":
        y = b.op("Add", y, b.initializer("c", f32(rng, 3, 4)))
    g = {"per_row": lambda: b.initializer("g", f32(rng, 3, 1)),
         "adds_axes": lambda: b.initializer("g", f32(rng, 1, 1, 4)),
         "scale_at_run_time": lambda: b.input("g", DType.F32, (4,)),
         "after_gelu": lambda: b.initializer("g", f32(rng, 4)),
         "biased_value_read_twice": lambda: b.initializer("g", f32(rng, 4)),
         "bias_per_row": lambda: b.initializer("g", f32(rng, 4))}[case]()
    b.output(b.op("Mul", y, g), "out")
    graph = b.build()
    optimized = graph.copy()
    counts = PassManager([MatMulEpilogueFusion(), MatMulScaleFolding()]).run(optimized)
    assert counts["matmul-scale-folding"] == 0
    assert "Mul" in {n.op for n in optimized.nodes}
    feeds = random_feeds(graph, {"batch": 3}, seed=5)
    plain, fast = Session(graph, optimize=False), Session(optimized, optimize=False)
    for name, want in plain.run(feeds).items():
        np.testing.assert_allclose(fast.run(feeds)[name].numpy(), want.numpy(), rtol=1e-5,
                                   atol=1e-6)
