"""Sizes only data decides (NonZero, Unique, Compress, NonMaxSuppression, Loop outputs) and
non-tensor values (sequences, optionals) in the planner and the Session: one plan per input
shape, the part after a data-dependent node planned per size met, results checked against
numpy computing the same thing directly."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.runtime import Graph, GraphError, Node, Session, ValueInfo
from onemodel.tensors import DimExpr, DType, OneModelError

N = DimExpr.symbol("n")


def _nonzero_graph() -> Graph:
    """count and sum of squares of x's positive entries, via NonZero -> Gather."""
    return Graph(
        [ValueInfo("x", DType.F32, (N,))],
        [ValueInfo("count", DType.I64, (1,)), ValueInfo("ss", DType.F32, ()),
         ValueInfo("idx", DType.I64, (1, DimExpr.symbol("k")))],
        [Node("Greater", ["x", "zero"], ["pos"], name="gt"),
         Node("NonZero", ["pos"], ["idx"], name="nz"),
         Node("Reshape", ["idx", "m1"], ["flat"], name="flat"),
         Node("Gather", ["x", "flat"], ["vals"], name="gather"),
         Node("Shape", ["vals"], ["count"], name="shape"),
         Node("Mul", ["vals", "vals"], ["sq"], name="sq"),
         Node("ReduceSum", ["sq"], ["ss"], {"keepdims": 0}, name="sum")],
        {"zero": np.array(0.0, np.float32), "m1": np.array([-1])})


def test_nonzero_downstream_one_plan_per_shape_and_one_continuation_per_count():
    session = Session(_nonzero_graph())
    rng = np.random.default_rng(0)
    counts = set()
    for _ in range(12):
        x = rng.normal(size=6).astype(np.float32)
        out = session.run({"x": x}, return_numpy=True)
        pos = x[x > 0]
        counts.add(len(pos))
        assert out["count"].tolist() == [len(pos)]
        np.testing.assert_allclose(out["ss"], np.sum(pos * pos), rtol=1e-6)
        np.testing.assert_array_equal(out["idx"], np.nonzero(x > 0)[0][None])
    info = session.cache_info()
    assert info.builds == 1 and info.hits == 11  # not re-planned per value
    (plan,) = session._plans.values()
    cont = plan.steps[-1].call
    assert cont.info()["builds"] == len(counts)  # the rest: once per count met
    assert cont.info()["hits"] == 12 - len(counts)


def test_no_entry_selected_gives_empty_results():
    out = Session(_nonzero_graph()).run({"x": -np.ones(4, np.float32)}, return_numpy=True)
    assert out["count"].tolist() == [0] and float(out["ss"]) == 0.0
    assert out["idx"].shape == (1, 0)


def test_nonzero_of_a_constant_is_evaluated_when_planning():
    g = Graph([ValueInfo("x", DType.F32, (3,))], [ValueInfo("y", DType.F32, (2,))],
              [Node("NonZero", ["mask"], ["idx"], name="nz"),
               Node("Reshape", ["idx", "m1"], ["flat"], name="r"),
               Node("Gather", ["x", "flat"], ["y"], name="g")],
              {"mask": np.array([1, 0, 1], np.int64), "m1": np.array([-1])})
    session = Session(g)
    out = session.run({"x": np.array([5, 6, 7], np.float32)}, return_numpy=True)
    assert out["y"].tolist() == [5.0, 7.0]
    (plan,) = session._plans.values()
    assert [s.op for s in plan.steps] == ["Gather"]  # NonZero ran while planning


@pytest.mark.parametrize("sorted_", [0, 1])
def test_unique_matches_numpy(sorted_):
    g = Graph([ValueInfo("x", DType.I64, (N,))],
              [ValueInfo(o, DType.I64, (DimExpr.symbol(o),)) for o in ("u", "i", "inv", "c")],
              [Node("Unique", ["x"], ["u", "i", "inv", "c"], {"sorted": sorted_}, "u")])
    session = Session(g)
    for x in ([3, 1, 3, 2, 1], [7, 7, 7], [4, 2]):
        x = np.array(x)
        out = session.run({"x": x}, return_numpy=True)
        u, first, inv, counts = np.unique(x, return_index=True, return_inverse=True,
                                          return_counts=True)
        if not sorted_:
            order = np.argsort(first)
            u, first, counts = u[order], first[order], counts[order]
            inv = np.argsort(order)[inv]
        assert out["u"].tolist() == u.tolist() and out["i"].tolist() == first.tolist()
        assert out["inv"].tolist() == inv.tolist() and out["c"].tolist() == counts.tolist()
        np.testing.assert_array_equal(out["u"][out["inv"]], x)


