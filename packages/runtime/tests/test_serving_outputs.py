"""Serving: outputs never alias the caller's inputs, the session's constants, each other, or the
outputs of another run."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_graphs import attention, conv_net, mlp, random_feeds

from onemodel.runtime import GraphBuilder, Session
from onemodel.tensors import DType


def _flatten(n_features=3 * 40 * 40):
    b = GraphBuilder()
    x = b.input("input", DType.F32, ("batch", 3, 40, 40))
    b.output(b.op("Flatten", x, axis=1), "output")
    return b.build()


def _traced_flatten(shape=(2, 3, 40, 40)):
    """What a traced ``x.flatten(1)`` becomes: Reshape to Concat(Shape(x)[0], [-1])."""
    b = GraphBuilder()
    x = b.input("input", DType.F32, ("batch", *shape[1:]))
    batch = b.op("Gather", b.op("Shape", x), b.const([0], "I64"), axis=0)
    b.output(b.op("Reshape", x, b.op("Concat", batch, b.const([-1], "I64"), axis=0)), "output")
    return b.build()


@pytest.mark.parametrize("make", [_flatten, _traced_flatten], ids=["Flatten", "traced"])
@pytest.mark.parametrize("shape", [(2, 3, 40, 40), (1, 3, 40, 40)], ids=["big", "small"])
def test_outputs_do_not_alias_the_callers_input(make, shape):
    s = Session(make())
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    y = s.run({"input": x})["output"].numpy()
    want = x.reshape(shape[0], -1).copy()
    x[...] = 42
    np.testing.assert_array_equal(y, want)
    assert not np.shares_memory(x, y)


def test_identity_and_views_of_inputs_and_initializers_are_copied():
    b = GraphBuilder()
    x = b.input("x", DType.F32, (100, 100))
    w = b.initializer("w", np.ones((100, 100), np.float32))
    b.output(b.op("Identity", x), "same")
    b.output(b.op("Transpose", x, perm=(1, 0)), "view")
    b.output(b.op("Identity", w), "weight")
    b.output(b.op("Reshape", w, b.const([-1], "I64")), "weight_view")
    g = b.build()
    for optimize in (True, False):
        s = Session(g, optimize=optimize)
        x = np.zeros((100, 100), np.float32)
        out = {k: v.numpy() for k, v in s.run({"x": x}).items()}
        for name, y in out.items():
            assert not np.shares_memory(y, x), name
            assert not np.shares_memory(y, g.initializers["w"]), name
            assert not np.shares_memory(y, s.graph.initializers.get("w", x)), name
            y[...] = 7  # the caller owns its outputs
        again = s.run({"x": x})
        assert float(again["weight"].numpy().sum()) == 100 * 100
        assert float(again["same"].numpy().sum()) == 0


def test_two_outputs_of_one_value_are_two_arrays():
    b = GraphBuilder()
    x = b.input("x", DType.F32, (4, 4))
    y = b.op("Relu", x)
    b.output(b.op("Identity", y), "a")
    b.output(b.op("Identity", y), "b")
    out = Session(b.build(), optimize=False).run({"x": np.ones((4, 4), np.float32)})
    assert not np.shares_memory(out["a"].numpy(), out["b"].numpy())


@pytest.mark.parametrize("make", [mlp, conv_net, attention], ids=["mlp", "conv_net", "attention"])
def test_outputs_of_two_runs_share_no_memory(make):
    graph = make()
    s = Session(graph)
    feeds = random_feeds(graph, {"batch": 2, "seq": 3})
    first = s.run(feeds)["output"].numpy()
    kept = first.copy()
    second = s.run(feeds)["output"].numpy()
    assert not np.shares_memory(first, second)
    assert not np.shares_memory(first, feeds["input"])
    second[...] = 0
    np.testing.assert_array_equal(first, kept)
