"""ONNX models with symbolic axes load with their axes symbolic and agree with onnxruntime at
two sizes: Range over a symbolic limit, Slice bounds written as "to the end" (INT64_MAX,
INT32_MAX, 1e9), Concat of sizes that cannot be proved equal until a plan binds them, and input
axes written as -1 or left empty."""

from __future__ import annotations

import io

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402

from onemodel.onnx.importer import from_model  # noqa: E402
from onemodel.runtime import Session  # noqa: E402
from onemodel.tensors import DimExpr, OneModelError  # noqa: E402

SIZES = ((2, 5), (3, 8))


def _i64(name, v):
    if isinstance(v, list):
        return h.make_tensor(name, T.INT64, [len(v)], v)
    return h.make_tensor(name, T.INT64, [], [v])


def _model(nodes, inits=(), dims=("b", "s"), extra_inputs=()):
    x = h.make_tensor_value_info("x", T.FLOAT, list(dims))
    g = h.make_graph(nodes, "g", [x, *extra_inputs],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", 18)])


def _run(session, feeds):
    out = session.run(feeds)
    return np.asarray(out["y"] if isinstance(out, dict) else out[0])


def _agree(model, feeds_list):
    session = Session(from_model(model, "m"))
    ref = ort.InferenceSession(model.SerializeToString())
    for feeds in feeds_list:
        want = ref.run(None, feeds)[0]
        got = _run(session, feeds)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _x(*shape):
    return {"x": np.random.default_rng(sum(shape)).random(shape, dtype=np.float32)}


def _out_spec(model, name):
    return from_model(model, "m").validate(allow_unknown=True)[name]


@pytest.mark.parametrize("delta", [1, 2, 3])
def test_range_over_a_symbolic_limit(delta):
    nodes = [h.make_node("Shape", ["x"], ["sh"]),
             h.make_node("Gather", ["sh", "one"], ["n"], axis=0),
             h.make_node("Range", ["zero", "n", "delta"], ["r"]),
             h.make_node("Cast", ["r"], ["rf"], to=T.FLOAT),
             h.make_node("Unsqueeze", ["rf", "axis0"], ["u"]),
             h.make_node("Add", ["u", "u"], ["y"])]
    inits = [_i64("one", 1), _i64("zero", 0), _i64("delta", delta), _i64("axis0", [0])]
    model = _model(nodes, inits)
    spec = _out_spec(model, "r")
    assert isinstance(spec.shape[0], DimExpr)
    for s in (5, 8, 9):  # the symbolic length is ceil(s / delta)
        assert spec.shape[0].evaluate({"s": s, "b": 1}) == len(range(0, s, delta))
    _agree(model, [_x(*size) for size in SIZES])


@pytest.mark.parametrize("end", [2**63 - 1, 2**31 - 1, 10**9])
def test_slice_to_the_end_on_a_symbolic_axis(end):
    # x[:, 1:end] + x[:, :-1] needs the slice's length to be s - 1, not end - 1
    nodes = [h.make_node("Slice", ["x", "one", "end", "ax"], ["a"]),
             h.make_node("Slice", ["x", "zero", "minus1", "ax"], ["b"]),
             h.make_node("Add", ["a", "b"], ["y"])]
    inits = [_i64("one", [1]), _i64("end", [end]), _i64("ax", [1]), _i64("zero", [0]),
             _i64("minus1", [-1])]
    model = _model(nodes, inits)
    assert str(_out_spec(model, "a").shape[1]) == str(DimExpr.symbol("s") - 1)
    _agree(model, [_x(*size) for size in SIZES])


@pytest.mark.parametrize("step", [-1, -2, 2])
def test_slice_with_steps_and_huge_bounds_on_a_symbolic_axis(step):
    start, end = (-1, -(2**31)) if step < 0 else (-(2**31), 2**31 - 1)
    nodes = [h.make_node("Slice", ["x", "st", "en", "ax", "step"], ["a"]),
             h.make_node("Shape", ["a"], ["sh"]),
             h.make_node("Cast", ["sh"], ["shf"], to=T.FLOAT),
             h.make_node("ReduceSum", ["a"], ["total"], keepdims=0),
             h.make_node("Unsqueeze", ["total", "ax"], ["t1"]),
             h.make_node("Concat", ["shf", "t1"], ["y"], axis=0)]
    inits = [_i64("st", [start]), _i64("en", [end]), _i64("ax", [0]), _i64("step", [step])]
    model = _model(nodes, inits, dims=("s",))
    spec = _out_spec(model, "a")
    for s in (5, 8):
        assert spec.shape[0].evaluate({"s": s}) == len(range(s)[start:end:step])
    _agree(model, [{"x": np.arange(s, dtype=np.float32)} for s in (5, 8)])


def test_concat_of_sizes_unproved_equal_is_checked_when_planned():
    z = h.make_tensor_value_info("z", T.FLOAT, ["t", "u"])
    model = _model([h.make_node("Concat", ["x", "z"], ["y"], axis=0, name="join")],
                   extra_inputs=[z])
    feeds = [{**_x(2, 5), "z": np.ones((3, 5), np.float32)},
             {**_x(4, 7), "z": np.ones((1, 7), np.float32)}]
    _agree(model, feeds)
    session = Session(from_model(model, "m"))
    with pytest.raises(OneModelError, match="join"):
        session.run({**_x(2, 5), "z": np.ones((3, 4), np.float32)})


@pytest.mark.parametrize("dims", [(-1, 4), (None, 4), (-1, -1)])
def test_unknown_input_axes_become_anonymous_symbols(dims):
    model = _model([h.make_node("Shape", ["x"], ["sh"]),
                    h.make_node("Cast", ["sh"], ["shf"], to=T.FLOAT),
                    h.make_node("Relu", ["x"], ["r"]),
                    h.make_node("Flatten", ["r"], ["f"], axis=0),
                    h.make_node("Squeeze", ["f", "zero"], ["f0"]),
                    h.make_node("Concat", ["shf", "f0"], ["y"], axis=0)],
                   [_i64("zero", [0])], dims=dims)
    graph = from_model(model, "m")
    names = [d.args[0] for d in graph.inputs[0].shape if isinstance(d, DimExpr)]
    assert names and all(n.startswith("unk__") for n in names)
    assert len(set(names)) == len(names)
    _agree(model, [_x(2, 4), _x(3, 4)])


def test_torch_export_with_arange_over_a_dynamic_sequence():
    torch = pytest.importorskip("torch")

    class Positions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(64, 8)
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            pos = torch.arange(x.shape[1])
            odd = torch.arange(1, x.shape[1], 2)
            y = self.lin(x + self.emb(pos)[None])
            return torch.cat([y[:, 1:], y[:, odd]], dim=1)

    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.onnx.export(Positions().eval(), (torch.randn(2, 5, 8),), buf, dynamo=False,
                      input_names=["x"], output_names=["y"], opset_version=17,
                      dynamic_axes={"x": {0: "batch", 1: "seq"}, "y": {0: "batch", 1: "out"}})
    model = onnx.load_from_string(buf.getvalue())
    assert any(n.op_type == "Range" for n in model.graph.node)
    rng = np.random.default_rng(0)
    _agree(model, [{"x": rng.random((b, s, 8), dtype=np.float32)} for b, s in SIZES])


@pytest.mark.parametrize("value", [np.array([1.5], np.float32), np.array([7], np.int64), None])
def test_constant_of_shape_computed_from_shape_ops(value):
    # ConstantOfShape([2 * b, s + 1]) and an Expand to [b, 3, b], both computed from Shape(x)
    attrs = {} if value is None else {"value": onnx.numpy_helper.from_array(value, "v")}
    nodes = [h.make_node("Shape", ["x"], ["sh"]),
             h.make_node("Mul", ["sh", "mul"], ["sh2"]),
             h.make_node("Add", ["sh2", "add"], ["sh3"]),
             h.make_node("ConstantOfShape", ["sh3"], ["c"], name="fill", **attrs),
             h.make_node("Cast", ["c"], ["cf"], to=T.FLOAT),
             h.make_node("ReduceSum", ["cf"], ["total"], keepdims=0),
             h.make_node("Gather", ["sh", "zero"], ["b0"]),
             h.make_node("Concat", ["b0", "three", "b0"], ["target"], axis=0),
             h.make_node("Expand", ["total", "target"], ["e"]),
             h.make_node("Mul", ["e", "e"], ["y"])]
    inits = [_i64("mul", [2, 1]), _i64("add", [0, 1]), _i64("zero", [0]), _i64("three", [3])]
    model = _model(nodes, inits)
    _agree(model, [_x(*size) for size in SIZES])


def test_a_computed_negative_size_names_the_node_that_made_it():
    nodes = [h.make_node("Shape", ["x"], ["sh"]),
             h.make_node("Sub", ["sh", "ten"], ["neg"]),
             h.make_node("ConstantOfShape", ["neg"], ["c"], name="fill"),
             h.make_node("Add", ["c", "c"], ["y"])]
    session = Session(from_model(_model(nodes, [_i64("ten", [10, 0])]), "m"))
    assert _run(session, _x(12, 3)).shape == (2, 3)
    with pytest.raises(OneModelError, match=r"fill.*negative shape \[-8, 3\]"):
        session.run(_x(2, 3))


def test_torch_export_of_attention_with_computed_shapes():
    # TorchScript-exporter output: ConstantOfShape/Expand/Range/Reshape targets computed from
    # Shape ops, a causal mask from Trilu, x[:, ::2] and flip on the dynamic axis
    torch = pytest.importorskip("torch")

    class Attention(torch.nn.Module):
        def __init__(self, d=16, heads=2):
            super().__init__()
            self.qkv = torch.nn.Linear(d, 3 * d)
            self.out = torch.nn.Linear(d, d)
            self.heads = heads
            self.cls = torch.nn.Parameter(torch.randn(1, 1, d))

        def forward(self, x):
            b, _, d = x.shape
            x = torch.cat([self.cls.expand(b, -1, -1), x], dim=1)
            s = x.shape[1]
            q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2)
                       for t in self.qkv(x).chunk(3, dim=-1))
            mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
            att = (q @ k.transpose(-1, -2)).masked_fill(mask, float("-inf")).softmax(-1)
            y = self.out((att @ v).transpose(1, 2).reshape(b, s, d))
            pos = torch.arange(s, dtype=torch.float32) / s
            y = y + torch.zeros(b, s, 1) + pos[None, :, None] + x.new_ones(b, 1, d)
            half = s // 2
            return y[:, :half].mean(1) + y[:, ::2].sum(1) + y.flip(1)[:, -1]

    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.onnx.export(Attention().eval(), (torch.randn(2, 5, 16),), buf, dynamo=False,
                      input_names=["x"], output_names=["y"], opset_version=17,
                      dynamic_axes={"x": {0: "batch", 1: "seq"}})
    model = onnx.load_from_string(buf.getvalue())
    ops = {n.op_type for n in model.graph.node}
    assert {"ConstantOfShape", "Range", "Expand"} <= ops
    rng = np.random.default_rng(1)
    _agree(model, [{"x": rng.random((b, s, 16), dtype=np.float32)} for b, s in SIZES])


