"""RNN, GRU and LSTM ops: forward against onnxruntime (an independent ONNX implementation) over
directions, layouts, sequence_lens, activations, clip, peepholes and linear_before_reset; the
shape rule on symbolic dims; gradients (BPTT in RNNGrad/GRUGrad/LSTMGrad) against central
finite differences of the forward kernel in float64."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.tensors import DimExpr, DType, OneModelError, Tensor, TensorSpec
from onemodel.tensors.dispatch import dispatch
from onemodel.tensors.ops import OPS

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
T, N, I, H = 4, 3, 5, 3


def make_inputs(kind, nd, *, rng, bias=True, lens=None, state=True, peep=False, layout=0,
                dtype=np.float32):
    g = GATES[kind]
    x = rng.standard_normal((T, N, I) if layout == 0 else (N, T, I))
    ins = {"X": x, "W": rng.standard_normal((nd, g * H, I)) * 0.5,
           "R": rng.standard_normal((nd, g * H, H)) * 0.5}
    if bias:
        ins["B"] = rng.standard_normal((nd, 2 * g * H)) * 0.5
    if lens is not None:
        ins["sequence_lens"] = np.asarray(lens, np.int32)
    if state:
        shape = (nd, N, H) if layout == 0 else (N, nd, H)
        ins["initial_h"] = rng.standard_normal(shape) * 0.5
        if kind == "LSTM":
            ins["initial_c"] = rng.standard_normal(shape) * 0.5
    if peep:
        ins["P"] = rng.standard_normal((nd, 3 * H)) * 0.5
    return {k: v if k == "sequence_lens" else v.astype(dtype) for k, v in ins.items()}


def run_ours(kind, ins, attrs):
    names = OPS[kind].inputs
    args = [None if ins.get(n) is None else Tensor.from_numpy(ins[n]) for n in names]
    while args and args[-1] is None:
        args.pop()
    return [o.numpy() for o in dispatch(kind, args, attrs)]


def run_ort(kind, ins, attrs):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    names = OPS[kind].inputs
    node_inputs = [n if n in ins else "" for n in names]
    while node_inputs and not node_inputs[-1]:
        node_inputs.pop()
    outs = ["Y", "Y_h"] + (["Y_c"] if kind == "LSTM" else [])
    node = helper.make_node(kind, node_inputs, outs, **attrs)
    inputs = [helper.make_tensor_value_info(
        n, TensorProto.INT32 if n == "sequence_lens" else TensorProto.FLOAT, list(ins[n].shape))
        for n in names if n in ins]
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                               for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, ins)


def to_batchwise(ins):
    """The layout-1 form of layout-0 inputs."""
    out = dict(ins)
    out["X"] = ins["X"].transpose(1, 0, 2).copy()
    for k in ("initial_h", "initial_c"):
        if k in ins:
            out[k] = ins[k].transpose(1, 0, 2).copy()
    return out


CASES = [
    ("RNN", {}, {}),
    ("RNN", {"direction": "reverse", "activations": ["Relu"]}, {}),
    ("RNN", {"direction": "bidirectional", "clip": 0.7}, {"lens": [4, 2, 0]}),
    ("GRU", {}, {}),
    ("GRU", {"linear_before_reset": 1, "direction": "bidirectional"}, {"lens": [3, 4, 1]}),
    ("GRU", {"direction": "reverse", "activations": ["HardSigmoid", "Softsign"],
             "activation_alpha": [0.3], "activation_beta": [0.4]}, {"bias": False}),
    ("LSTM", {}, {}),
    ("LSTM", {"direction": "bidirectional"}, {"lens": [2, 4, 3], "peep": True}),
    ("LSTM", {"direction": "reverse", "clip": 0.5}, {"state": False}),
    ("LSTM", {"input_forget": 1}, {"peep": True}),
    ("LSTM", {"activations": ["Sigmoid", "Elu", "LeakyRelu"], "activation_alpha": [0.7, 0.2]},
     {"lens": [1, 4, 2]}),
]


@pytest.mark.parametrize("kind,attrs,opts", CASES,
                         ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(CASES)])
def test_forward_matches_onnxruntime(kind, attrs, opts):
    nd = 2 if attrs.get("direction") == "bidirectional" else 1
    rng = np.random.default_rng(len(str(attrs)))
    ins = make_inputs(kind, nd, rng=rng, **opts)
    attrs = {"hidden_size": H, **attrs}
    ours = run_ours(kind, ins, attrs)
    want = run_ort(kind, ins, attrs)
    assert len(ours) == len(want)
    for got, ref, name in zip(ours, want, ["Y", "Y_h", "Y_c"]):
        assert got.shape == ref.shape, name
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=name)
    # layout 1 (batch first) is the same computation on transposed inputs and outputs
    batchwise = run_ours(kind, to_batchwise(ins), {**attrs, "layout": 1})
    np.testing.assert_allclose(batchwise[0], ours[0].transpose(2, 0, 1, 3), rtol=1e-6, atol=1e-6)
    for got, ref in zip(batchwise[1:], ours[1:]):
        np.testing.assert_allclose(got, ref.transpose(1, 0, 2), rtol=1e-6, atol=1e-6)


def test_lstm_against_direct_numpy_loop():
    """One forward step written out by hand from the ONNX formulas (no shared code)."""
    rng = np.random.default_rng(3)
    ins = make_inputs("LSTM", 1, rng=rng, peep=True, dtype=np.float64)
    W, R, B, P = ins["W"][0], ins["R"][0], ins["B"][0], ins["P"][0]
    h, c = ins["initial_h"][0], ins["initial_c"][0]

    def sig(v):
        return 1 / (1 + np.exp(-v))

    ys = []
    for t in range(T):
        a = ins["X"][t] @ W.T + h @ R.T + B[:4 * H] + B[4 * H:]
        i = sig(a[:, :H] + P[:H] * c)
        f = sig(a[:, 2 * H:3 * H] + P[2 * H:] * c)
        c = f * c + i * np.tanh(a[:, 3 * H:])
        o = sig(a[:, H:2 * H] + P[H:2 * H] * c)
        h = o * np.tanh(c)
        ys.append(h)
    Y, Yh, Yc = run_ours("LSTM", ins, {"hidden_size": H})
    np.testing.assert_allclose(Y[:, 0], np.stack(ys), rtol=1e-12)
    np.testing.assert_allclose(Yh[0], h, rtol=1e-12)
    np.testing.assert_allclose(Yc[0], c, rtol=1e-12)


def test_shape_rule_is_symbolic():
    seq, batch = DimExpr.symbol("seq"), DimExpr.symbol("batch")
    f32 = DType.F32
    specs = [TensorSpec((batch, seq, 5), f32), TensorSpec((2, 12, 5), f32),
             TensorSpec((2, 12, 3), f32)]
    y, yh, yc = OPS["LSTM"].infer(specs, {"direction": "bidirectional", "layout": 1})
    assert y.shape == (batch, seq, 2, 3) and yh.shape == (batch, 2, 3) == yc.shape
    y, yh = OPS["GRU"].infer([TensorSpec((seq, batch, 5), f32), TensorSpec((1, 9, 5), f32),
                              TensorSpec((1, 9, 3), f32)], {"hidden_size": 3})
    assert y.shape == (seq, 1, batch, 3) and yh.shape == (1, batch, 3)
    with pytest.raises(OneModelError, match="hidden_size"):
        OPS["RNN"].infer([TensorSpec((seq, batch, 5), f32), TensorSpec((1, 4, 5), f32),
                          TensorSpec((1, 4, 4), f32)], {"hidden_size": 3})
    with pytest.raises(OneModelError, match="W has shape"):
        OPS["GRU"].infer([TensorSpec((seq, batch, 5), f32), TensorSpec((1, 9, 4), f32),
                          TensorSpec((1, 9, 3), f32)], {})
    with pytest.raises(OneModelError, match="activation"):
        OPS["RNN"].infer(specs[:1] + [TensorSpec((1, 3, 5), f32), TensorSpec((1, 3, 3), f32)],
                         {"activations": ["Swish"]})


def test_bad_sequence_lens_is_a_onemodel_error():
    ins = make_inputs("RNN", 1, rng=np.random.default_rng(0), lens=[1, 9, 2])
    with pytest.raises(OneModelError, match="sequence_lens"):
        run_ours("RNN", ins, {})


# gradients ---------------------------------------------------------------------------------

GRAD_CASES = [
    ("RNN", {"direction": "bidirectional"}, {"lens": [4, 0, 3]}),
    ("RNN", {"activations": ["Softplus"], "layout": 1}, {}),
    ("GRU", {}, {}),
    ("GRU", {"linear_before_reset": 1, "direction": "reverse"}, {"lens": [2, 4, 1]}),
    ("GRU", {"direction": "bidirectional", "layout": 1, "clip": 0.8}, {}),
    ("LSTM", {}, {"peep": True}),
    ("LSTM", {"direction": "bidirectional"}, {"lens": [3, 1, 4], "peep": True}),
    ("LSTM", {"direction": "reverse", "layout": 1, "input_forget": 1}, {"peep": True}),
    ("LSTM", {"activations": ["HardSigmoid", "ScaledTanh", "Affine"],
              "activation_alpha": [0.3, 0.9, 0.5], "activation_beta": [0.45, 1.1, 0.1],
              "clip": 1.2}, {}),
]


def _loss_weights(outs, rng):
    return [rng.standard_normal(o.shape) for o in outs]


@pytest.mark.parametrize("kind,attrs,opts", GRAD_CASES,
                         ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(GRAD_CASES)])
def test_gradients_match_finite_differences(kind, attrs, opts):
    nd = 2 if attrs.get("direction") == "bidirectional" else 1
    rng = np.random.default_rng(7)
    ins = make_inputs(kind, nd, rng=rng, dtype=np.float64, layout=attrs.get("layout", 0), **opts)
    attrs = {"hidden_size": H, **attrs}
    names = [n for n in OPS[kind].inputs if n in ins]
    weights = _loss_weights(run_ours(kind, ins, attrs), rng)

    def loss(values):
        return sum(float((o * w).sum()) for o, w in zip(run_ours(kind, values, attrs), weights))

    tensors = {n: Tensor.from_numpy(ins[n]) for n in names}
    for n in names:
        if n != "sequence_lens":
            tensors[n].requires_grad_()
    args = [tensors.get(n) for n in OPS[kind].inputs]
    while args[-1] is None:
        args.pop()
    outs = dispatch(kind, args, attrs)
    total = sum((o * Tensor.from_numpy(w)).sum() for o, w in zip(outs, weights))
    total.backward()
    eps = 1e-6
    for n in names:
        if n == "sequence_lens":
            continue
        got = tensors[n].grad.numpy()
        want = np.zeros_like(ins[n])
        for idx in np.ndindex(*ins[n].shape):
            plus, minus = dict(ins), dict(ins)
            plus[n] = ins[n].copy()
            minus[n] = ins[n].copy()
            plus[n][idx] += eps
            minus[n][idx] -= eps
            want[idx] = (loss(plus) - loss(minus)) / (2 * eps)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=n)


def test_gradient_of_one_output_only():
    """Only Y_h used: the other outputs' gradients are zeros and the result still matches."""
    rng = np.random.default_rng(1)
    ins = make_inputs("GRU", 1, rng=rng, dtype=np.float64)
    x = Tensor.from_numpy(ins["X"]).requires_grad_()
    w, r = Tensor.from_numpy(ins["W"]), Tensor.from_numpy(ins["R"])
    _, yh = dispatch("GRU", [x, w, r], {"hidden_size": H})
    yh.sum().backward()

    def f(xv):
        return run_ours("GRU", {"X": xv, "W": ins["W"], "R": ins["R"]}, {})[1].sum()

    eps, want = 1e-6, np.zeros_like(ins["X"])
    for idx in np.ndindex(*ins["X"].shape):
        p, m = ins["X"].copy(), ins["X"].copy()
        p[idx] += eps
        m[idx] -= eps
        want[idx] = (f(p) - f(m)) / (2 * eps)
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-5, atol=1e-7)
