"""Real architectures (transformers' BERT, GPT-2, LLaMA, T5, Whisper's encoder, ResNet, ConvNeXt,
MobileNetV2, DeepLabV3, Segformer, ViT, Swin, YOLOS, DETR), built from tiny configs with random
weights and exported by both PyTorch exporters with dynamic axes: each file loads with those axes
symbolic and agrees with onnxruntime at two sizes through one session.

The default run covers a subset; ``-m slow_models`` (or ONEMODEL_SLOW_MODELS=1) runs the rest.
Exported files are cached between runs (see builders.py)."""

from __future__ import annotations

import builders
import numpy as np
import pytest

try:
    builders.import_transformers()
except ImportError:
    pytest.skip("transformers is not installed (scripts/dev.py installs it)", allow_module_level=True)
pytest.importorskip("onnxscript")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from cases import cases  # noqa: E402

from onemodel.onnx.importer import from_model  # noqa: E402
from onemodel.runtime import Session  # noqa: E402
from onemodel.tensors import DimExpr, OneModelError  # noqa: E402

# (model, exporter) -> the reason it cannot pass yet; strict, so it shows when it starts passing
XFAIL: dict[tuple[str, str], str] = {}


def _ort(path):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(("name", "exporter"), list(cases(builders.specs(), XFAIL)))
def test_real_model_loads_symbolic_and_agrees_with_onnxruntime(name, exporter):
    spec = builders.specs()[name]
    path = builders.exported(name, exporter)

    # the exporter kept the dynamic axes (a silently specialized axis would test nothing)
    declared = {v.name: v.type.tensor_type.shape.dim for v in onnx.load(str(path)).graph.input}
    for inp in spec.inputs:
        for k, d in enumerate(inp.shape):
            assert bool(declared[inp.name][k].dim_param) == spec.dynamic(exporter, d), \
                f"{inp.name} axis {k}: {declared[inp.name][k]}"

    session = Session.load(path)
    for v, inp in zip(session.graph.inputs, spec.inputs):
        assert v.name == inp.name
        for d, want in zip(v.shape, inp.shape):
            if spec.dynamic(exporter, want):
                assert isinstance(d, DimExpr), f"{v.name}: {v.shape}"
            else:
                assert d == (want.sizes[0] if isinstance(want, builders.Axis) else want), \
                    f"{v.name}: {v.shape}"

    ref = _ort(path)
    for which in (0, 1):
        feeds = spec.feeds(which, exporter)
        want = ref.run(None, feeds)[0]
        got = session.run(feeds, return_numpy=True)[spec.outputs[0]]
        assert want.std() > 1e-3, "a degenerate output would agree with anything"
        assert got.shape == want.shape
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale,
                                   err_msg=f"{name} by {exporter} at {feeds_shapes(feeds)}")


def _one_thread_session_agrees(name: str) -> Session:
    """The TorchScript export of ``name`` run by a one-thread session on both feed sets: the
    first output agrees with onnxruntime's at one thread. Returns the session."""
    spec = builders.specs()[name]
    path = builders.exported(name, "torchscript")
    session, ref = Session.load(path, threads=1), _ort(path)
    for which in (0, 1):
        feeds = spec.feeds(which, "torchscript")
        want = ref.run(None, feeds)[0]
        got = session.run(feeds, return_numpy=True)[spec.outputs[0]]
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale)
    return session


@pytest.mark.parametrize("name", ["bert", "vit"])
def test_one_thread_session_by_the_numba_register_tiles_agrees_with_onnxruntime(
        name, monkeypatch):
    """transformers-library exports run by a one-thread session: their MatMuls by the file's
    weights go by the numba plugin's packed panels (when the CPU has AVX2 and FMA), a ViT's
    patch embedding and the rest by its register tiles; the outputs agree with onnxruntime."""
    taken = []
    try:
        from onemodel.numba import gemm
    except ImportError:  # the core without the plugin: the reference kernels
        gemm = None
    else:
        real = gemm._panel_product

        def spy(b, *args, **kwargs):
            taken.append(b.shape)
            return real(b, *args, **kwargs)
        monkeypatch.setattr(gemm, "_panel_product", spy)
    _one_thread_session_agrees(name)
    if gemm is not None:
        from onemodel.numba._simd import host_has_fma

        assert bool(taken) == host_has_fma(), taken


