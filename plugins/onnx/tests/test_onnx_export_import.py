"""ONNX export verified by onnxruntime for every layer, round trips, old opsets, IR < 4, external
data, and clear errors for ops the runtime lacks."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from onemodel import training as T  # noqa: E402
from onemodel.onnx.importer import UnsupportedOpError, from_model  # noqa: E402
from onemodel.runtime import Session  # noqa: E402
from onemodel.tensors import Generator, Tensor  # noqa: E402
from onemodel.tracing import Tracer  # noqa: E402

g = Generator(0)
# layer, example shape (batch 4 first), axis names
LAYERS = {
    "Linear": (lambda: T.Linear(6, 3, g), (4, 6), ("batch", None)),
    "Conv1d": (lambda: T.Conv1d(2, 3, 3, stride=2, padding=1, generator=g), (4, 2, 9),
               ("batch", None, None)),
    "Conv2d": (lambda: T.Conv2d(2, 4, 3, padding=1, groups=2, generator=g), (4, 2, 6, 6),
               ("batch", None, None, None)),
    "ConvTranspose2d": (lambda: T.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1,
                                                  generator=g), (4, 3, 5, 5),
                        ("batch", None, None, None)),
    "MaxPool2d": (lambda: T.MaxPool2d(3, 2, 1), (4, 2, 7, 7), ("batch", None, None, None)),
    "AvgPool2d": (lambda: T.AvgPool2d(3, 2, 1), (4, 2, 7, 7), ("batch", None, None, None)),
    "AdaptiveAvgPool2d": (lambda: T.AdaptiveAvgPool2d((2, 3)), (4, 2, 5, 7),
                          ("batch", None, None, None)),
    "BatchNorm1d": (lambda: T.BatchNorm1d(5), (4, 5), ("batch", None)),
    "BatchNorm2d": (lambda: T.BatchNorm2d(3), (4, 3, 5, 5), ("batch", None, None, None)),
    "LayerNorm": (lambda: T.LayerNorm(6), (4, 3, 6), ("batch", "seq", None)),
    "GroupNorm": (lambda: T.GroupNorm(2, 4), (4, 4, 3, 3), ("batch", None, None, None)),
    "Dropout": (lambda: T.Dropout(0.5), (4, 6), ("batch", None)),
    "ReLU": (T.ReLU, (4, 6), ("batch", None)),
    "GELU": (T.GELU, (4, 6), ("batch", None)),
    "Tanh": (T.Tanh, (4, 6), ("batch", None)),
    "Sigmoid": (T.Sigmoid, (4, 6), ("batch", None)),
    "Softmax": (lambda: T.Softmax(-1), (4, 6), ("batch", None)),
    "Flatten": (T.Flatten, (4, 2, 3), ("batch", None, None)),
    "Identity": (T.Identity, (4, 6), ("batch", None)),
    "Sequential": (lambda: T.Sequential(T.Linear(6, 8, g), T.ReLU(), T.Linear(8, 2, g)), (4, 6),
                   ("batch", None)),
    "MultiheadAttention": (lambda: _FirstOutput(T.MultiheadAttention(8, 2, batch_first=True,
                                                                     generator=g)),
                           (4, 5, 8), ("batch", "seq", None)),
    "TransformerEncoderLayer": (lambda: T.TransformerEncoderLayer(8, 2, 16, batch_first=True,
                                                                  generator=g),
                                (4, 5, 8), ("batch", "seq", None)),
}


class _FirstOutput(T.Module):
    def __init__(self, attn):
        super().__init__()
        self.attn = attn

    def forward(self, x):
        return self.attn(x, x, x)[0]


def _ort(path_or_bytes, feeds):
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    s = ort.InferenceSession(path_or_bytes, opts, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


@pytest.mark.parametrize("name", list(LAYERS))
def test_every_layer_exports_and_runs_in_onnxruntime_at_any_size(name, tmp_path):
    make, shape, axes = LAYERS[name]
    layer = make()
    for m in layer.modules():
        if isinstance(m, T.BatchNorm1d | T.BatchNorm2d):
            m.running_mean.numpy()[:] = np.linspace(-0.2, 0.3, m.num_features)
            m.running_var.numpy()[:] = np.linspace(0.5, 1.5, m.num_features)
    traced = layer.trace(Tensor.randn(*shape), *axes)
    path = tmp_path / f"{name}.onnx"
    traced.save_onnx(path)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    layer.eval()
    rng = np.random.default_rng(0)
    for sizes in ((1, 2), (3, 7), (9, 3)):
        dims = list(shape)
        dims[0] = sizes[0]
        if "seq" in axes:
            dims[axes.index("seq")] = sizes[1]
        x = rng.standard_normal(dims).astype(np.float32)
        (got,) = _ort(str(path), {"input": x})
        want = layer(Tensor.from_numpy(x)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"sizes {sizes}")


def test_symbolic_axes_are_dim_params_on_inputs_and_outputs(tmp_path):
    traced = Tracer(lambda x: x.reshape(x.shape[0] * 2, -1)).trace(
        {"x": Tensor.randn(3, 4)}, axes={"x": ("batch", None)})
    traced.save_onnx(tmp_path / "r.onnx")
    model = onnx.load(str(tmp_path / "r.onnx"))
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "2 * batch"
    assert model.producer_name == "onemodel-tracing"
    (got,) = _ort(str(tmp_path / "r.onnx"), {"x": np.ones((5, 4), np.float32)})
    assert got.shape == (10, 2)  # no example size frozen into the Reshape target


def test_round_trip_onemodel_onnx_onemodel(tmp_path):
    model = T.Sequential(T.Conv2d(3, 4, 3, padding=1, generator=g), T.BatchNorm2d(4), T.ReLU(),
                         T.MaxPool2d(2), T.Flatten(), T.Linear(4 * 4 * 4, 3, g))
    traced = model.trace(Tensor.randn(4, 3, 8, 8), "batch", None, None, None)
    traced.save_onnx(tmp_path / "m.onnx")
    back = Session.load(tmp_path / "m.onnx")
    x = np.random.default_rng(1).standard_normal((6, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(back.run({"input": x})["output"].numpy(),
                               traced.session().run({"input": x})["output"].numpy(),
                               rtol=1e-6, atol=1e-6)
    assert back.inputs[0].shape == ("batch", 3, 8, 8)


def _old_model():
    """Opset 7 forms: attributes that later became inputs, and pre-13 Softmax."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Unsqueeze", ["x"], ["u"], axes=[1]),
        helper.make_node("Squeeze", ["u"], ["s"], axes=[1]),
        helper.make_node("Slice", ["s"], ["sl"], starts=[0, 1], ends=[3, 4], axes=[1, 2]),
        helper.make_node("Pad", ["sl"], ["p"], pads=[0, 0, 1, 0, 0, 1], value=0.5),
        helper.make_node("Clip", ["p"], ["c"], min=-1.0, max=1.0),
        helper.make_node("ReduceSum", ["c"], ["r"], axes=[2], keepdims=1),
        helper.make_node("Softmax", ["c"], ["sm"], axis=1),
        helper.make_node("Add", ["sm", "r"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "old", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 7)])
    model.ir_version = 3
    return model


