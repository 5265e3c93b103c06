"""Winograd F(2x2, 3x3) convolutions (onemodel.numba.winograd) against the reference kernel:
odd output sizes (a partial last block), uneven pads, batches, every activation, with and
without bias and ``out=``, float32 and float64; taken only for constant weights nothing can
change in place, on one thread, for the shapes it suits; and a session whose BatchNorm is
folded into its 3x3 convolutions (folded weights are such constants) against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from conv_arrays import conv_arrays, file_constant, fused_site

from onemodel.numba import _jit, conv, conv_rows, winograd
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.specialize import specialize

ACTIVATIONS = ["", "Relu", "Sigmoid", "Tanh", "HardSwish", "Silu"]
# relative to the output's scale: float32 transforms round differently from the direct sum
TOL = {np.float32: 5e-6, np.float64: 1e-12}


@pytest.fixture(autouse=True)
def one_thread(monkeypatch, no_small_convolutions, serial):
    """Serial kernels (Winograd runs on one thread only), small shapes admitted; not the
    convolution rows, which take convolutions of four input channels or fewer ahead of it."""
    monkeypatch.setattr(conv_rows, "fits", lambda *args: False)
    monkeypatch.setattr(winograd, "MIN_CHANNELS", 4)
    monkeypatch.setattr(winograd, "MIN_PLANE", 4)


CASES = [  # (X shape, W shape, attrs)
    ((1, 8, 14, 14), (6, 8, 3, 3), dict(pads=(1, 1, 1, 1))),
    ((2, 5, 13, 11), (7, 5, 3, 3), dict(pads=(1, 1, 1, 1))),  # odd outputs: partial blocks
    ((1, 6, 12, 15), (8, 6, 3, 3), dict(pads=(0, 2, 1, 0))),  # uneven pads
    ((3, 4, 9, 10), (5, 4, 3, 3), {}),  # no padding: 7x8 outputs
    ((1, 4, 6, 7), (4, 4, 3, 3), dict(auto_pad="SAME_UPPER")),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("xs, ws, attrs", CASES)
def test_winograd_matches_the_reference(xs, ws, attrs, dtype):
    x, w, b = conv_arrays(xs, ws, dtype, seed=3)
    w = file_constant(w)
    # errors scale with the sums before the activation (Tanh's outputs stay within 1)
    scale = max(float(np.abs(OPS["Conv"].kernel(x, w, b, **attrs)).max()), 1.0)
    for act, bias in zip(ACTIVATIONS, (b, None, b, None, b, None)):
        kernel, site, inputs = fused_site(x, w, bias, attrs, act)
        plan = conv._plan(xs, ws, x.itemsize, None, conv._key(attrs.get("strides")),
                          conv._key(attrs.get("pads")), None, attrs.get("auto_pad", "NOTSET"),
                          1, True)
        assert isinstance(conv._prepared_weights(plan, xs, w), conv._Winograd)
        call = specialize(kernel, site)
        want = OPS["FusedConv" if act else "Conv"].kernel(
            *inputs, **attrs, **({"activation": act} if act else {}))
        got = call(*inputs)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert float(np.abs(got - want).max()) <= TOL[dtype] * scale, act
        out = np.full(want.shape, np.nan, dtype)
        assert call(*inputs, out=out) is out
        assert float(np.abs(out - want).max()) <= TOL[dtype] * scale


def test_only_constant_weights_on_one_thread_and_suitable_shapes(monkeypatch):
    """Weights that can change in place are never transformed once (an update must show);
    nor on more threads, at a stride, with 1x1 windows or groups, or outside the planes it
    suits."""
    xs, ws = (1, 8, 14, 14), (6, 8, 3, 3)
    plan = conv._plan(xs, ws, 4, None, None, (1, 1, 1, 1), None, "NOTSET", 1, True)
    x, w, b = conv_arrays(xs, ws, np.float32, seed=4)
    assert conv._prepared_weights(plan, xs, file_constant(w)) is not None
    kernel, site, inputs = fused_site(x, w, b, dict(pads=(1, 1, 1, 1)), "")
    call = specialize(kernel, site)
    w *= 2  # in place, after planning: the convolution sees it
    np.testing.assert_allclose(call(*inputs), OPS["Conv"].kernel(x, w, b, pads=(1, 1, 1, 1)),
                               rtol=2e-5, atol=2e-5)
    strided = conv._plan(xs, ws, 4, None, (2, 2), (1, 1, 1, 1), None, "NOTSET", 1, True)
    assert not winograd.fits(strided, xs, ws, 1)
    assert not winograd.fits(conv._plan(xs, (6, 8, 1, 1), 4, None, None, None, None, "NOTSET",
                                        1, True), xs, (6, 8, 1, 1), 1)
    assert not winograd.fits(plan, xs, (6, 4, 3, 3), 2)
    big = conv._plan((1, 8, 70, 70), ws, 4, None, None, (1, 1, 1, 1), None, "NOTSET", 1, True)
    assert not winograd.fits(big, (1, 8, 70, 70), ws, 1)  # 112x112: even with GEMM
    monkeypatch.setattr(winograd, "MIN_PLANE", 64)
    small = conv._plan((1, 8, 7, 7), ws, 4, None, None, (1, 1, 1, 1), None, "NOTSET", 1, True)
    assert not winograd.fits(small, (1, 8, 7, 7), ws, 1)  # 7x7: products of 16 columns
    monkeypatch.setattr(_jit, "_parallel", True)
    assert conv._prepared_weights(plan, xs, file_constant(w)) is None



def test_narrow_convolutions_take_winograd_only_over_large_planes(monkeypatch):
    """16-31 channels in or out: Winograd from 24x24 outputs on (it measured 0.67-0.83x the
    columns there, and slower over 13x13 and 16x16 planes); fewer than 16 channels never."""
    monkeypatch.setattr(winograd, "MIN_CHANNELS", 32)  # the module's thresholds, not the
    monkeypatch.setattr(winograd, "MIN_PLANE", 64)  # small ones the other tests admit
    ws = (64, 16, 3, 3)

    def fits(xs, ws):
        plan = conv._plan(xs, ws, 4, None, None, (1, 1, 1, 1), None, "NOTSET", 1, True)
        return winograd.fits(plan, xs, ws, 1)
    assert fits((1, 16, 54, 54), ws)  # SqueezeNet's first fire modules at 224x224
    assert fits((1, 16, 24, 24), (16, 16, 3, 3))
    assert not fits((1, 16, 23, 23), ws)
    assert not fits((1, 16, 13, 13), ws)
    assert not fits((1, 8, 54, 54), (64, 8, 3, 3))
    assert not fits((1, 32, 54, 54), (8, 32, 3, 3))
    assert fits((1, 32, 13, 13), (32, 32, 3, 3))  # 32 channels: from 8x8 on, as before

def test_a_folded_network_matches_onnxruntime():
    """Conv + BatchNorm + Relu, twice, exported as ONNX: the session folds each BatchNorm
    into its convolution (constants no one else holds, kept read-only) and runs the 3x3
    convolutions by Winograd; onnxruntime is the oracle."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from onemodel.onnx.importer import from_model
    from onemodel.runtime import Session

    rng = np.random.default_rng(5)
    inits, nodes, prev = [], [], "x"
    for i, (c, m) in enumerate(((8, 12), (12, 10))):
        arrays = {f"w{i}": rng.standard_normal((m, c, 3, 3)) * 0.3,
                  f"s{i}": rng.uniform(0.5, 1.5, m), f"b{i}": rng.standard_normal(m),
                  f"mu{i}": rng.standard_normal(m), f"var{i}": rng.uniform(0.5, 2.0, m)}
        inits += [numpy_helper.from_array(v.astype(np.float32), k) for k, v in arrays.items()]
        nodes += [helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("BatchNormalization", [f"c{i}", f"s{i}", f"b{i}", f"mu{i}",
                                                          f"var{i}"], [f"n{i}"]),
                  helper.make_node("Relu", [f"n{i}"], [f"r{i}"])]
        prev = f"r{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["n", 8, 15, 13])], [helper.make_tensor_value_info(
            prev, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    session = Session(from_model(model))
    folded = [n for n in session.graph.nodes if n.op in ("Conv", "FusedConv")]
    assert folded and all(conv._immutable(np.asarray(session.graph.initializers[n.inputs[1]]))
                          for n in folded)
    x = rng.standard_normal((2, 8, 15, 13)).astype(np.float32)
    want = theirs.run(None, {"x": x})[0]
    got = session.run({"x": x}, return_numpy=True)[prev]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
