"""Control flow and data-dependent sizes through ONNX import (issue 12): If, Loop and Scan whose
subgraphs read outer-scope values, nested subgraphs, sequences, and NonZero/Unique/Compress
feeding later ops, run at several input values and sizes in OneModel and in onnxruntime (the
oracle). The session's plan is made once per input shape, never per input value."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from onemodel.onnx.importer import from_model  # noqa: E402
from onemodel.runtime import Session  # noqa: E402

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _seq_info(name, elem, shape):
    return helper.make_value_info(
        name, helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, shape)))


def _model(graph, opset=18):
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _ort(model):
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def _check(model, feeds_list, *, builds=None):
    """Run every feed set in OneModel and onnxruntime; outputs must agree. ``builds``: the plan
    count the session may have made at the end."""
    session = Session(from_model(model))
    oracle = _ort(model)
    names = [o.name for o in model.graph.output]
    for feeds in feeds_list:
        got = session.run(feeds, return_numpy=True)
        want = oracle.run(names, feeds)
        for name, w in zip(names, want):
            g = got[name]
            if isinstance(w, list):
                assert len(g) == len(w), name
                for gi, wi in zip(g, w):
                    np.testing.assert_allclose(gi, wi, rtol=1e-6, atol=1e-6)
            else:
                assert g.shape == w.shape, (name, g.shape, w.shape, feeds)
                assert g.dtype == w.dtype, (name, g.dtype, w.dtype)
                np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    if builds is not None:
        assert session.cache_info().builds == builds, session.cache_info()
    return session


def _if_model():
    # y = cond ? (x + b) * w : x - w, where b is an outer initializer and w an outer input
    then_g = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["t0"]), helper.make_node("Mul", ["t0", "w"], ["t1"])],
        "then", [], [helper.make_tensor_value_info("t1", F, None)])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "w"], ["e0"])], "else", [],
                               [helper.make_tensor_value_info("e0", F, None)])
    g = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
         helper.make_node("Greater", ["s", "zero"], ["cond"]),
         helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g),
         helper.make_node("Relu", ["y"], ["z"])],
        "if_outer",
        [helper.make_tensor_value_info("x", F, ["n"]), helper.make_tensor_value_info("w", F, ["n"])],
        [helper.make_tensor_value_info("z", F, ["n"])],
        [helper.make_tensor("b", F, [1], [0.5]), helper.make_tensor("zero", F, [], [0.0])])
    return _model(g)


def test_if_reads_outer_scope_values_one_plan_per_shape():
    rng = np.random.default_rng(0)
    feeds = []
    for n in (3, 3, 3, 5, 5):
        for sign in (1.0, -1.0):
            x = (sign * np.abs(rng.normal(size=n)) + 0.01 * sign).astype(np.float32)
            feeds.append({"x": x, "w": rng.normal(size=n).astype(np.float32)})
    session = _check(_if_model(), feeds, builds=2)  # sizes 3 and 5; not per value or branch
    assert session.cache_info().hits == len(feeds) - 2


def _loop_model(x_dim="n"):
    # acc_{i+1} = acc_i + x * i (x from the outer scope), stop early once sum(acc) > limit
    # (an outer input); scan output: acc after each iteration
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["x", "fi"], ["xi"]),
         helper.make_node("Add", ["acc", "xi"], ["acc_out"]),
         helper.make_node("ReduceSum", ["acc_out"], ["tot"], keepdims=0),
         helper.make_node("Less", ["tot", "limit"], ["cond_out"]),
         helper.make_node("Identity", ["acc_out"], ["scan_out"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c", B, []),
         helper.make_tensor_value_info("acc", F, None)],
        [helper.make_tensor_value_info("cond_out", B, []),
         helper.make_tensor_value_info("acc_out", F, None),
         helper.make_tensor_value_info("scan_out", F, None)])
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "c0", "acc0"], ["acc", "trace"], body=body),
         helper.make_node("Shape", ["trace"], ["trips"]),
         helper.make_node("ReduceMax", ["trace"], ["peak"], keepdims=0)],
        "loop_outer",
        [helper.make_tensor_value_info("M", I64, []), helper.make_tensor_value_info("c0", B, []),
         helper.make_tensor_value_info("acc0", F, ["n"]), helper.make_tensor_value_info("x", F, [x_dim]),
         helper.make_tensor_value_info("limit", F, [])],
        [helper.make_tensor_value_info("acc", F, ["n"]),
         helper.make_tensor_value_info("trace", F, ["t", "n"]),
         helper.make_tensor_value_info("trips", I64, [2]),
         helper.make_tensor_value_info("peak", F, [])])
    return _model(g)


def test_loop_reads_outer_scope_and_stops_on_data_one_plan_per_shape():
    feeds = []
    for n in (2, 4):
        for m, limit in ((1, 100.0), (4, 100.0), (6, 100.0), (8, 5.0), (8, 20.0)):
            feeds.append({"M": np.array(m, np.int64), "c0": np.array(True),
                          "acc0": np.linspace(-1, 1, n).astype(np.float32),
                          "x": np.arange(n, dtype=np.float32) / n,
                          "limit": np.array(limit, np.float32)})
    _check(_loop_model(), feeds, builds=2)


def _scan_model():
    # running sum of rows plus an outer bias; second output: each running sum times 2
    body = helper.make_graph(
        [helper.make_node("Add", ["state", "row"], ["s0"]),
         helper.make_node("Add", ["s0", "bias"], ["state_out"]),
         helper.make_node("Mul", ["state_out", "two"], ["out"])],
        "scan_body",
        [helper.make_tensor_value_info("state", F, [3]), helper.make_tensor_value_info("row", F, [3])],
        [helper.make_tensor_value_info("state_out", F, [3]), helper.make_tensor_value_info("out", F, [3])])
    g = helper.make_graph(
        [helper.make_node("Scan", ["init", "xs"], ["final", "ys"], body=body, num_scan_inputs=1,
                          scan_input_directions=[1])],
        "scan_outer",
        [helper.make_tensor_value_info("init", F, [3]), helper.make_tensor_value_info("xs", F, ["t", 3]),
         helper.make_tensor_value_info("bias", F, [3])],
        [helper.make_tensor_value_info("final", F, [3]), helper.make_tensor_value_info("ys", F, ["t", 3])],
        [helper.make_tensor("two", F, [], [2.0])])
    return _model(g)


def test_scan_reads_outer_scope_values():
    rng = np.random.default_rng(1)
    feeds = [{"init": rng.normal(size=3).astype(np.float32),
              "xs": rng.normal(size=(t, 3)).astype(np.float32),
              "bias": rng.normal(size=3).astype(np.float32)} for t in (1, 4, 4, 7)]
    _check(_scan_model(), feeds, builds=3)


def _nonzero_model():
    # indices of the positive entries -> gathered values -> scaled and summed; also the count
    g = helper.make_graph(
        [helper.make_node("Greater", ["x", "zero"], ["pos"]),
         helper.make_node("NonZero", ["pos"], ["idx"]),
         helper.make_node("Transpose", ["idx"], ["idx_t"]),
         helper.make_node("GatherND", ["x", "idx_t"], ["vals"]),
         helper.make_node("Mul", ["vals", "vals"], ["sq"]),
         helper.make_node("ReduceSum", ["sq"], ["total"], keepdims=0),
         helper.make_node("Shape", ["vals"], ["count"]),
         helper.make_node("Unique", ["vals"], ["u", "ui", "uinv", "uc"], sorted=1),
         helper.make_node("Compress", ["x", "row_mask"], ["rows"], axis=0)],
        "nonzero_outer",
        [helper.make_tensor_value_info("x", F, ["n", 3]),
         helper.make_tensor_value_info("row_mask", B, ["n"])],
        [helper.make_tensor_value_info("idx", I64, [2, None]),
         helper.make_tensor_value_info("total", F, []),
         helper.make_tensor_value_info("count", I64, [1]),
         helper.make_tensor_value_info("u", F, [None]),
         helper.make_tensor_value_info("uc", I64, [None]),
         helper.make_tensor_value_info("rows", F, [None, 3])],
        [helper.make_tensor("zero", F, [], [0.0])])
    return _model(g)


def test_nonzero_unique_compress_feed_later_ops_without_a_plan_per_value():
    rng = np.random.default_rng(2)
    feeds = []
    for n in (4, 4, 4, 4, 6, 6):
        x = np.round(rng.normal(size=(n, 3)), 1).astype(np.float32)
        feeds.append({"x": x, "row_mask": rng.random(n) > 0.5})
    feeds.append({"x": -np.ones((4, 3), np.float32), "row_mask": np.zeros(4, bool)})  # none
    session = _check(_nonzero_model(), feeds, builds=2)  # one plan per input shape
    # the part after NonZero is re-planned per count met, inside the plan, not per value
    assert session.cache_info().plans == 2


def test_topk_with_a_run_time_k_is_planned_once_per_shape():
    # k is a graph input (as detectors compute it): a size only data decides, not a plan key
    g = helper.make_graph(
        [helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1),
         helper.make_node("Mul", ["values", "two"], ["scaled"])],
        "topk_runtime_k",
        [helper.make_tensor_value_info("x", F, ["n", 8]),
         helper.make_tensor_value_info("k", I64, [1])],
        [helper.make_tensor_value_info("scaled", F, ["n", None]),
         helper.make_tensor_value_info("indices", I64, ["n", None])],
        [helper.make_tensor("two", F, [], [2.0])])
    rng = np.random.default_rng(3)
    x = rng.permutation(np.arange(24, dtype=np.float32)).reshape(3, 8)
    feeds = [{"x": x, "k": np.array([k], np.int64)} for k in (1, 3, 8, 3)]
    _check(_model(g), feeds, builds=1)


def _nested_model():
    # Loop whose body holds an If that reads a value two scopes out (the outer input 'k')
    then_g = helper.make_graph([helper.make_node("Add", ["acc", "k"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", F, None)])
    else_g = helper.make_graph([helper.make_node("Sub", ["acc", "k"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", F, None)])
    body = helper.make_graph(
        [helper.make_node("Mod", ["i", "two"], ["r"]),
         helper.make_node("Equal", ["r", "zero"], ["even"]),
         helper.make_node("If", ["even"], ["acc_out"], then_branch=then_g, else_branch=else_g),
         helper.make_node("Identity", ["c"], ["c_out"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c", B, []),
         helper.make_tensor_value_info("acc", F, None)],
        [helper.make_tensor_value_info("c_out", B, []), helper.make_tensor_value_info("acc_out", F, None)])
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "acc0"], ["acc"], body=body)],
        "nested",
        [helper.make_tensor_value_info("M", I64, []), helper.make_tensor_value_info("acc0", F, ["n"]),
         helper.make_tensor_value_info("k", F, ["n"])],
        [helper.make_tensor_value_info("acc", F, ["n"])],
        [helper.make_tensor("two", I64, [], [2]), helper.make_tensor("zero", I64, [], [0])])
    return _model(g)


def test_nested_subgraphs_read_values_two_scopes_out():
    rng = np.random.default_rng(3)
    feeds = [{"M": np.array(m, np.int64), "acc0": rng.normal(size=n).astype(np.float32),
              "k": rng.normal(size=n).astype(np.float32)} for m in (0, 1, 2, 5) for n in (2, 3)]
    _check(_nested_model(), feeds, builds=2)


def _sequence_model():
    # split x into rows, append each row doubled in a Loop, then concatenate
    body = helper.make_graph(
        [helper.make_node("SequenceAt", ["rows", "i"], ["row"]),
         helper.make_node("Add", ["row", "row"], ["row2"]),
         helper.make_node("SequenceInsert", ["seq", "row2"], ["seq_out"]),
         helper.make_node("Identity", ["c"], ["c_out"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c", B, []),
         _seq_info("seq", F, None)],
        [helper.make_tensor_value_info("c_out", B, []),
         _seq_info("seq_out", F, None)])
    g = helper.make_graph(
        [helper.make_node("SplitToSequence", ["x"], ["rows"], axis=0, keepdims=0),
         helper.make_node("SequenceLength", ["rows"], ["len"]),
         helper.make_node("SequenceEmpty", [], ["empty"], dtype=F),
         helper.make_node("Loop", ["len", "", "empty"], ["doubled"], body=body),
         helper.make_node("ConcatFromSequence", ["doubled"], ["y"], axis=0, new_axis=1)],
        "seq_outer", [helper.make_tensor_value_info("x", F, ["n", 2])],
        [helper.make_tensor_value_info("y", F, ["n", 2]),
         _seq_info("doubled", F, [2])])
    return _model(g)


def test_sequences_through_a_loop():
    rng = np.random.default_rng(4)
    feeds = [{"x": rng.normal(size=(n, 2)).astype(np.float32)} for n in (1, 3, 3, 5)]
    _check(_sequence_model(), feeds, builds=3)


def test_a_loop_survives_a_native_round_trip(tmp_path):
    native = pytest.importorskip("onemodel.native.format")
    graph = from_model(_loop_model())
    path = tmp_path / "loop.onemodel"
    native.save(graph, path)
    loaded = native.load(path)
    feeds = {"M": np.array(5, np.int64), "c0": np.array(True),
             "acc0": np.linspace(-1, 1, 3).astype(np.float32),
             "x": np.arange(3, dtype=np.float32), "limit": np.array(50.0, np.float32)}
    before = Session(graph).run(feeds, return_numpy=True)
    after = Session(loaded).run(feeds, return_numpy=True)
    want = _ort(_loop_model()).run(None, feeds)
    for name, w in zip(("acc", "trace", "trips", "peak"), want):
        np.testing.assert_array_equal(after[name], before[name])
        np.testing.assert_allclose(after[name], w, rtol=1e-6)


def test_onnx_export_of_control_flow_is_refused_clearly(tmp_path):
    from onemodel.onnx.export import to_model
    from onemodel.tensors import OneModelError

    with pytest.raises(OneModelError, match="control flow.*native format"):
        to_model(from_model(_if_model()))


def test_a_failing_subgraph_names_the_node():
    from onemodel.tensors import OneModelError

    session = Session(from_model(_loop_model(x_dim="m")))  # x and acc may differ in size
    with pytest.raises(OneModelError, match=r"Loop.*Add"):
        session.run({"M": np.array(2, np.int64), "c0": np.array(True),
                     "acc0": np.zeros(3, np.float32), "x": np.zeros(2, np.float32),
                     "limit": np.array(1.0, np.float32)})


def test_passes_around_subgraphs_keep_results():
    """An If on constants is folded; one on inputs is kept; the Loop and its captures survive
    common-subexpression and dead-code passes. Every optimization level gives ORT's result."""
    then_g = helper.make_graph([helper.make_node("Mul", ["c", "two"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", F, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["c"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", F, None)])
    g = helper.make_graph(
        [helper.make_node("If", ["yes"], ["k"], then_branch=then_g, else_branch=else_g),
         helper.make_node("Add", ["x", "k"], ["a1"]),
         helper.make_node("Add", ["x", "k"], ["a2"]),  # a common subexpression of a1
         helper.make_node("ReduceSum", ["a2"], ["s"], keepdims=0),
         helper.make_node("Greater", ["s", "zero"], ["cond"]),
         helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g),
         helper.make_node("Mul", ["a1", "y"], ["z"])],
        "passes", [helper.make_tensor_value_info("x", F, [])],
        [helper.make_tensor_value_info("z", F, [3])],
        [helper.make_tensor("yes", B, [], [True]), helper.make_tensor("c", F, [3], [1, 2, 3]),
         helper.make_tensor("two", F, [], [2.0]), helper.make_tensor("zero", F, [], [0.0])])
    model = _model(g)
    oracle = _ort(model)
    folded = Session(from_model(model))
    assert [n.op for n in folded.graph.nodes].count("If") == 1  # the constant one is gone
    for level in ("none", "basic", "all"):
        session = Session(from_model(model), optimization_level=level)
        for x in (-20.0, 0.5, 3.0):
            feeds = {"x": np.array(x, np.float32)}
            np.testing.assert_allclose(session.run(feeds, return_numpy=True)["z"],
                                       oracle.run(None, feeds)[0], rtol=1e-6)


def test_scan_8_with_a_batch_axis():
    body = helper.make_graph(
        [helper.make_node("Add", ["state", "row"], ["state_out"]),
         helper.make_node("Mul", ["state_out", "row"], ["out"])],
        "scan8_body",
        [helper.make_tensor_value_info("state", F, [2]), helper.make_tensor_value_info("row", F, [2])],
        [helper.make_tensor_value_info("state_out", F, [2]), helper.make_tensor_value_info("out", F, [2])])
    g = helper.make_graph(
        [helper.make_node("Scan", ["", "init", "xs"], ["final", "ys"], body=body,
                          num_scan_inputs=1, directions=[1])],
        "scan8",
        [helper.make_tensor_value_info("init", F, ["b", 2]),
         helper.make_tensor_value_info("xs", F, ["b", "t", 2])],
        [helper.make_tensor_value_info("final", F, ["b", 2]),
         helper.make_tensor_value_info("ys", F, ["b", "t", 2])])
    rng = np.random.default_rng(5)
    feeds = [{"init": rng.normal(size=(b, 2)).astype(np.float32),
              "xs": rng.normal(size=(b, t, 2)).astype(np.float32)} for b, t in ((1, 3), (3, 2))]
    _check(_model(g, opset=8), feeds, builds=2)
