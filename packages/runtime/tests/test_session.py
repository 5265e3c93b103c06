"""Sessions run hand-built graphs, optimized and not, like eager execution of the same ops (and
like PyTorch for the MLP and the conv net), at several sizes of one symbolic axis."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from runtime_graphs import attention, conv_net, eager, mlp, random_feeds

from onemodel.runtime import Graph, Session
from onemodel.tensors import DType, OneModelError, Tensor

MODELS = {"mlp": mlp, "conv_net": conv_net, "attention": attention}


@pytest.mark.parametrize("optimize", [True, False], ids=["optimized", "plain"])
@pytest.mark.parametrize("model", list(MODELS))
def test_graph_matches_eager_at_several_batch_sizes(model, optimize):
    graph = MODELS[model]()
    session = Session.load(graph, optimize=optimize)
    for batch in (1, 2, 3, 7):
        bindings = {"batch": batch, "seq": 5}
        feeds = random_feeds(graph, bindings, seed=batch)
        got = session.run(feeds)["output"].numpy()
        want = eager(graph, feeds)["output"]
        assert got.shape == want.shape and got.shape[0] == batch
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_optimizations_happen_on_the_models():
    assert Session(mlp()).optimizations["activation-fusion"] >= 2
    conv = Session(conv_net())
    assert conv.optimizations["batchnorm-folding"] == 2
    assert not any(n.op == "BatchNormalization" for n in conv.graph.nodes)
    assert sum(n.op == "Shape" for n in conv.graph.nodes) == 1  # a symbolic flatten stays


def test_mlp_and_conv_net_match_torch():
    torch = pytest.importorskip("torch")
    g = mlp(sizes=(20, 30, 5))
    x = np.random.default_rng(3).standard_normal((4, 20)).astype(np.float32)
    init = {k: torch.from_numpy(np.array(v)) for k, v in g.initializers.items()}
    h = torch.relu(torch.from_numpy(x) @ init["fc0.weight"] + init["fc0.bias"])
    ref = h @ init["fc1.weight"] + init["fc1.bias"]
    np.testing.assert_allclose(Session(g).run({"input": x})["output"].numpy(), ref.numpy(),
                               rtol=1e-5, atol=1e-5)

    g = conv_net()
    i = {k: torch.from_numpy(np.array(v)) for k, v in g.initializers.items()}
    F = torch.nn.functional
    x = np.random.default_rng(4).standard_normal((3, 3, 16, 16)).astype(np.float32)
    h = F.conv2d(torch.from_numpy(x), i["c1.w"], i["c1.b"], padding=1)
    h = F.relu(F.batch_norm(h, i["bn1.mean"], i["bn1.var"], i["bn1.weight"], i["bn1.bias"]))
    h = F.max_pool2d(h, 2)
    h = F.conv2d(h, i["c2.w"], stride=2, padding=1)
    h = F.relu(F.batch_norm(h, i["bn2.mean"], i["bn2.var"], i["bn2.weight"], i["bn2.bias"]))
    h = F.avg_pool2d(h, 2).flatten(1)
    ref = F.linear(h, i["fc.w"], i["fc.b"])
    np.testing.assert_allclose(Session(g).run({"input": x})["output"].numpy(), ref.numpy(),
                               rtol=1e-4, atol=1e-5)


def test_inputs_outputs_and_feeds():
    s = Session(mlp(sizes=(4, 3)))
    assert [(i.name, i.dtype, i.shape) for i in s.inputs] == [("input", DType.F32, ("batch", 4))]
    assert [(o.name, o.shape) for o in s.outputs] == [("output", ("batch", 3))]
    x = np.ones((2, 4), np.float32)
    a = s.run({"input": x})["output"]
    b = s.run({"input": Tensor.from_numpy(x)}, outputs=["output"])["output"]
    assert isinstance(a, Tensor) and np.array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("feeds,message", [
    ({"inputs": np.ones((2, 4), np.float32)}, "unknown input 'inputs'; this graph's inputs are 'input'"),
    ({}, r"missing input 'input' \(F32\[batch, 4\]\)"),
    ({"input": np.ones((2, 4), np.float64)}, "input 'input' must have dtype F32, got F64"),
    ({"input": np.ones((2, 4, 1), np.float32)}, "input 'input' has rank 3"),
    ({"input": np.ones((2, 5), np.float32)}, "input 'input' axis 1 must be 4, got 5"),
    ({"input": [[1.0] * 4, [1.0]]}, "input .input.: cannot read a list as an array"),
])
def test_bad_feeds_name_the_input_and_axis(feeds, message):
    s = Session(mlp(sizes=(4, 3)))
    with pytest.raises(OneModelError, match=message):
        s.run(feeds)


def test_one_symbol_bound_to_two_sizes_is_an_error():
    from onemodel.runtime import GraphBuilder

    b = GraphBuilder()
    x = b.input("a", DType.F32, ("batch", 2))
    y = b.input("b", DType.F32, ("batch", 2))
    b.output(b.op("Add", x, y), "sum")
    s = Session(b.build())
    with pytest.raises(OneModelError, match="input 'b' axis 0 is 3, but symbol 'batch' is already "
                                            "2 from input 'a' axis 0"):
        s.run({"a": np.ones((2, 2), np.float32), "b": np.ones((3, 2), np.float32)})
    with pytest.raises(OneModelError, match="unknown output 'nope'"):
        s.run({"a": np.ones((2, 2), np.float32), "b": np.ones((2, 2), np.float32)}, ["nope"])


def test_plans_are_cached_and_bounded():
    s = Session(mlp(sizes=(4, 3)))
    s.max_plans = 3
    for n in range(1, 6):
        s.run({"input": np.ones((n, 4), np.float32)})
    assert len(s._plans) == 3
    plan = s.plan_for({"input": (5, 4)})
    assert plan is s.plan_for({"input": (5, 4)}) and plan.bindings == {"batch": 5}


def test_run_is_safe_from_several_threads():
    graph = attention()
    s = Session(graph)
    errors, results = [], {}
    feeds = {b: random_feeds(graph, {"batch": b, "seq": 3 + b}, seed=b) for b in (1, 2, 3, 4)}
    want = {b: eager(graph, f)["output"] for b, f in feeds.items()}

    def worker(tid):
        try:
            for i in range(25):
                b = 1 + (tid + i) % 4
                got = s.run(feeds[b])["output"].numpy()
                if not np.allclose(got, want[b], rtol=1e-5, atol=1e-5):
                    errors.append((tid, b))
            results[tid] = True
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 6


def test_text_form_shows_symbolic_shapes():
    text = str(conv_net())
    assert "input  input: F32[batch, 3, 16, 16]" in text
    assert "F32[batch, 8, 16, 16] = Conv(input, c1.w, c1.b)" in text


def test_validator_names_the_offending_node():
    from onemodel.runtime import GraphError, Node, ValueInfo

    g = Graph([ValueInfo("x", DType.F32, (2, 3))], [ValueInfo("y", DType.F32, (2, 3))],
              [Node("Add", ["x", "missing"], ["y"], {}, "adder")])
    with pytest.raises(GraphError, match="node adder \\(Add\\): input 'missing' is used before"):
        g.validate()
    g.nodes = [Node("MatMul", ["x", "x"], ["y"], {}, "mm")]
    with pytest.raises(GraphError, match=r"node mm \(MatMul\): MatMul: inner dimensions 3 and 2"):
        g.validate()
    g.nodes = [Node("Frobnicate", ["x"], ["y"], {}, "f")]
    with pytest.raises(GraphError, match="node f \\(Frobnicate\\): unknown op"):
        g.validate()
    g.nodes = [Node("Relu", ["x"], ["y"], {"alpha": 1}, "r")]
    with pytest.raises(GraphError, match="Relu has no attribute 'alpha'"):
        g.validate()
