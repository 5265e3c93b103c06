"""Shape arithmetic that exporters write out as small integer tensors stays known while a graph
is validated, so the optimization passes (which skip values of unknown shape) still apply:
the pad table PyTorch computes for Swin's windows ((4, 2), sliced backwards, transposed) and
the Expand target TorchScript writes as ``Where(Equal(shape, -1), 1, shape)`` over a
convolution's output size (DETR). Results agree with onnxruntime at several sizes."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402

from onemodel.onnx.importer import from_model  # noqa: E402
from onemodel.runtime import Session  # noqa: E402


def _i64(name, values):
    return h.make_tensor(name, T.INT64, [len(values)], list(values))


def _model(nodes, inputs, inits):
    ins = [h.make_tensor_value_info(n, T.FLOAT, dims) for n, dims in inputs]
    g = h.make_graph(nodes, "g", ins, [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 18)])


def _unknown(session) -> list[str]:
    specs = session.graph.validate(allow_unknown=True)
    return [o for n in session.graph.nodes for o in n.outputs if o and specs.get(o) is None]


def _agree(model, shapes):
    session = Session(from_model(model, "m"))
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for shape in shapes:
        x = rng.standard_normal(shape).astype(np.float32)
        want = ref.run(None, {"x": x})[0]
        got = session.run({"x": x}, return_numpy=True)["y"]
        assert got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    return session


def _window_pad_model(window: int):
    """HF Swin's ``maybe_pad`` as torch.onnx exports ``F.pad(x, (0, 0, 0, pad_w, 0, pad_h))``,
    then the erf GELU of its MLP."""
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Gather", ["s", "one"], ["hh"], axis=0),
        h.make_node("Gather", ["s", "two"], ["ww"], axis=0),
        h.make_node("Mod", ["hh", "win"], ["hm"]),
        h.make_node("Sub", ["win", "hm"], ["hs"]),
        h.make_node("Mod", ["hs", "win"], ["pad_h"]),
        h.make_node("Mod", ["ww", "win"], ["wm"]),
        h.make_node("Sub", ["win", "wm"], ["ws"]),
        h.make_node("Mod", ["ws", "win"], ["pad_w"]),
        h.make_node("Unsqueeze", ["pad_h", "ax0"], ["pad_h1"]),
        h.make_node("Unsqueeze", ["pad_w", "ax0"], ["pad_w1"]),
        # (0, 0, 0, pad_w, 0, pad_h): torch's order, last axis first, then two zeros
        h.make_node("Concat", ["z1", "z1", "z1", "pad_w1", "z1", "pad_h1", "z2"], ["p8"], axis=0),
        h.make_node("Reshape", ["p8", "table"], ["p42"]),
        h.make_node("Slice", ["p42", "start", "end", "ax0", "back"], ["rev"]),
        h.make_node("Transpose", ["rev"], ["p24"], perm=[1, 0]),
        h.make_node("Reshape", ["p24", "flat"], ["pads"]),
        h.make_node("Pad", ["x", "pads"], ["padded"], mode="constant"),
        h.make_node("Div", ["padded", "sqrt2"], ["d"]),
        h.make_node("Erf", ["d"], ["e"]),
        h.make_node("Add", ["e", "onef"], ["e1"]),
        h.make_node("Mul", ["padded", "e1"], ["g"]),
        h.make_node("Mul", ["g", "half"], ["y"]),
    ]
    inits = [h.make_tensor("one", T.INT64, [], [1]), h.make_tensor("two", T.INT64, [], [2]),
             h.make_tensor("win", T.INT64, [], [window]), _i64("ax0", [0]), _i64("z1", [0]),
             _i64("z2", [0, 0]), _i64("table", [-1, 2]), _i64("start", [-1]),
             _i64("end", [-(2 ** 62)]), _i64("back", [-1]), _i64("flat", [-1]),
             h.make_tensor("sqrt2", T.FLOAT, [], [2 ** 0.5]),
             h.make_tensor("onef", T.FLOAT, [], [1.0]), h.make_tensor("half", T.FLOAT, [], [0.5])]
    return nodes, inits


@pytest.mark.parametrize(("size", "window"), [(6, 4), (8, 4)])
def test_a_window_pad_table_of_two_axes_stays_known(size, window):
    nodes, inits = _window_pad_model(window)
    model = _model(nodes, [("x", ["b", size, size + 1, 3])], inits)
    session = _agree(model, [(1, size, size + 1, 3), (3, size, size + 1, 3)])
    assert _unknown(session) == []
    padded = -(-size // window) * window
    assert session.graph.validate(allow_unknown=True)[session.graph.nodes[-1].outputs[0]] \
        .shape[1:] == (padded, -(-(size + 1) // window) * window, 3)
    if "elementwise-fusion" in session.optimizations:  # the numba plugin's pass
        assert session.optimizations["elementwise-fusion"] > 0


def _expand_model(offset: int):
    """A (b, 1, 1, L) mask expanded to (b, 1, L, L), L the pixels of a stride-2 convolution's
    output (DETR's encoder mask), through ``Where(Equal(shape, -1), 1, shape)``; ``offset``
    is added to L's last entry, so the entry may be a true -1 when it is negative."""
    nodes = [
        h.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                    strides=[2, 2]),
        h.make_node("Reshape", ["c", "bcl"], ["flat"]),
        h.make_node("Unsqueeze", ["flat", "ax1"], ["m"]),
        h.make_node("Shape", ["c"], ["s"]),
        h.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        h.make_node("Gather", ["s", "two"], ["oh"], axis=0),
        h.make_node("Gather", ["s", "three"], ["ow"], axis=0),
        h.make_node("Mul", ["oh", "ow"], ["pix"]),
        h.make_node("Add", ["pix", "offset"], ["last"]),
        h.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
        h.make_node("Unsqueeze", ["pix", "ax0"], ["pix1"]),
        h.make_node("Unsqueeze", ["last", "ax0"], ["last1"]),
        h.make_node("Concat", ["b1", "one1", "pix1", "last1"], ["shape"], axis=0),
        h.make_node("Equal", ["shape", "minus1"], ["is_neg"]),
        h.make_node("Where", ["is_neg", "ones", "shape"], ["target"]),
        h.make_node("Expand", ["m", "target"], ["y"]),
    ]
    rng = np.random.default_rng(1)
    w = rng.standard_normal((1, 3, 3, 3)).astype(np.float32)
    inits = [h.make_tensor("w", T.FLOAT, w.shape, w.ravel()), _i64("bcl", [0, 1, -1]),
             _i64("ax1", [1]), _i64("ax0", [0]), h.make_tensor("zero", T.INT64, [], [0]),
             h.make_tensor("two", T.INT64, [], [2]), h.make_tensor("three", T.INT64, [], [3]),
             h.make_tensor("offset", T.INT64, [], [offset]), _i64("one1", [1]),
             h.make_tensor("minus1", T.INT64, [], [-1]), _i64("ones", [1, 1, 1, 1])]
    return nodes, inits


def test_an_expand_target_over_a_convolution_size_stays_known():
    nodes, inits = _expand_model(0)
    model = _model(nodes, [("x", ["b", 3, "h", "w"])], inits)
    session = _agree(model, [(2, 3, 7, 9), (1, 3, 8, 8), (2, 3, 1, 1)])
    assert _unknown(session) == []


def test_a_size_that_may_be_minus_one_is_not_decided():
    # L - 2 is -1 for a 1x1 output: Where must pick 1 there, so the entry stays undecided
    # while the graph is validated, and each plan computes it from the real sizes
    nodes, inits = _expand_model(-2)
    model = _model(nodes, [("x", ["b", 3, "h", "w"])], inits)
    _agree(model, [(2, 3, 1, 1), (2, 3, 5, 1)])
    specs = from_model(model, "m").validate(allow_unknown=True)
    assert specs["is_neg"].value is None
    # the same entries without the offset are sizes: decided, none equal to -1
    nodes, inits = _expand_model(0)
    specs = from_model(_model(nodes, [("x", ["b", 3, "h", "w"])], inits), "m").validate(
        allow_unknown=True)
    assert specs["is_neg"].value == (0, 0, 0, 0)
