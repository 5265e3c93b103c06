"""Serving: one plan per input shape, whatever the input values (a Shape of an input depends on
its shape only), and a plan cache bounded by count and by bytes that evicts the least recently
used plan."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_graphs import attention, conv_net, mlp, random_feeds

from onemodel.runtime import GraphBuilder, Session, ValueInfo
from onemodel.tensors import DimExpr, DType


def _reshape_to_fed_target():
    """y = Reshape(x, target) with the target fed at run time: its value sets y's shape."""
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("n",))
    y = b.op("Reshape", x, b.input("target", DType.I64, (2,)))
    b.graph.outputs.append(ValueInfo(y, DType.F32, (DimExpr.symbol("a"), DimExpr.symbol("b"))))
    return b.graph


def _fresh_runs(session, graph, bindings, runs=5):
    for seed in range(runs):
        session.run(random_feeds(graph, bindings, seed=100 + seed))


@pytest.mark.parametrize("make", [conv_net, attention], ids=["conv_net", "attention"])
def test_fresh_data_reuses_the_plan_of_its_shape(make):
    graph = make()
    s = Session(graph)
    assert s.graph.value_inputs() == set()
    _fresh_runs(s, graph, {"batch": 2, "seq": 5})
    _fresh_runs(s, graph, {"batch": 3, "seq": 5})
    info = s.cache_info()
    assert info.builds == 2 and info.plans == 2 and info.hits == 8


def test_traced_cnn_and_transformer_layer_build_one_plan_per_shape():
    pytest.importorskip("onemodel.tracing")
    from onemodel.tensors import Generator, Tensor
    from onemodel.training import layers as L

    gen = Generator(0)
    cnn = L.Sequential(L.Conv2d(3, 4, 3, padding=1, generator=gen), L.BatchNorm2d(4), L.ReLU(),
                       L.MaxPool2d(2), L.Flatten(), L.Linear(4 * 4 * 4, 5, gen))
    layer = L.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, generator=gen)
    rng = np.random.default_rng(0)
    for model, shape, axes in [(cnn, (2, 3, 8, 8), ("batch", None, None, None)),
                               (layer, (2, 5, 8), ("batch", "seq", None))]:
        model.eval()
        example = Tensor.from_numpy(rng.standard_normal(shape).astype(np.float32))
        traced = model.trace(example, *axes)
        s = Session(traced.graph)
        assert s.graph.value_inputs() == set()
        for _ in range(4):
            x = rng.standard_normal(shape).astype(np.float32)
            got = s.run({"input": x})["output"].numpy()
            np.testing.assert_allclose(got, model(Tensor.from_numpy(x)).numpy(), rtol=1e-4,
                                       atol=1e-5)
        assert s.cache_info().builds == 1


def test_an_input_that_sets_a_shape_stays_part_of_the_key():
    s = Session(_reshape_to_fed_target())
    assert s.graph.value_inputs() == {"target"}
    x = np.arange(6, dtype=np.float32)
    assert s.run({"x": x, "target": np.array([2, 3])})[s.outputs[0].name].shape == (2, 3)
    assert s.run({"x": x, "target": np.array([3, 2])})[s.outputs[0].name].shape == (3, 2)
    assert s.run({"x": x, "target": np.array([2, 3])})[s.outputs[0].name].shape == (2, 3)
    assert s.cache_info().builds == 2


def test_shape_of_a_reshape_fed_by_an_input_value_keeps_that_input():
    # Shape stops the walk, but only for what it reads: the target input still sets shapes
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("n",))
    target = b.input("target", DType.I64, (2,))
    r = b.op("Reshape", x, target)
    b.op("Reshape", x, b.op("Shape", r))
    assert b.graph.value_inputs() == {"target"}


def test_cache_evicts_the_least_recently_used_plan():
    s = Session(mlp(sizes=(4, 3)))
    s.max_plans = 3
    feeds = {n: {"input": np.ones((n, 4), np.float32)} for n in range(1, 6)}
    for n in (1, 2, 3):
        s.run(feeds[n])
    s.run(feeds[1])  # 1 is now the most recently used; 2 is the least
    s.run(feeds[4])
    assert sorted(p.bindings["batch"] for p in s._plans.values()) == [1, 3, 4]
    builds = s.cache_info().builds
    s.run(feeds[1])
    assert s.cache_info().builds == builds  # still cached
    s.run(feeds[2])
    assert s.cache_info().builds == builds + 1


def test_cache_is_bounded_by_bytes():
    s = Session(_reshape_to_fed_target())
    x = np.arange(6, dtype=np.float32)
    s.run({"x": x, "target": np.array([2, 3])})
    one = s.cache_info().nbytes
    assert one >= 16  # the kept copy of the target (and its bytes in the key)
    s.max_plan_bytes = 2 * one
    for shape in ([3, 2], [1, 6], [6, 1], [2, 3]):
        s.run({"x": x, "target": np.array(shape)})
        info = s.cache_info()
        assert info.nbytes <= s.max_plan_bytes and info.plans <= 2
    assert s.cache_info().evictions >= 3
    # a plan larger than the whole budget runs, but is not kept
    s.max_plan_bytes = one - 1
    assert s.run({"x": x, "target": np.array([3, 2])})[s.outputs[0].name].shape == (3, 2)
    assert s.cache_info().plans == 0 and s.cache_info().nbytes == 0


def test_plan_for_refuses_graphs_whose_plans_depend_on_input_values():
    from onemodel.tensors import OneModelError

    s = Session(_reshape_to_fed_target())
    with pytest.raises(OneModelError, match="depend on the values of input 'target'"):
        s.plan_for({"x": (6,), "target": (2,)})


def test_lowering_the_bounds_evicts_at_once():
    s = Session(mlp(sizes=(4, 3)))
    for n in range(1, 6):
        s.run({"input": np.ones((n, 4), np.float32)})
    s.max_plans = 2
    assert s.cache_info().plans == 2
    assert sorted(p.bindings["batch"] for p in s._plans.values()) == [4, 5]


def test_threads_missing_one_shape_together_build_its_plan_once():
    import threading

    graph = conv_net()
    s = Session(graph)
    barrier = threading.Barrier(8)
    errors = []

    def worker(seed):
        try:
            feeds = random_feeds(graph, {"batch": 3}, seed=seed)
            barrier.wait()
            s.run(feeds)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    info = s.cache_info()
    assert info.builds == 1 and info.hits == 7
