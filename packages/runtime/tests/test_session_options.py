"""Session options as onnxruntime users know them: optimization levels, profiling to a Chrome
trace, feeds of any array-like kind, numpy outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from runtime_graphs import conv_net, eager, mlp, random_feeds

from onemodel.runtime import Session
from onemodel.tensors import OneModelError, Tensor


@pytest.mark.parametrize("model", [mlp, conv_net])
def test_optimization_levels(model):
    graph = model()
    feeds = random_feeds(graph, {"batch": 3})
    want = eager(graph, feeds)["output"]
    source_ops = {n.op for n in graph.nodes}
    ops = {}
    for level in ("none", "basic", "all"):
        s = Session(graph, optimization_level=level)
        ops[level] = {n.op for n in s.graph.nodes}
        np.testing.assert_allclose(s.run(feeds)["output"].numpy(), want, rtol=1e-4, atol=1e-5)
    assert ops["none"] == source_ops and [n.op for n in Session(graph, optimization_level="none")
                                          .graph.nodes] == [n.op for n in graph.nodes]
    assert ops["basic"] <= source_ops  # basic passes only remove or precompute nodes
    assert ops["all"] - source_ops  # all: rewrites into Gemm or fused ops
    assert Session(graph, optimize=False).optimization_level == "none"
    with pytest.raises(OneModelError, match="optimization_level must be one of none, basic, all"):
        Session(graph, optimization_level="extended")


def test_profiling_writes_a_chrome_trace_with_one_event_per_node(tmp_path):
    graph = conv_net()
    s = Session.load(graph, profile=True)
    for batch in (2, 2, 5):
        s.run(random_feeds(graph, {"batch": batch}))
    steps = sum(len(s.plan_for({"input": (b, 3, 16, 16)}).steps) for b in (2, 2, 5))
    path = s.end_profiling(tmp_path / "profile.json")
    trace = json.loads((tmp_path / "profile.json").read_text())
    assert path == str(tmp_path / "profile.json")
    events = trace["traceEvents"]
    nodes = [e for e in events if e["cat"] == "Node"]
    runs = [e for e in events if e["cat"] == "Session"]
    assert len(nodes) == steps and len(runs) == 3
    assert all(e["ph"] == "X" and e["dur"] >= 0 and "op" in e["args"] for e in nodes)
    assert {e["args"]["op"] for e in nodes} >= {"MaxPool", "AveragePool"}
    assert runs[2]["args"]["input_shapes"] == {"input": [5, 3, 16, 16]}
    # each run's node events lie inside that run's event
    for run in runs:
        inside = [e for e in nodes if run["ts"] <= e["ts"] <= run["ts"] + run["dur"]]
        assert len(inside) == steps // 3
    s.run(random_feeds(graph, {"batch": 2}))
    table = s.profile_summary().splitlines()
    assert table[0].split() == ["op", "calls", "total", "ms", "mean", "us", "share"]
    assert any(line.startswith("MaxPool ") and line.split()[1] == "1" for line in table)
    with pytest.raises(OneModelError, match="profile=True"):
        Session(graph).end_profiling(tmp_path / "x.json")


def test_feeds_of_any_array_like_kind():
    torch = pytest.importorskip("torch")
    graph = mlp(sizes=(4, 3))
    s = Session(graph)
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    want = s.run({"input": x})["output"].numpy()

    class ArrayLike:
        def __array__(self, dtype=None, copy=None):
            return x

    for feed in (x.tolist(), ArrayLike(), torch.from_numpy(x), torch.from_numpy(x).requires_grad_(),
                 Tensor.from_numpy(x)):
        got = s.run({"input": feed}, return_numpy=True)["output"]
        assert isinstance(got, np.ndarray)
        np.testing.assert_array_equal(got, want)
    ints = [[0, 1, 2, 3]]  # Python ints go to F32 (same kind: safe)
    np.testing.assert_array_equal(s.run({"input": ints})["output"].numpy(),
                                  s.run({"input": np.array(ints, np.float32)})["output"].numpy())
    with pytest.raises(OneModelError, match="must have dtype F32, got F64"):
        s.run({"input": torch.from_numpy(x.astype(np.float64))})  # arrays keep their dtype
    with pytest.raises(OneModelError, match="not a rectangular array of numbers"):
        s.run({"input": [[object()] * 4]})
