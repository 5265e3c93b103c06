"""Serving: a batch of zero runs as ONNX and numpy define it (empty outputs of the right shape),
checked against PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_graphs import attention, conv_net, eager, f32, mlp, random_feeds

from onemodel.runtime import GraphBuilder, Session
from onemodel.tensors import DType

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _t(a):
    return torch.from_numpy(np.array(a))


@pytest.mark.parametrize("optimize", [True, False], ids=["optimized", "plain"])
def test_mlp_at_batch_zero_matches_torch(optimize):
    g = mlp(sizes=(20, 30, 5))
    x = np.zeros((0, 20), np.float32)
    i = {k: _t(v) for k, v in g.initializers.items()}
    ref = F.relu(_t(x) @ i["fc0.weight"] + i["fc0.bias"]) @ i["fc1.weight"] + i["fc1.bias"]
    got = Session(g, optimize=optimize).run({"input": x})["output"].numpy()
    assert got.shape == tuple(ref.shape) == (0, 5) and got.dtype == np.float32


@pytest.mark.parametrize("optimize", [True, False], ids=["optimized", "plain"])
def test_conv_net_at_batch_zero_matches_torch(optimize):
    g = conv_net()
    i = {k: _t(v) for k, v in g.initializers.items()}
    s = Session(g, optimize=optimize)
    for batch in (0, 2, 0):  # zero before and after a non-empty batch
        x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16)).astype(np.float32)
        h = F.conv2d(_t(x), i["c1.w"], i["c1.b"], padding=1)
        h = F.relu(F.batch_norm(h, i["bn1.mean"], i["bn1.var"], i["bn1.weight"], i["bn1.bias"]))
        h = F.max_pool2d(h, 2)
        h = F.conv2d(h, i["c2.w"], stride=2, padding=1)
        h = F.relu(F.batch_norm(h, i["bn2.mean"], i["bn2.var"], i["bn2.weight"], i["bn2.bias"]))
        ref = F.linear(F.avg_pool2d(h, 2).flatten(1), i["fc.w"], i["fc.b"]).numpy()
        got = s.run({"input": x})["output"].numpy()
        assert got.shape == ref.shape == (batch, 10)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_attention_at_batch_zero_and_sequence_zero():
    g = attention()
    s = Session(g)
    for bindings in ({"batch": 0, "seq": 4}, {"batch": 2, "seq": 0}):
        feeds = random_feeds(g, bindings)
        got = s.run(feeds)["output"].numpy()
        want = eager(g, feeds)["output"]
        assert got.shape == want.shape == (bindings["batch"], bindings["seq"], 16)


def _one_op(op, x_shape, *inits, **attrs):
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", *x_shape[1:]))
    names = [b.initializer(f"p{k}", v) for k, v in enumerate(inits)]
    b.output(b.op(op, x, *names, **attrs), "y")
    return b.build()


RNG = np.random.default_rng(7)
W = f32(RNG, 6, 4, 3, 3)
WG = f32(RNG, 6, 2, 3, 3)
WT = f32(RNG, 4, 5, 3, 3)
C4 = [RNG.uniform(0.5, 1.5, 4).astype(np.float32) for _ in range(4)]
B6, G3, GB3 = f32(RNG, 6), f32(RNG, 3, 7), f32(RNG, 3)
CASES = {
    "Conv": (("Conv", (0, 4, 9, 9), W, B6), dict(pads=(1, 1, 1, 1), strides=(2, 2)),
             lambda x: F.conv2d(x, _t(W), _t(B6), stride=2, padding=1)),
    "Conv group": (("Conv", (0, 4, 9, 9), WG), dict(group=2),
                   lambda x: F.conv2d(x, _t(WG), groups=2)),
    "ConvTranspose": (("ConvTranspose", (0, 4, 5, 5), WT), dict(strides=(2, 2)),
                      lambda x: F.conv_transpose2d(x, _t(WT), stride=2)),
    "MaxPool": (("MaxPool", (0, 4, 9, 9)), dict(kernel_shape=(3, 3), strides=(2, 2),
                                                pads=(1, 1, 1, 1)),
                lambda x: F.max_pool2d(x, 3, 2, 1)),
    "AveragePool": (("AveragePool", (0, 4, 9, 9)), dict(kernel_shape=(2, 2), strides=(2, 2)),
                    lambda x: F.avg_pool2d(x, 2)),
    "GlobalAveragePool": (("GlobalAveragePool", (0, 4, 5, 5)), {},
                          lambda x: F.adaptive_avg_pool2d(x, 1)),
    "GlobalMaxPool": (("GlobalMaxPool", (0, 4, 5, 5)), {}, lambda x: F.adaptive_max_pool2d(x, 1)),
    "BatchNormalization": (("BatchNormalization", (0, 4, 5, 5), *C4), {},
                           lambda x: F.batch_norm(x, _t(C4[2]), _t(C4[3]), _t(C4[0]),
                                                  _t(C4[1]))),
    "LayerNormalization": (("LayerNormalization", (0, 7), np.ones(7, np.float32)), {},
                           lambda x: F.layer_norm(x, (7,))),
    "Softmax": (("Softmax", (0, 7)), {}, lambda x: F.softmax(x, -1)),
    "LogSoftmax": (("LogSoftmax", (0, 7)), {}, lambda x: F.log_softmax(x, -1)),
    "Softmax over batch": (("Softmax", (0, 7)), dict(axis=0), lambda x: F.softmax(x, 0)),
    "LogSoftmax over batch": (("LogSoftmax", (0, 7)), dict(axis=0),
                              lambda x: F.log_softmax(x, 0)),
    "Flatten": (("Flatten", (0, 4, 3, 3)), {}, lambda x: x.flatten(1)),
    "Gemm": (("Gemm", (0, 7), G3, GB3), dict(transB=1), lambda x: F.linear(x, _t(G3), _t(GB3))),
    "LRN": (("LRN", (0, 4, 3, 3)), dict(size=3), lambda x: F.local_response_norm(x, 3)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_nn_ops_on_an_empty_batch_match_torch(case):
    (op, shape, *inits), attrs, ref = CASES[case]
    graph = _one_op(op, shape, *inits, **attrs)
    x = np.zeros(shape, np.float32)
    want = ref(_t(x)).numpy()
    got = Session(graph, optimize=False).run({"x": x})["y"].numpy()
    assert got.shape == want.shape and got.dtype == want.dtype
    # the kernels themselves (eager dispatch), which the session skips for empty outputs
    kernel = eager(graph, {"x": x})["y"]
    assert kernel.shape == want.shape and kernel.dtype == want.dtype
    # and the same kernels on a non-empty batch agree with torch, so the cases are meaningful
    x1 = np.random.default_rng(1).standard_normal((2, *shape[1:])).astype(np.float32)
    np.testing.assert_allclose(eager(graph, {"x": x1})["y"], ref(_t(x1)).numpy(), rtol=1e-4,
                               atol=1e-5)


def test_traced_cnn_at_batch_zero_runs_like_the_eager_model():
    pytest.importorskip("onemodel.tracing")
    from onemodel.tensors import Generator, Tensor
    from onemodel.training import layers as L

    gen = Generator(0)
    cnn = L.Sequential(L.Conv2d(3, 4, 3, padding=1, generator=gen), L.BatchNorm2d(4), L.ReLU(),
                       L.MaxPool2d(2), L.AvgPool2d(2), L.Flatten(), L.Linear(4 * 2 * 2, 5, gen))
    cnn.eval()
    example = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    s = Session(cnn.trace(Tensor.from_numpy(example), "batch", None, None, None).graph)
    empty = np.zeros((0, 3, 8, 8), np.float32)
    got = s.run({"input": empty})["output"].numpy()
    want = cnn(Tensor.from_numpy(empty)).numpy()  # eager: the kernels on an empty batch
    assert got.shape == want.shape == (0, 5)
    np.testing.assert_allclose(s.run({"input": example})["output"].numpy(),
                               cnn(Tensor.from_numpy(example)).numpy(), rtol=1e-4, atol=1e-5)