def test_errors_name_a_node_the_file_left_unnamed_by_its_generated_name():
    # at load: an attribute OneModel does not know
    model = _model([h.make_node("Relu", ["x"], ["y"], bogus=1)])
    with pytest.raises(OneModelError, match=r"node Relu__\d+ \(Relu"):
        from_model(model, "m")
    # at load or plan time: a Range whose step, computed from the input's shape, is 0
    nodes = [h.make_node("Shape", ["x"], ["sh"]),
             h.make_node("Gather", ["sh", "one"], ["n"], axis=0),
             h.make_node("Sub", ["n", "n"], ["step"]),
             h.make_node("Range", ["zero", "n", "step"], ["r"]),
             h.make_node("Cast", ["r"], ["y"], to=T.FLOAT)]
    with pytest.raises(OneModelError, match=r"node Range__\d+ \(Range.*non-zero step"):
        Session(from_model(_model(nodes, [_i64("one", 1), _i64("zero", 0)]), "m")).run(_x(2, 5))


def test_range_over_float_bounds_computed_from_shape_is_evaluated_when_planned():
    # a float step of 0.5 is not a value any shape rule reads; every input is known once the
    # plan binds the sizes, so the planner evaluates the node
    nodes = [h.make_node("Shape", ["x"], ["sh"]),
             h.make_node("Gather", ["sh", "one"], ["n"], axis=0),
             h.make_node("Cast", ["n"], ["nf"], to=T.FLOAT),
             h.make_node("Range", ["start", "nf", "half"], ["r"]),
             h.make_node("Mul", ["r", "r"], ["y"])]
    inits = [_i64("one", 1), h.make_tensor("start", T.FLOAT, [], [0.25]),
             h.make_tensor("half", T.FLOAT, [], [0.5])]
    _agree(_model(nodes, inits), [_x(*size) for size in SIZES])


