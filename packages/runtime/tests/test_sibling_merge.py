"""sibling-matmul-merge: products of one input by several constant weights (a transformer's Q, K
and V projections) become one product, one bias Add (zeros where a product has none) and a
Split of views; the values equal x @ W + b computed independently, and lookalikes stay as they
are."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_graphs import f32, frozen_bytes

from onemodel.runtime import GraphBuilder, Session
from onemodel.runtime.passes import PassManager, SiblingMatMulMerge
from onemodel.runtime.passes.siblings import MERGE_MAX_BYTES
from onemodel.tensors import DType


def _graph(biases=(True, True, True), widths=(16, 16, 8), rows=(16, 16, 16), weight_input=False,
           bias_left=False):
    """Projections of x (batch, seq, 16), each read by a different op."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("siblings")
    x = b.input("x", DType.F32, ("batch", "seq", 16))
    outs = []
    for k, (bias, n, r) in enumerate(zip(biases, widths, rows)):
        src = x if r == 16 else b.op("Slice", x, b.const([0], "I64"), b.const([r], "I64"),
                                     b.const([-1], "I64"))
        w = b.input(f"w{k}", DType.F32, (r, n)) if weight_input and k == 0 else b.initializer(
            f"w{k}", f32(rng, r, n))
        y = b.op("MatMul", src, w)
        if bias:
            bb = b.initializer(f"b{k}", f32(rng, n))
            y = b.op("Add", bb, y) if bias_left else b.op("Add", y, bb)
        outs.append(y)
    b.output(b.op("Relu", outs[0]), "a")
    b.output(b.op("Tanh", outs[1]), "b")
    b.output(b.op("Neg", outs[2]), "c")
    return b.build()


def _run_pass(graph):
    optimized = graph.copy()
    counts = PassManager([SiblingMatMulMerge()]).run(optimized)
    return optimized, counts["sibling-matmul-merge"]


def _oracle(graph, x):
    """x @ W + b per projection, then each output's op, in numpy."""
    init = graph.initializers
    ys = [x @ init[f"w{k}"] + init.get(f"b{k}", 0) for k in range(3)]
    return {"a": np.maximum(ys[0], 0), "b": np.tanh(ys[1]), "c": -ys[2]}


@pytest.mark.parametrize("biases,bias_left", [((True, True, True), False),
                                              ((True, True, True), True),
                                              ((True, False, True), False),
                                              ((False, False, False), False)])
def test_projections_of_one_input_become_one_product(biases, bias_left):
    graph = _graph(biases, bias_left=bias_left)
    optimized, n = _run_pass(graph)
    assert n == 1
    ops = [node.op for node in optimized.nodes]
    assert ops.count("MatMul") == 1 and ops.count("Split") == 1
    # one Add for all: a product without a bias (Whisper's K) gets zero columns
    assert ops.count("Add") == (1 if any(biases) else 0)
    merged = [a for name, a in optimized.initializers.items()
              if "_merged" in name and "_sizes" not in name]
    assert merged and all(frozen_bytes(a) for a in merged)  # kernels may lay them out once
    session, plain = Session(optimized, optimize=False), Session(graph, optimize=False)
    rng = np.random.default_rng(1)
    for batch, seq in ((1, 1), (2, 5), (3, 17)):
        x = rng.standard_normal((batch, seq, 16)).astype(np.float32)
        got = session.run({"x": x})
        want = _oracle(graph, x)
        unmerged = plain.run({"x": x})
        for name in ("a", "b", "c"):
            np.testing.assert_allclose(got[name].numpy(), want[name], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(got[name].numpy(), unmerged[name].numpy(), rtol=1e-5,
                                       atol=1e-6)


def test_the_default_passes_merge_and_give_the_unmerged_result():
    graph = _graph()
    session = Session(graph)
    assert session.optimizations["sibling-matmul-merge"] == 1
    x = np.random.default_rng(2).standard_normal((2, 7, 16)).astype(np.float32)
    got = session.run({"x": x})
    for name, want in _oracle(graph, x).items():
        np.testing.assert_allclose(got[name].numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs", [
    {"rows": (16, 8, 16), "widths": (16, 16, 8)},  # different inputs (a slice): one pair left
    {"weight_input": True},  # a weight fed at run time: not constant
])
def test_lookalikes_are_left_alone_or_merged_only_where_they_fit(kwargs):
    graph = _graph(**kwargs)
    optimized, n = _run_pass(graph)
    matmuls = sum(node.op == "MatMul" for node in optimized.nodes)
    # the two remaining siblings still merge; the odd one stays apart
    assert n == 1 and matmuls == 2
    x = np.random.default_rng(3).standard_normal((2, 3, 16)).astype(np.float32)
    feeds = {"x": x}
    if kwargs.get("weight_input"):
        feeds["w0"] = graph.initializers.get("w0", np.ones((16, 16), np.float32))
    for name, want in Session(graph, optimize=False).run(feeds).items():
        np.testing.assert_allclose(Session(optimized, optimize=False).run(feeds)[name].numpy(),
                                   want.numpy(), rtol=1e-5, atol=1e-6)


def test_large_weights_are_not_copied():
    rng = np.random.default_rng(0)
    b = GraphBuilder("big")
    x = b.input("x", DType.F32, ("batch", 1024))
    n = MERGE_MAX_BYTES // (4 * 1024)  # two of these exceed the limit
    b.output(b.op("MatMul", x, b.initializer("w0", f32(rng, 1024, n))), "a")
    b.output(b.op("Relu", b.op("MatMul", x, b.initializer("w1", f32(rng, 1024, n)))), "b")
    _, merged = _run_pass(b.build())
    assert merged == 0
