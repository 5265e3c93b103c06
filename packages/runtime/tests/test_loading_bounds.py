"""What loaders rely on in the runtime: constant folding checks output sizes before computing,
dimension text from files is parsed within bounds, and required inputs are checked by position."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from onemodel.runtime import Graph, GraphBuilder, GraphError, Node, Session, ValueInfo
from onemodel.runtime.dims import parse_dim
from onemodel.runtime.passes import ConstantFolding
from onemodel.runtime.passes.folding import MAX_ELEMENTS
from onemodel.tensors import DimExpr, DType, OneModelError


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _outer_sum(n: int) -> Graph:
    b = GraphBuilder("outer")
    x = b.input("x", DType.F32, (1,))
    row = b.initializer("row", np.ones((1, n), np.float32))
    col = b.initializer("col", np.ones((n, 1), np.float32))
    b.output(b.op("Add", b.op("Add", row, col), x), "y")
    return b.build()


def test_folding_checks_the_output_size_before_computing():
    # Add([1, 40000], [40000, 1]) is 1.6e9 elements (6 GB): it must not even be computed
    g = _outer_sum(40_000)
    peak = _peak(lambda: ConstantFolding().run(g))
    assert peak < 50 * 2**20
    assert [n.op for n in g.nodes if n.op == "Add"] == ["Add", "Add"]


def test_folding_still_folds_small_results():
    g = _outer_sum(100)
    assert ConstantFolding().run(g)
    adds = [n for n in g.nodes if n.op == "Add"]
    assert len(adds) == 1 and g.initializers[adds[0].inputs[0]].shape == (100, 100)
    assert MAX_ELEMENTS >= 100 * 100


def test_shape_of_a_huge_static_value_is_folded_without_allocating():
    b = GraphBuilder("shape")
    x = b.input("x", DType.F32, (40_000, 40_000))
    b.output(b.op("Shape", x), "s")
    g = b.build()
    peak = _peak(lambda: ConstantFolding().run(g))
    assert peak < 50 * 2**20
    np.testing.assert_array_equal(g.initializers["s"], [40_000, 40_000])


def test_a_session_on_a_huge_folding_candidate_stays_small():
    g = _outer_sum(40_000)
    peak = _peak(lambda: Session(g))
    assert peak < 100 * 2**20


@pytest.mark.parametrize("text,message", [
    ("b // 0", "division by 0"),
    ("b // (c - c)", "division by 0"),
    ("(" * 5000 + "b" + ")" * 5000, "longer than 1000"),
    ("(" * 33 + "b" + ")" * 33, "nested more than 32"),
    ("-" * 40 + "b", "nested more than 32"),
    ("9" * 19, "more than 18 digits"),
    ("9" * 5000, "longer than 1000"),
    ("b * \u00b2", "cannot read"),
    ("\u0663", "cannot read"),
    ("2 - 5", "negative"),
    ("", "cannot read"),
])
def test_hostile_dimension_text_is_a_onemodel_error(text, message):
    with pytest.raises(OneModelError, match=message):
        parse_dim(text)


@pytest.mark.parametrize("value", [True, -1, 1 << 62, b"batch", 1.5, None, ["b"]])
def test_dimension_values_of_the_wrong_kind_are_refused(value):
    with pytest.raises(OneModelError):
        parse_dim(value)


def test_dimension_text_still_parses():
    b = DimExpr.symbol("batch")
    assert parse_dim(" batch ") == b
    assert parse_dim("2 * batch + 1") == b * 2 + 1
    assert parse_dim("(batch + 3) // 2") == (b + 3) // 2
    assert parse_dim("17") == 17 and parse_dim(17) == 17


@pytest.mark.parametrize("op,inputs,attrs,missing", [
    ("Gemm", ["", "x", "x"], {}, "A"),
    ("Slice", ["x", "s", "", "s"], {}, "ends"),
    ("Concat", ["", "x"], {"axis": 0}, "inputs"),
    ("Softmax", [], {}, "input"),
])
def test_required_inputs_are_checked_by_position(op, inputs, attrs, missing):
    g = Graph([ValueInfo("x", DType.F32, (3, 3))], [ValueInfo("y", DType.F32, (3, 3))],
              [Node(op, inputs, ["y"], attrs, "n")], {"s": np.zeros(1, np.int64)})
    with pytest.raises(GraphError, match=f"missing required input {missing} of {op}"):
        g.validate()