def test_torch_export_of_a_llama_style_block():
    # RMSNorm, rotary embeddings over arange(seq), a causal mask from full(...).triu(1):
    # Range, ConstantOfShape, Split and Slice bounds all depend on the dynamic sequence axis
    torch = pytest.importorskip("torch")

    class Block(torch.nn.Module):
        def __init__(self, d=16, heads=2, vocab=50):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, d)
            self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
            self.out = torch.nn.Linear(d, d, bias=False)
            self.weight = torch.nn.Parameter(torch.rand(d) + 0.5)
            self.heads = heads
            half = torch.arange(0, d // heads, 2).float() / (d // heads)
            self.register_buffer("inv_freq", 1.0 / (10000**half))

        def rope(self, x, cos, sin):
            x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
            return x * cos + torch.cat([-x2, x1], -1) * sin

        def forward(self, ids):
            b, s = ids.shape
            x = self.emb(ids)
            freqs = torch.outer(torch.arange(s, dtype=torch.float32), self.inv_freq)
            angles = torch.cat([freqs, freqs], -1)
            cos, sin = angles.cos()[None, None], angles.sin()[None, None]
            normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
            q, k, v = self.qkv(normed).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
            mask = torch.full((s, s), float("-inf")).triu(1)
            att = torch.softmax(q @ k.transpose(-1, -2) / 2.0 + mask, -1)
            return x + self.out((att @ v).transpose(1, 2).reshape(b, s, -1))

    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.onnx.export(Block().eval(), (torch.randint(0, 50, (2, 5)),), buf, dynamo=False,
                      input_names=["ids"], output_names=["y"], opset_version=17,
                      dynamic_axes={"ids": {0: "batch", 1: "seq"}})
    model = onnx.load_from_string(buf.getvalue())
    assert {"Range", "ConstantOfShape", "Trilu"} <= {n.op_type for n in model.graph.node}
    rng = np.random.default_rng(2)
    _agree(model, [{"ids": rng.integers(0, 50, size)} for size in ((2, 5), (3, 9))])


@pytest.mark.parametrize("parts", [2, 3])
def test_split_of_a_symbolic_axis_into_equal_parts(parts):
    outs = [f"p{i}" for i in range(parts)]
    nodes = [h.make_node("Split", ["x"], outs, axis=1, num_outputs=parts),
             h.make_node("Concat", outs[::-1], ["y"], axis=1)]
    model = _model(nodes)
    spec = from_model(model, "m").validate(allow_unknown=True)
    for s in (6, 7, 8):  # ONNX's sizes: ceil(s / parts), the rest in the last
        want = [len(c) for c in np.array_split(np.arange(s), np.cumsum(
            [-(-s // parts)] * (parts - 1)))]
        assert [spec[o].shape[1].evaluate({"s": s, "b": 1}) for o in outs] == want
    _agree(model, [_x(2, 6), _x(3, 8)])