def test_opset_7_model_matches_onnxruntime():
    model = _old_model()
    session = Session(from_model(model))
    x = np.random.default_rng(2).standard_normal((2, 3, 4)).astype(np.float32)
    (want,) = _ort(model.SerializeToString(), {"x": x})
    np.testing.assert_allclose(session.run({"x": x})["y"].numpy(), want, rtol=1e-5, atol=1e-6)
    assert session.inputs[0].shape == ("n", 3, 4)


def test_ir3_initializers_listed_as_inputs_are_constants():
    w = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["y"])], "ir3",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 7)])
    model.ir_version = 3
    session = Session(from_model(model))
    assert [i.name for i in session.inputs] == ["x"]
    assert session.run({"x": np.ones(2, np.float32)})["y"].tolist() == [1.0, 2.0]


def test_external_data_files_are_read(tmp_path):
    model = T.Linear(64, 64, g)
    traced = model.trace(Tensor.randn(4, 64), "batch", None)
    traced.save_onnx(tmp_path / "plain.onnx")
    proto = onnx.load(str(tmp_path / "plain.onnx"))
    onnx.save(proto, str(tmp_path / "ext.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").exists()
    x = np.ones((3, 64), np.float32)
    np.testing.assert_allclose(Session.load(tmp_path / "ext.onnx").run({"input": x})["output"].numpy(),
                               model(Tensor.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)


def test_an_op_the_runtime_lacks_is_named_with_domain_opset_and_node():
    graph = helper.make_graph(
        [helper.make_node("StringNormalizer", ["x"], ["y"], name="sn")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(UnsupportedOpError,
                       match=r"node sn \(StringNormalizer, domain ai.onnx, opset 13\): op "
                             r"'StringNormalizer' is"):
        from_model(model)


def test_corrupt_onnx_file_is_a_clear_error(tmp_path):
    from onemodel.tensors import OneModelError

    (tmp_path / "bad.onnx").write_bytes(b"\xff\x00 not protobuf at all" * 3)
    with pytest.raises(OneModelError, match="bad.onnx: not a readable ONNX model"):
        Session.load(tmp_path / "bad.onnx")
