"""What a trace records: symbolic axes through shape arithmetic, the spec's rule for plain ints,
constants copied at trace time, unrolled Python control flow, several inputs and outputs."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from onemodel.tensors import DimExpr, Generator, Tensor, concat
from onemodel.tracing import Tracer, TraceWarning
from onemodel.training import Linear, Module


def _run(traced, **feeds):
    return {k: v.numpy() for k, v in traced.session().run(
        {k: np.asarray(v, np.float32) for k, v in feeds.items()}).items()}


def test_symbolic_reshape_through_shape_arithmetic():
    def f(x):
        return x.reshape(x.shape[0] * 2, -1)

    traced = Tracer(f).trace({"x": Tensor.randn(3, 4)}, axes={"x": ("batch", None)})
    assert traced.outputs[0].shape == ("2 * batch", 2)
    for b in (1, 5, 8):
        x = np.random.default_rng(b).standard_normal((b, 4))
        np.testing.assert_allclose(_run(traced, x=x)["output"], x.reshape(b * 2, -1), rtol=1e-6)


def test_shape_index_stays_symbolic_when_the_size_equals_a_fixed_one():
    # the example batch (3) equals the fixed axis: x.shape[0] still means the batch axis
    def f(x):
        return x.reshape(x.shape[0], -1) * 2

    traced = Tracer(f).trace({"x": Tensor.randn(3, 3, 2)}, axes={"x": ("batch", None, None)})
    x = np.ones((7, 3, 2), np.float32)
    assert _run(traced, x=x)["output"].shape == (7, 6)


def test_plain_int_equal_to_example_size_is_taken_as_the_axis():
    def f(x):
        return x.reshape(4, 2, 3)  # 4 is the example batch: the spec's rule makes it symbolic

    traced = Tracer(f).trace({"x": Tensor.randn(4, 6)}, axes={"x": ("batch", None)})
    assert traced.outputs[0].shape == ("batch", 2, 3)
    assert _run(traced, x=np.ones((9, 6)))["output"].shape == (9, 2, 3)


def test_ambiguous_plain_int_warns():
    def f(x):
        return x.reshape(6, -1)  # 6 is the example batch and also the fixed axis

    with pytest.warns(TraceWarning, match="size 6 given as a plain int is taken as symbolic axis "
                                          "'batch'.*also a fixed dimension"):
        Tracer(f).trace({"x": Tensor.randn(6, 6)}, axes={"x": ("batch", None)})


def test_constants_are_copied_at_trace_time():
    model = Linear(2, 2, Generator(0))
    traced = model.trace(Tensor.randn(4, 2), "batch", None)
    x = np.ones((1, 2), np.float32)
    before = _run(traced, input=x)["output"]
    with warnings.catch_warnings():
        model.weight.numpy()[:] = 100.0  # later training does not change the traced graph
    np.testing.assert_array_equal(_run(traced, input=x)["output"], before)
    assert set(traced.graph.initializers) == {"weight", "bias"}


def test_python_loops_and_branches_on_sizes_are_unrolled():
    class Repeat(Module):
        def __init__(self):
            super().__init__()
            self.layers = [Linear(3, 3, Generator(i)) for i in range(3)]

        def forward(self, x):
            for layer in self.layers:
                x = layer(x).relu()
            if x.shape[1] == 3:  # a decision on a size: taken once, at trace time
                x = x * 2
            return x

    m = Repeat()
    traced = m.trace(Tensor.randn(4, 3), "batch", None)
    assert [n.op for n in traced.graph.nodes].count("Gemm") == 3
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(_run(traced, input=x)["output"], m(Tensor.from_numpy(x)).numpy(),
                               rtol=1e-5)


def test_two_named_inputs_with_two_symbolic_axes():
    proj = Linear(8, 8, Generator(3))

    def attend(query, memory):
        scores = (proj(query) @ memory.transpose(1, 2)).softmax(-1)
        return {"context": scores @ memory, "weights": scores}

    traced = Tracer(attend).trace(
        {"query": Tensor.randn(2, 5, 8), "memory": Tensor.randn(2, 7, 8)},
        axes={"query": ("batch", "tgt", None), "memory": ("batch", "src", None)})
    assert [(o.name, o.shape) for o in traced.outputs] == [
        ("context", ("batch", "tgt", 8)), ("weights", ("batch", "tgt", "src"))]
    rng = np.random.default_rng(1)
    for b, t, s in ((1, 2, 3), (3, 9, 4), (4, 1, 11)):
        q = rng.standard_normal((b, t, 8)).astype(np.float32)
        m = rng.standard_normal((b, s, 8)).astype(np.float32)
        got = _run(traced, query=q, memory=m)
        want = attend(Tensor.from_numpy(q), Tensor.from_numpy(m))
        for k in ("context", "weights"):
            np.testing.assert_allclose(got[k], want[k].numpy(), rtol=1e-5, atol=1e-6)


def test_outputs_tuple_names_and_repeats():
    def f(x):
        y = x * 2
        return y, y + 1, y

    traced = Tracer(f).trace({"x": Tensor.randn(3, 2)}, axes={"x": ("n", None)},
                             output_names=["a", "b", "c"])
    out = _run(traced, x=np.ones((4, 2)))
    assert sorted(out) == ["a", "b", "c"]
    np.testing.assert_array_equal(out["a"], out["c"])
    np.testing.assert_array_equal(out["b"], out["a"] + 1)
    unnamed = Tracer(lambda x: (x, x * 3)).trace({"x": Tensor.randn(3, 2)})
    assert [o.name for o in unnamed.outputs] == ["output_0", "output_1"]


def test_symint_arithmetic_and_slicing_on_a_symbolic_axis():
    def f(x):
        n = x.shape[0]
        half = x[: n // 2]
        tail = x[1:]
        last = x[-1]
        scale = x / n
        return concat([half, tail], 0), last, scale

    traced = Tracer(f).trace({"x": Tensor.randn(6, 2)}, axes={"x": ("batch", None)})
    x = np.arange(18, dtype=np.float32).reshape(9, 2)
    got = traced.session().run({"x": x})
    np.testing.assert_array_equal(got["output_0"].numpy(), np.concatenate([x[:4], x[1:]]))
    np.testing.assert_array_equal(got["output_1"].numpy(), x[-1])
    np.testing.assert_allclose(got["output_2"].numpy(), x / 9)
    assert isinstance(traced.graph.outputs[0].shape[0], DimExpr)


def test_module_trace_names_input_and_output():
    traced = Linear(3, 1, Generator(0)).trace(Tensor.zeros(4, 3), "batch", None)
    assert [(i.name, i.shape) for i in traced.inputs] == [("input", ("batch", 3))]
    assert [(o.name, o.shape) for o in traced.outputs] == [("output", ("batch", 1))]
    assert traced.graph.metadata["producer"] == "onemodel-tracing"


def test_causal_attention_follows_a_symbolic_sequence_length(tmp_path):
    from onemodel.tensors import functional as F

    def attend(q):
        return F.scaled_dot_product_attention(q, q, q, is_causal=True)

    traced = Tracer(attend).trace({"q": Tensor.randn(2, 5, 4)}, axes={"q": ("batch", "seq", None)})
    report = traced.check({"batch": [1, 3, 4], "seq": [2, 9, 3]})
    assert report.ok, str(report)
    ort = pytest.importorskip("onnxruntime")
    traced.save_onnx(tmp_path / "causal.onnx")
    q = np.random.default_rng(0).standard_normal((3, 7, 4)).astype(np.float32)
    got = ort.InferenceSession(str(tmp_path / "causal.onnx"),
                               providers=["CPUExecutionProvider"]).run(None, {"q": q})[0]
    np.testing.assert_allclose(got, attend(Tensor.from_numpy(q)).numpy(), rtol=1e-5, atol=1e-6)
