"""conv-affine-folding and batchnorm-to-affine: per-channel scales and shifts (Caffe's Scale
layer after a BatchNorm, as in Inception v2 and DenseNet exports) fold into the convolution
before them, or a BatchNorm no convolution absorbed becomes the Mul and Add it computes; the
values equal PyTorch's conv2d and batch_norm, and lookalikes are left alone."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_graphs import f32

from onemodel.runtime import GraphBuilder, Session
from onemodel.runtime.passes import BatchNormToAffine, ConvAffineFolding, PassManager
from onemodel.tensors import DType

C = 6


def _conv_scale_shift(scale_shape=(C, 1, 1), shift_shape=(1, C, 1, 1), shared=False, bias=True):
    rng = np.random.default_rng(0)
    b = GraphBuilder("conv_affine")
    x = b.input("x", DType.F32, ("batch", 3, 9, 9))
    args = [x, b.initializer("w", f32(rng, C, 3, 3, 3))]
    if bias:
        args.append(b.initializer("b", f32(rng, C)))
    y = b.op("Conv", *args, pads=(1, 1, 1, 1))
    scaled = b.op("Mul", y, b.initializer("k", f32(rng, *scale_shape)))
    shifted = b.op("Add", b.initializer("c", f32(rng, *shift_shape)), scaled)
    b.output(b.op("Relu", shifted), "y")
    if shared:
        b.output(b.op("Neg", y), "raw")
    return b.build()


def _torch_conv_scale_shift(graph, x):
    import torch

    init = {k: torch.from_numpy(np.asarray(v)) for k, v in graph.initializers.items()}
    y = torch.nn.functional.conv2d(torch.from_numpy(x), init["w"], init.get("b"), padding=1)
    return torch.relu(y * init["k"] + init["c"]).numpy()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("scale_shape", [(C, 1, 1), (1, C, 1, 1), (1,), ()])
def test_scale_and_shift_fold_into_the_convolution(scale_shape, bias):
    graph = _conv_scale_shift(scale_shape, bias=bias)
    optimized = graph.copy()
    counts = PassManager([ConvAffineFolding()]).run(optimized)
    assert counts["conv-affine-folding"] == 2
    assert [n.op for n in optimized.nodes if n.op != "Identity"] == ["Conv", "Relu"]
    x = np.random.default_rng(1).standard_normal((2, 3, 9, 9)).astype(np.float32)
    want = _torch_conv_scale_shift(graph, x)
    np.testing.assert_allclose(Session(optimized, optimize=False).run({"x": x})["y"].numpy(),
                               want, rtol=1e-5, atol=1e-5)
    session = Session(graph)  # the default passes: the Relu joins the convolution too
    assert [n.op for n in session.graph.nodes if n.op != "Identity"] == ["FusedConv"]
    np.testing.assert_allclose(session.run({"x": x})["y"].numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs", [
    {"scale_shape": (9,)},  # broadcasts along the width, not the channels
    {"scale_shape": (1, 1, 9, 9)},  # per pixel
    {"shared": True},  # the convolution's output is read elsewhere too
])
def test_conv_affine_lookalikes_are_left_alone(kwargs):
    graph = _conv_scale_shift(**kwargs)
    optimized = graph.copy()
    counts = PassManager([ConvAffineFolding()]).run(optimized)
    assert counts["conv-affine-folding"] == 0
    x = np.random.default_rng(2).standard_normal((1, 3, 9, 9)).astype(np.float32)
    if not kwargs.get("shared"):
        np.testing.assert_allclose(Session(graph).run({"x": x})["y"].numpy(),
                                   _torch_conv_scale_shift(graph, x), rtol=1e-5, atol=1e-5)


def _concat_bn_relu():
    rng = np.random.default_rng(3)
    b = GraphBuilder("densenet_like")
    x1 = b.input("x1", DType.F32, ("batch", 2, 5, 5))
    x2 = b.input("x2", DType.F32, ("batch", 3, 5, 5))
    cat = b.op("Concat", x1, x2, axis=1)
    params = [b.initializer("scale", f32(rng, 5)), b.initializer("shift", f32(rng, 5)),
              b.initializer("mean", f32(rng, 5)),
              b.initializer("var", np.abs(f32(rng, 5)) + np.float32(0.5))]
    b.output(b.op("Relu", b.op("BatchNormalization", cat, *params, epsilon=1e-3)), "y")
    return b.build()


def test_batchnorm_after_a_concat_becomes_a_scale_and_shift():
    import torch

    graph = _concat_bn_relu()
    optimized = graph.copy()
    counts = PassManager([BatchNormToAffine()]).run(optimized)
    assert counts["batchnorm-to-affine"] == 1
    ops = [n.op for n in optimized.nodes if n.op != "Identity"]
    assert ops == ["Concat", "Mul", "Add", "Relu"]
    rng = np.random.default_rng(4)
    feeds = {"x1": rng.standard_normal((2, 2, 5, 5)).astype(np.float32),
             "x2": rng.standard_normal((2, 3, 5, 5)).astype(np.float32)}
    init = {k: torch.from_numpy(np.asarray(v)) for k, v in graph.initializers.items()}
    want = torch.relu(torch.nn.functional.batch_norm(
        torch.from_numpy(np.concatenate([feeds["x1"], feeds["x2"]], axis=1)), init["mean"],
        init["var"], init["scale"], init["shift"], training=False, eps=1e-3)).numpy()
    for session in (Session(optimized, optimize=False), Session(graph)):
        np.testing.assert_allclose(session.run(feeds)["y"].numpy(), want, rtol=1e-5, atol=1e-5)


def test_batchnorm_with_a_computed_parameter_stays():
    graph = _concat_bn_relu()
    graph.inputs.append(type(graph.inputs[0])("var", DType.F32, (5,)))
    del graph.initializers["var"]  # fed at run time: not a constant to fold
    optimized = graph.copy()
    assert PassManager([BatchNormToAffine()]).run(optimized)["batchnorm-to-affine"] == 0
