"""Serving: whatever a kernel raises while a plan runs ends as a OneModelError that names the
node, its op and its input shapes; mis-shaped BatchNorm parameters are refused, naming the node,
before any pass or kernel uses them."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_graphs import f32

from onemodel.runtime import ExecutionError, GraphBuilder, Node, Session, ValueInfo
from onemodel.runtime.passes import PassManager
from onemodel.runtime.session import default_passes
from onemodel.tensors import DType, OneModelError

RNG = np.random.default_rng(0)


def _nll_out_of_range():
    b = GraphBuilder()
    x = b.input("scores", DType.F32, ("n", 3))
    t = b.input("target", DType.I64, ("n",))
    b.output(b.op("NegativeLogLikelihoodLoss", x, t, name="nll"), "loss")
    feeds = {"scores": np.zeros((2, 3), np.float32), "target": np.array([1, 5])}
    return b.build(), feeds, r"node nll \(NegativeLogLikelihoodLoss\) failed: target values must " \
                            r"be class indices in \[0, 3\); got 5 \(inputs: F32\[2, 3\], I64\[2\]\)"


def _sce_out_of_range():
    b = GraphBuilder()
    x = b.input("scores", DType.F32, ("n", 3))
    t = b.input("target", DType.I64, ("n",))
    b.output(b.op("SoftmaxCrossEntropyLoss", x, t, name="sce"), "loss")
    feeds = {"scores": np.zeros((2, 3), np.float32), "target": np.array([-7, 0])}
    return b.build(), feeds, r"node sce \(SoftmaxCrossEntropyLoss\) failed: target values must be"


def _ctc_too_long():
    b = GraphBuilder()
    lp = b.input("log_probs", DType.F32, (4, 1, 3))
    t = b.input("targets", DType.I64, (1, 2))
    il = b.input("input_lengths", DType.I64, (1,))
    tl = b.input("target_lengths", DType.I64, (1,))
    b.output(b.op("CTCLoss", lp, t, il, tl, name="ctc"), "loss")
    feeds = {"log_probs": np.full((4, 1, 3), -1.1, np.float32), "targets": np.array([[1, 9]]),
             "input_lengths": np.array([4]), "target_lengths": np.array([2])}
    return b.build(), feeds, r"node ctc \(CTCLoss\) failed: target labels must be in \[0, 3\)"


def _layer_norm_scale():
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("n", 6))
    s = b.input("scale", DType.F32, ("k",))
    b.output(b.op("LayerNormalization", x, s, name="ln"), "y")
    feeds = {"x": np.ones((2, 6), np.float32), "scale": np.ones(4, np.float32)}
    return b.build(), feeds, r"node ln \(LayerNormalization\): .*Scale has shape \[4\], which " \
                            r"does not broadcast onto the input \[2, 6\]"


def _conv_bias_fed():
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("n", 2, 5, 5))
    bias = b.input("bias", DType.F32, ("m",))
    b.output(b.op("Conv", x, b.initializer("w", f32(RNG, 3, 2, 3, 3)), bias, name="conv"), "y")
    feeds = {"x": np.ones((1, 2, 5, 5), np.float32), "bias": np.ones(5, np.float32)}
    return b.build(), feeds, r"node conv \(Conv\): .*B has shape \[5\]; it must be \[3\]"


def _gather_out_of_range():
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("n", 4))
    i = b.input("i", DType.I64, ("k",))
    b.output(b.op("Gather", x, i, axis=1, name="pick"), "y")
    feeds = {"x": np.ones((2, 4), np.float32), "i": np.array([0, 11])}
    return b.build(), feeds, r"node pick \(Gather\) failed: IndexError"


CASES = {f.__name__[1:]: f for f in (_nll_out_of_range, _sce_out_of_range, _ctc_too_long,
                                     _gather_out_of_range)}


@pytest.mark.parametrize("optimize", [True, False], ids=["optimized", "plain"])
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_failures_name_the_node(case, optimize):
    graph, feeds, message = CASES[case]()
    s = Session(graph, optimize=optimize)
    with pytest.raises(OneModelError, match=message) as info:
        s.run(feeds)
    assert isinstance(info.value, ExecutionError)
    assert info.value.__cause__ is not None  # the kernel's own error stays attached
    # the session still serves good requests afterwards
    good = {k: np.zeros_like(v) if v.dtype.kind == "i" else v for k, v in feeds.items()}
    if case == "ctc_too_long":
        good["targets"] = np.array([[1, 2]])
        good["input_lengths"] = np.array([4])
        good["target_lengths"] = np.array([2])
    s.run(good)


@pytest.mark.parametrize("optimize", [True, False], ids=["optimized", "plain"])
@pytest.mark.parametrize("make,fix", [(_conv_bias_fed, ("bias", np.ones(3, np.float32))),
                                      (_layer_norm_scale, ("scale", np.ones(6, np.float32)))],
                         ids=["conv bias", "layer norm scale"])
def test_fed_parameters_of_the_wrong_shape_are_refused_when_planning(make, fix, optimize):
    graph, feeds, message = make()
    s = Session(graph, optimize=optimize)
    with pytest.raises(OneModelError, match=message):
        s.run(feeds)
    feeds[fix[0]] = fix[1]
    assert s.run(feeds)[s.outputs[0].name].shape[0] in (1, 2)


def _conv_bn(param_len=5, channels=4):
    b = GraphBuilder()
    x = b.input("input", DType.F32, ("batch", 3, 8, 8))
    h = b.op("Conv", x, b.initializer("w", f32(RNG, channels, 3, 3, 3)))
    params = [b.initializer(n, np.ones(param_len, np.float32)) for n in ("s", "b", "m", "v")]
    h = b.op("BatchNormalization", h, *params, name="bn")
    b.graph.nodes.append(Node("Relu", [h], ["output"], {}, "relu"))
    b.graph.outputs.append(ValueInfo("output", DType.F32, ("batch", channels, 6, 6)))
    return b.graph


@pytest.mark.parametrize("optimize", [True, False], ids=["optimized", "plain"])
def test_mis_shaped_batchnorm_parameters_name_the_node(optimize):
    with pytest.raises(OneModelError, match=r"node bn \(BatchNormalization\): .*scale has shape "
                                            r"\[5\], but the input has 4 channels"):
        Session(_conv_bn(), optimize=optimize)


def test_batchnorm_folding_leaves_mis_shaped_parameters_to_the_validator():
    graph = _conv_bn()
    with pytest.raises(OneModelError, match=r"node bn \(BatchNormalization\)"):
        PassManager(default_passes()).run(graph)
    assert any(n.op == "BatchNormalization" for n in graph.nodes)  # not folded


def test_matching_batchnorm_parameters_still_fold():
    assert Session(_conv_bn(4)).optimizations["batchnorm-folding"] == 1


@pytest.mark.parametrize("trans_b", [0, 1])
def test_mis_shaped_batchnorm_after_gemm_names_the_node(trans_b):
    b = GraphBuilder()
    x = b.input("input", DType.F32, ("batch", 6))
    w = f32(RNG, 4, 6) if trans_b else f32(RNG, 6, 4)
    h = b.op("Gemm", x, b.initializer("w", w), b.initializer("c", np.zeros(4, np.float32)),
             transB=trans_b)
    params = [b.initializer(n, np.ones(5, np.float32)) for n in ("s", "b", "m", "v")]
    h = b.op("BatchNormalization", h, *params, name="bn")
    b.graph.nodes.append(Node("Relu", [h], ["output"], {}, "relu"))
    b.graph.outputs.append(ValueInfo("output", DType.F32, ("batch", 4)))
    with pytest.raises(OneModelError, match=r"node bn \(BatchNormalization\): .*scale has shape"):
        PassManager(default_passes()).run(b.graph)


def _shape_arithmetic(case):
    b = GraphBuilder()
    if case == "gather from the shape of a scalar":
        b.op("Gather", b.op("Shape", b.input("x", DType.F32, ())), b.const([0], "I64"), axis=0,
             name="n")
    elif case == "gather out of range":
        b.op("Gather", b.const([1, 2], "I64"), b.const([5], "I64"), axis=0, name="n")
    else:  # a Slice with no axes: valid, its value simply stays unknown to the shortcut
        b.op("Slice", b.op("Shape", b.input("y", DType.F32, ("n", 3))),
             b.const(np.zeros(0, np.int64)), b.const(np.zeros(0, np.int64)), name="n")
    return b.graph


@pytest.mark.parametrize("case", ["gather from the shape of a scalar", "gather out of range"])
def test_shape_arithmetic_on_bad_constants_names_the_node(case):
    from onemodel.runtime import GraphError

    with pytest.raises(GraphError, match=r"node n \(Gather\): Gather cannot compute its value"):
        _shape_arithmetic(case).validate(allow_unknown=True)


def test_shape_arithmetic_the_value_shortcut_cannot_follow_stays_unknown():
    specs = _shape_arithmetic("slice without axes").validate(allow_unknown=True)
    assert [s.shape for s in specs.values() if s is not None][-1] == (2,)


def _loss_graph(op, *inputs, **attrs):
    b = GraphBuilder()
    names = [b.input(name, dt, tuple(f"{name}{k}" for k in range(rank)))
             for name, dt, rank in inputs]
    b.op(op, *names, name="loss", **attrs)
    b.graph.outputs.append(ValueInfo(b.graph.nodes[-1].outputs[0], DType.F32, ()))
    return b.graph


NLL = ("NegativeLogLikelihoodLoss", ("x", DType.F32, 2), ("t", DType.I64, 1))
CTC = ("CTCLoss", ("lp", DType.F32, 3), ("targets", DType.I64, 2), ("il", DType.I64, 1),
       ("tl", DType.I64, 1))
LP = np.log(np.full((4, 1, 3), 1 / 3, np.float32))


@pytest.mark.parametrize("graph,feeds,message", [
    # a negative class index used to wrap around to the last class, silently
    (NLL, {"x": np.zeros((2, 3), np.float32), "t": np.array([0, -1])},
     r"target values must be class indices in \[0, 3\).* got -1"),
    (NLL + ({"ignore_index": 1},), {"x": np.zeros((2, 3), np.float32), "t": np.array([1, 3])},
     r"target values must be class indices in \[0, 3\).* got 3"),
    # a target length beyond the padded targets used to be cut short, silently
    (CTC, {"lp": LP, "targets": np.array([[1, 2]]), "il": np.array([4]), "tl": np.array([3])},
     r"target_lengths must be in \[0, 2\].* got 3"),
    (CTC, {"lp": LP, "targets": np.array([[1, 2]]), "il": np.array([5]), "tl": np.array([2])},
     r"input_lengths must be in \[1, 4\].* got 5"),
    (CTC, {"lp": LP, "targets": np.array([[1, 7]]), "il": np.array([4]), "tl": np.array([2])},
     r"target labels must be in \[0, 3\) and not the blank 0.* got 7"),
], ids=["nll negative", "nll too big", "ctc target length", "ctc input length", "ctc label"])
def test_loss_inputs_out_of_range_are_errors_not_silent(graph, feeds, message):
    op, *inputs = graph
    attrs = inputs.pop() if isinstance(inputs[-1], dict) else {}
    s = Session(_loss_graph(op, *inputs, **attrs), optimize=False)
    with pytest.raises(ExecutionError, match=rf"node loss \({op}\) failed: .*{message}"):
        s.run(feeds)


@pytest.mark.parametrize("op,name", [("LayerNormalization", "Scale"),
                                     ("RMSNormalization", "scale")])
def test_a_normalization_scale_that_does_not_fit_names_the_node(op, name):
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("n", 6))
    b.op(op, x, b.initializer("s", np.ones(4, np.float32)), name="norm")
    with pytest.raises(OneModelError, match=rf"node norm \({op}\): .*{name} has shape \[4\], "
                                            r"which does not broadcast onto the input \[n, 6\]"):
        b.graph.validate()


def _windowed(op, **attrs):
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("n", 2, "h", "w"))
    w_shape = (2, 3, 1, 1) if op == "ConvTranspose" else (3, 2, 4, 4)
    b.output(b.op(op, x, b.initializer("w", f32(RNG, *w_shape)), name="win", **attrs), "y")
    return b.build()


@pytest.mark.parametrize("optimize", [True, False], ids=["optimized", "plain"])
@pytest.mark.parametrize("op, attrs, message", [
    ("Conv", dict(strides=[4, 4]), r"node win \(Conv\): .*kernel extent 4 is larger than the "
                                   r"padded input 2"),
    ("FusedConv", dict(strides=[4, 4], activation="Relu"), r"kernel extent 4 is larger"),
    ("ConvTranspose", dict(pads=[1, 1, 1, 1]), r"ConvTranspose: output size 0 along spatial "
                                               r"axis 0"),
])
def test_windows_that_do_not_fit_the_input_are_errors_not_empty_outputs(op, attrs, message,
                                                                       optimize):
    """A 4x4 window over a 2x2 image: the symbolic size floor((2 - 4) / 4) + 1 is 0, and this
    planned an empty output, then a network of NaNs (a ConvNeXt fed 2x2 images), where
    PyTorch and onnxruntime refuse the input. The sizes that fit still run."""
    s = Session(_windowed(op, **attrs), optimize=optimize)
    with pytest.raises(OneModelError, match=message):
        s.run({"x": np.ones((1, 2, 2, 2), np.float32)})
    y = s.run({"x": np.ones((1, 2, 8, 8), np.float32)})["y"]
    assert y.shape == ((1, 3, 2, 2) if op != "ConvTranspose" else (1, 3, 6, 6))