def test_non_max_suppression_keeps_the_best_of_overlapping_boxes():
    g = Graph([ValueInfo("boxes", DType.F32, (1, N, 4)), ValueInfo("scores", DType.F32, (1, 1, N))],
              [ValueInfo("sel", DType.I64, (DimExpr.symbol("k"), 3))],
              [Node("NonMaxSuppression", ["boxes", "scores", "max", "iou"], ["sel"], name="nms")],
              {"max": np.array([10]), "iou": np.array([0.5], np.float32)})
    boxes = np.array([[[0, 0, 1, 1], [0, 0.05, 1, 1.05], [2, 2, 3, 3], [0, 0, 0.9, 1]]],
                     np.float32)
    scores = np.array([[[0.6, 0.9, 0.3, 0.8]]], np.float32)
    out = Session(g).run({"boxes": boxes, "scores": scores}, return_numpy=True)
    # box 1 (0.9) wins; 0 and 3 overlap it by more than 0.5; box 2 is apart
    assert out["sel"].tolist() == [[0, 0, 1], [0, 0, 2]]


def test_compress_condition_longer_than_the_axis_is_an_error_naming_the_node():
    g = Graph([ValueInfo("x", DType.F32, (2, 2)), ValueInfo("c", DType.BOOL, (N,))],
              [ValueInfo("y", DType.F32, (DimExpr.symbol("k"), 2))],
              [Node("Compress", ["x", "c"], ["y"], {"axis": 0}, "comp")])
    session = Session(g)
    out = session.run({"x": np.eye(2, dtype=np.float32), "c": np.array([False, True])},
                      return_numpy=True)
    assert out["y"].tolist() == [[0.0, 1.0]]
    with pytest.raises(OneModelError, match=r"comp \(Compress\).*3 entries"):
        session.run({"x": np.eye(2, dtype=np.float32), "c": np.ones(3, bool)})


def test_sequences_in_and_out_of_a_session():
    g = Graph([ValueInfo("s", DType.F32, (), "sequence"), ValueInfo("t", DType.F32, (N,))],
              [ValueInfo("s2", DType.F32, (), "sequence"), ValueInfo("cat", DType.F32, (N,)),
               ValueInfo("len", DType.I64, ())],
              [Node("SequenceInsert", ["s", "t", "zero"], ["s2"], name="ins"),
               Node("SequenceLength", ["s2"], ["len"], name="len"),
               Node("ConcatFromSequence", ["s2"], ["cat"], {"axis": 0}, "cat")],
              {"zero": np.array(0)})
    session = Session(g)
    seq = [np.array([1.0, 2.0], np.float32), np.array([3.0], np.float32)]
    out = session.run({"s": seq, "t": np.array([9.0], np.float32)})
    assert [t.numpy().tolist() for t in out["s2"]] == [[9.0], [1.0, 2.0], [3.0]]
    assert out["cat"].numpy().tolist() == [9.0, 1.0, 2.0, 3.0] and int(out["len"].numpy()) == 3
    assert seq[0].tolist() == [1.0, 2.0]  # the feed is not changed
    with pytest.raises(OneModelError, match="input 's' element 1 must have dtype F32"):
        session.run({"s": [seq[0], np.array([1], np.int64)], "t": np.zeros(1, np.float32)})
    with pytest.raises(OneModelError, match="give a list of arrays"):
        session.run({"s": np.zeros(2, np.float32), "t": np.zeros(1, np.float32)})
    with pytest.raises(OneModelError, match="input 's' is a sequence or optional"):
        session.warmup({"s": (2,), "t": (1,)})


def test_a_sequence_given_to_a_tensor_op_is_a_graph_error():
    g = Graph([ValueInfo("s", DType.F32, (), "sequence")], [ValueInfo("y", DType.F32, ())],
              [Node("Relu", ["s"], ["y"], name="relu")])
    with pytest.raises(GraphError, match=r"relu \(Relu\): input 's' is seq<F32>, not a tensor"):
        Session(g)