def test_convnext_layer_norms_read_their_permuted_views(monkeypatch):
    """transformers' ConvNeXt normalizes each block's (N, H, W, C) permutation of a
    channels-first activation: the numba plugin's LayerNorm reads those views without copying
    them (its channels kernel, bound at a one-thread session's first call); the outputs agree
    with onnxruntime."""
    bound = []
    try:
        from onemodel.numba import _jit, norm
    except ImportError:  # the core without the plugin: the reference kernels
        norm = None
    else:
        real_bind = _jit.bind

        def bind(slot, kernel, args):
            if kernel is norm._layer_norm_channels.serial:
                bound.append(args[0].shape)
            return real_bind(slot, kernel, args)
        monkeypatch.setattr(_jit, "bind", bind)
    _one_thread_session_agrees("convnext")
    if norm is not None:
        assert bound, "no LayerNorm read a permuted view"


def test_convnext_channels_first_layer_norms_are_one_node():
    """transformers' ConvNeXt normalizes its stem's and its downsampling layer's channels with
    a Transpose to channels-last, a LayerNormalization and the Transpose back: each becomes
    one ChannelLayerNormalization (the blocks' norms, read by a Linear in channels-last
    layout, stay); the outputs agree with onnxruntime."""
    session = _one_thread_session_agrees("convnext")
    ops = [n.op for n in session.graph.nodes]
    assert session.optimizations.get("channel-layer-norm-fusion") == 2
    assert ops.count("ChannelLayerNormalization") == 2
    assert ops.count("LayerNormalization") == 3  # two blocks' and the pooled output's


@pytest.mark.parametrize(("name", "expected"), [
    ("bert", ["", "", "Gelu", "Gelu"]),             # Q/K/V merged with their biases; the FFN
    # nn.GELU's order; Q/K/V merged: Q's scale folded into its weights and bias, K's bias
    # zeros (Whisper's k_proj has none)
    ("whisper_encoder", ["", "", "Gelu", "Gelu"]),
    ("convnext", ["", "", "Gelu", "Gelu"]),           # 4-D activations (N, H, W, C)
])
def test_linear_layers_take_their_bias_and_gelu_in_the_matmul(name, expected):
    """transformers-library exports write a Linear layer on 3-D (or 4-D) activations as MatMul
    and Add, and GELU as five nodes: with the numba plugin each becomes one FusedMatMul, whose
    kernel adds the bias and applies GELU as one pass over the product; the outputs agree with
    onnxruntime at one thread."""
    session = _one_thread_session_agrees(name)
    acts = sorted(n.attrs["activation"] for n in session.graph.nodes if n.op == "FusedMatMul")
    if "matmul-epilogue-fusion" in session.optimizations:  # the numba plugin's pass
        assert acts == expected
        assert "Erf" not in {n.op for n in session.graph.nodes}
    else:
        assert acts == []


def feeds_shapes(feeds) -> str:
    return ", ".join(f"{k}{list(v.shape)}" for k, v in feeds.items())


@pytest.mark.torch
@pytest.mark.parametrize("name", ["bert", "llama"])
def test_inputs_whose_axes_carry_different_names(name):
    # files written by other tools name the mask's axes apart from the ids' (batch_size,
    # sequence_length against batch, seq): the mask broadcasts against the attention scores
    # over two different symbols, settled when the plan sees real sizes
    spec = builders.specs()[name]
    model = onnx.load(str(builders.exported(name, "torchscript")))
    for v in model.graph.input:
        if v.name == "attention_mask":
            for d, new in zip(v.type.tensor_type.shape.dim, ("batch_size", "sequence_length")):
                d.dim_param = new
    session = Session(from_model(model, name))
    mask = next(v for v in session.graph.inputs if v.name == "attention_mask")
    assert [str(d) for d in mask.shape] == ["batch_size", "sequence_length"]
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for which in (0, 1):
        feeds = spec.feeds(which)
        want = ref.run(None, feeds)[0]
        got = session.run(feeds, return_numpy=True)[spec.outputs[0]]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want).max()))
    bad = spec.feeds(0)
    bad["attention_mask"] = bad["attention_mask"][:, :-1]  # one position short
    with pytest.raises(OneModelError):
        session.run(bad)
