"""Import adapters of the ops added for coverage: forms of older opsets that ONNX's node tests
do not exercise (GroupNormalization-18's per-group scale and bias, DFT-17's axis attribute)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onemodel.onnx")

from onnx import TensorProto, helper  # noqa: E402

from onemodel.onnx.backend import OneModelBackend  # noqa: E402

RNG = np.random.default_rng(0)


def _model(node, inputs, output, opset):
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_group_normalization_18_repeats_per_group_parameters():
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((2, 6, 3, 4)).astype(np.float32)
    scale = RNG.standard_normal(3).astype(np.float32)
    bias = RNG.standard_normal(3).astype(np.float32)
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3,
                            epsilon=1e-4)
    model = _model(node, [("x", ["n", 6, 3, 4]), ("s", [3]), ("b", [3])], "y", 18)
    (y,) = OneModelBackend.run_model(model, [x, scale, bias])
    per_channel = [torch.tensor(p).repeat_interleave(2) for p in (scale, bias)]
    ref = torch.nn.functional.group_norm(torch.tensor(x), 3, *per_channel, eps=1e-4)
    np.testing.assert_allclose(y, ref.numpy(), rtol=1e-5, atol=1e-5)


def test_dft_17_axis_attribute_and_its_default():
    x = RNG.standard_normal((2, 5, 4, 1)).astype(np.float32)
    for attrs, axis in (({"axis": 2}, 2), ({}, 1)):  # opset 17's default axis is 1
        node = helper.make_node("DFT", ["x"], ["y"], **attrs)
        (y,) = OneModelBackend.run_model(_model(node, [("x", [2, 5, 4, 1])], "y", 17), [x])
        ref = np.fft.fft(x[..., 0], axis=axis)
        np.testing.assert_allclose(y, np.stack([ref.real, ref.imag], -1), rtol=1e-4, atol=1e-5)


def test_round_trip_writes_each_form_at_the_opset_that_has_it():
    from onnx.reference import ReferenceEvaluator

    from onemodel.onnx.export import to_model
    from onemodel.onnx.importer import from_model

    x = RNG.standard_normal((2, 4, 3)).astype(np.float32)
    nodes = [helper.make_node("Scatter", ["x", "i", "u"], ["s"], axis=1),  # legacy: adapted
             helper.make_node("CumProd", ["s", "a"], ["c"], exclusive=1),
             helper.make_node("Unsqueeze", ["c", "last"], ["c1"]),
             helper.make_node("DFT", ["c1", "", "a"], ["y"], onesided=1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("i", TensorProto.INT64, [2, 1, 3], [0, 1, 2, 3, 2, 1]),
         helper.make_tensor("u", TensorProto.FLOAT, [2, 1, 3], [1, 2, 3, 4, 5, 6]),
         helper.make_tensor("a", TensorProto.INT64, [], [1]),
         helper.make_tensor("last", TensorProto.INT64, [1], [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)])
    written = to_model(from_model(model))
    assert written.opset_import[0].version == 26  # CumProd's opset
    assert [n.op_type for n in written.graph.node] == ["ScatterElements", "CumProd",
                                                       "Unsqueeze", "DFT"]
    onnx.checker.check_model(written)
    (ours,) = OneModelBackend.run_model(model, [x])
    (ref,) = ReferenceEvaluator(written).run(None, {"x": x})
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
