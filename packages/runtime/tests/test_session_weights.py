"""A Session owns its weights, as an onnxruntime session does: a graph's writable initializers
are copied once, read-only, when the session is made, so a change to the caller's arrays
afterwards reaches no plan (neither a plan made before the change nor one made after), the
caller's arrays stay writable, and a file's constants (read-only already) are not copied."""

from __future__ import annotations

import numpy as np
from runtime_graphs import mlp

from onemodel.runtime import GraphBuilder, Session, save
from onemodel.tensors import DType
from onemodel.tensors.ops.specialize import is_frozen


def _forward(graph, x):
    """The MLP by numpy in float64 (the oracle), from the graph's arrays as they are now."""
    w = graph.initializers
    h = x.astype(np.float64)
    for i in range(3):
        h = h @ w[f"fc{i}.weight"] + w[f"fc{i}.bias"]
        if i < 2:
            h = np.maximum(h, 0)
    return h


def test_a_change_to_the_callers_arrays_reaches_no_plan():
    graph = mlp()
    x1 = np.random.default_rng(0).standard_normal((1, 784)).astype(np.float32)
    x64 = np.random.default_rng(1).standard_normal((64, 784)).astype(np.float32)
    session = Session(graph)
    before = session.run({"input": x1})["output"].numpy()  # a plan for batch 1
    np.testing.assert_allclose(before, _forward(graph, x1), rtol=1e-4, atol=1e-4)
    want64 = _forward(graph, x64)
    graph.initializers["fc0.weight"] *= 3  # the caller's array, changed in place
    graph.initializers["fc2.bias"] += 1
    assert graph.initializers["fc0.weight"].flags.writeable  # still the caller's to change
    # the plan made before and one made after the change both run the session's own weights
    np.testing.assert_array_equal(session.run({"input": x1})["output"].numpy(), before)
    np.testing.assert_allclose(session.run({"input": x64})["output"].numpy(), want64,
                               rtol=1e-4, atol=1e-4)
    # a new session runs the new weights
    np.testing.assert_allclose(Session(graph).run({"input": x64})["output"].numpy(),
                               _forward(graph, x64), rtol=1e-4, atol=1e-4)


def test_the_copies_are_frozen_and_a_files_constants_are_not_copied(tmp_path):
    graph = mlp()
    session = Session(graph, optimize=False)
    for name, arr in session.graph.initializers.items():
        assert is_frozen(arr) and not np.shares_memory(arr, graph.initializers[name])
    path = tmp_path / "mlp.onemodel"
    save(graph, path)
    loaded = Session.load(path, optimize=False)
    again = Session(loaded.graph, optimize=False)
    for name, arr in loaded.graph.initializers.items():
        assert is_frozen(arr)
        assert again.graph.initializers[name] is arr  # read-only bytes already: shared


def test_a_scalar_initializer_keeps_its_shape():
    """A 0-d constant (a Gather's index) is owned as a 0-d array: Gather then drops the axis."""
    b = GraphBuilder()
    x = b.input("x", DType.F32, (3, 4))
    b.output(b.op("Gather", x, b.const(np.array(2, np.int64)), axis=1), "y")
    graph = b.build()
    session = Session(graph, optimize=False)
    index = session.graph.initializers[graph.nodes[0].inputs[1]]
    assert index.shape == () and is_frozen(index)
    feed = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(session.run({"x": feed})["y"].numpy(), feed[:, 2])
