"""Broadcasting between sizes that only real sizes reconcile (two different symbolic axes, a
symbolic axis against a constant): the graph loads, the plan decides with the real sizes, the
results agree with onnxruntime, and a mismatch is refused naming the node."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402

from onemodel.onnx.importer import from_model  # noqa: E402
from onemodel.runtime import Session  # noqa: E402
from onemodel.runtime.dims import parse_dim  # noqa: E402
from onemodel.tensors import OneModelError  # noqa: E402


def _model(nodes, inputs, inits=()):
    ins = [h.make_tensor_value_info(n, t, dims) for n, t, dims in inputs]
    g = h.make_graph(nodes, "g", ins, [h.make_tensor_value_info("y", T.FLOAT, None)], list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", 18)])


def _feeds(model, shapes, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for v in model.graph.input:
        shape = shapes[v.name]
        if v.type.tensor_type.elem_type == T.BOOL:
            out[v.name] = rng.random(shape) < 0.5
        else:
            out[v.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def _agree(model, sizes):
    session = Session(from_model(model, "m"))
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for shapes in sizes:
        feeds = _feeds(model, shapes)
        want = ref.run(None, feeds)[0]
        got = session.run(feeds, return_numpy=True)["y"]
        assert got.shape == want.shape, shapes
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    return session


def test_add_of_two_different_symbolic_axes():
    model = _model([h.make_node("Add", ["x", "z"], ["y"], name="plus")],
                   [("x", T.FLOAT, ["b", "s"]), ("z", T.FLOAT, ["t", "s"])])
    spec = from_model(model, "m").validate(allow_unknown=True)["y"]
    assert str(spec.shape[0]) == "broadcast(b, t)" and str(spec.shape[1]) == "s"
    session = _agree(model, [{"x": (2, 4), "z": (2, 4)}, {"x": (1, 5), "z": (3, 5)},
                             {"x": (3, 2), "z": (1, 2)}, {"x": (0, 2), "z": (1, 2)}])
    with pytest.raises(OneModelError, match="plus"):
        session.run(_feeds(model, {"x": (2, 4), "z": (3, 4)}))


def test_symbolic_axis_against_a_constant_size():
    model = _model([h.make_node("Mul", ["x", "w"], ["y"], name="scale")],
                   [("x", T.FLOAT, ["b", 4])],
                   [h.make_tensor("w", T.FLOAT, [3, 1], [1.0, 2.0, 3.0])])
    session = _agree(model, [{"x": (1, 4)}, {"x": (3, 4)}])
    with pytest.raises(OneModelError, match="scale"):
        session.run(_feeds(model, {"x": (2, 4)}))


def test_where_and_expand_over_computed_symbolic_shapes():
    # Where(cond[b, 1], x[t, s], 0) then Expand to Shape(z[u, s]): every batch-like axis differs
    nodes = [h.make_node("Where", ["c", "x", "zero"], ["w"], name="pick"),
             h.make_node("Shape", ["z"], ["zs"]),
             h.make_node("Expand", ["w", "zs"], ["e"], name="grow"),
             h.make_node("Add", ["e", "z"], ["y"])]
    model = _model(nodes, [("c", T.BOOL, ["b", 1]), ("x", T.FLOAT, ["t", "s"]),
                           ("z", T.FLOAT, ["u", "s"])],
                   [h.make_tensor("zero", T.FLOAT, [], [0.0])])
    session = _agree(model, [{"c": (2, 1), "x": (2, 3), "z": (2, 3)},
                             {"c": (1, 1), "x": (4, 3), "z": (1, 3)},
                             {"c": (3, 1), "x": (1, 5), "z": (3, 5)},
                             {"c": (1, 1), "x": (1, 2), "z": (4, 2)}])
    with pytest.raises(OneModelError, match="grow"):
        session.run(_feeds(model, {"c": (2, 1), "x": (2, 3), "z": (3, 3)}))
    with pytest.raises(OneModelError, match="pick"):
        session.run(_feeds(model, {"c": (2, 1), "x": (3, 3), "z": (3, 3)}))


def test_broadcast_dims_round_trip_through_their_text():
    d = parse_dim("broadcast(b, t) + 1")
    assert str(d) == "1 + broadcast(b, t)" and parse_dim(str(d)) == d
    assert parse_dim("broadcast(b, 1)") == parse_dim("b")
    assert parse_dim("broadcast(b, 3)") == 3
    with pytest.raises(OneModelError, match="cannot be broadcast"):
        parse_dim("broadcast(2, 3)")
    with pytest.raises(OneModelError, match="cannot read"):
        parse_dim("broadcast(b, t")


def test_torchscript_expand_target_through_equal_and_where_stays_known():
    # TorchScript writes x.expand(-1, s) as Expand(x, Where(Equal(t, -1), ones, t)) with t
    # computed from Shape: the target's value (batch, s) is followed through Equal and Where,
    # so every shape after it is known when the graph loads
    nodes = [h.make_node("Shape", ["z"], ["zs"]),
             h.make_node("Gather", ["zs", "one"], ["s"], axis=0),
             h.make_node("Unsqueeze", ["s", "zero"], ["s1"]),
             h.make_node("Concat", ["minus1", "s1"], ["t"], axis=0),
             h.make_node("Equal", ["t", "minus1"], ["is_free"]),
             h.make_node("ConstantOfShape", ["two"], ["ones"],
                         value=h.make_tensor("v", T.INT64, [1], [1])),
             h.make_node("Where", ["is_free", "ones", "t"], ["target"]),
             h.make_node("Expand", ["x", "target"], ["e"], name="grow"),
             h.make_node("Add", ["e", "z"], ["y"])]
    inits = [h.make_tensor("one", T.INT64, [], [1]), h.make_tensor("zero", T.INT64, [1], [0]),
             h.make_tensor("minus1", T.INT64, [1], [-1]), h.make_tensor("two", T.INT64, [1], [2])]
    model = _model(nodes, [("x", T.FLOAT, ["b", 1]), ("z", T.FLOAT, ["b", "s"])], inits)
    specs = from_model(model, "m").validate(allow_unknown=True)
    assert specs["target"].value is not None and [str(d) for d in specs["y"].shape] == ["b", "s"]
    _agree(model, [{"x": (2, 1), "z": (2, 5)}, {"x": (3, 1), "z": (3, 1)}])


def test_matmul_over_differently_named_inner_axes_is_checked_when_planned():
    model = _model([h.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                   [("x", T.FLOAT, ["b", "k"]), ("w", T.FLOAT, ["n", 3])])
    session = _agree(model, [{"x": (2, 4), "w": (4, 3)}, {"x": (1, 6), "w": (6, 3)}])
    with pytest.raises(OneModelError, match="mm"):
        session.run(_feeds(model, {"x": (2, 4), "w": (5, 3)}))
    never = _model([h.make_node("MatMul", ["x", "w"], ["y"])],
                   [("x", T.FLOAT, ["b", "k"]), ("w", T.FLOAT, ["k + 1", 3])])
    with pytest.raises(OneModelError, match="inner dimensions"):  # never equal: refused at load
        Session(from_model(never, "m"))
