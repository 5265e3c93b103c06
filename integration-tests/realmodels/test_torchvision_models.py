"""torchvision's classification and segmentation architectures (random weights), exported by both
PyTorch exporters with a dynamic batch axis (and dynamic height and width where the exporter
keeps them): each file loads in OneModel with those axes symbolic and agrees with onnxruntime at
two sizes through one session. The slowest run with ``-m slow_models``."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxscript")
pytest.importorskip("PIL", reason="torchvision imports PIL (scripts/dev.py installs pillow)")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import torchvision_models as tvm  # noqa: E402
from cases import cases  # noqa: E402

from onemodel.runtime import Session  # noqa: E402
from onemodel.tensors import DimExpr  # noqa: E402

try:
    tvm.load_torchvision()
except ImportError as exc:  # pragma: no cover - scripts/dev.py installs it
    pytest.skip(f"torchvision is not installed ({exc}); scripts/dev.py installs it",
                allow_module_level=True)

# (model, exporter) -> why it cannot pass yet; strict, so it shows when it starts passing
XFAIL: dict[tuple[str, str], str] = {}


@pytest.mark.parametrize(("name", "exporter"), list(cases(tvm.specs(), XFAIL)))
def test_torchvision_model_loads_symbolic_and_agrees_with_onnxruntime(name, exporter):
    spec = tvm.specs()[name]
    path = tvm.exported(name, exporter)
    session = Session.load(path)
    for v, inp in zip(session.graph.inputs, spec.inputs):
        for d, want in zip(v.shape, inp.shape):
            if spec.dynamic(exporter, want):
                assert isinstance(d, DimExpr), f"{v.name}: {v.shape}"
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    ref = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    for which in (0, 1):
        feeds = spec.feeds(which, exporter)
        want = ref.run(None, feeds)[0]
        got = session.run(feeds, return_numpy=True)[session.graph.outputs[0].name]
        assert want.std() > 1e-3, "a degenerate output would agree with anything"
        assert got.shape == want.shape
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale,
                                   err_msg=f"{name} by {exporter} at "
                                   f"{ {k: v.shape for k, v in feeds.items()} }")


@pytest.mark.torch
def test_torchvision_detector_with_nms_agrees_with_onnxruntime():
    """SSDLite with its postprocessing (NonMaxSuppression, TopK, gathers): how many boxes come
    out only the data decides, and one session serves two image sizes."""
    path = tvm.exported_detector()
    session = Session.load(path)
    assert all(isinstance(d, DimExpr) for d in session.graph.inputs[0].shape[1:])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    ref = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for h, w in ((64, 64), (80, 96)):
        feeds = {"image": rng.random((3, h, w), dtype=np.float32)}
        want = ref.run(None, feeds)
        got = session.run(feeds, return_numpy=True)
        assert len(want[0]) > 0, "no box survived: the test would check nothing"
        for name, expected in zip(("boxes", "scores", "labels"), want):
            assert got[name].shape == expected.shape, (name, got[name].shape, expected.shape)
            np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{name} at {h}x{w}")


def _agrees_with_onnxruntime(model: str, shape: tuple, seed: int) -> None:
    """The suite's TorchScript export of ``model`` run by a one-thread session and by
    onnxruntime on the same random input of ``shape``: the outputs agree."""
    path = tvm.exported(model, "torchscript")
    session = Session.load(path, threads=1)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    ref = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    name = session.graph.inputs[0].name
    feeds = {name: np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}
    want = ref.run(None, feeds)[0]
    got = next(iter(session.run(feeds, return_numpy=True).values()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.torch
def test_squeezenet_at_224_agrees_with_onnxruntime(monkeypatch):
    """SqueezeNet at the size it was made for: its first fire modules' 3x3 convolutions (16 ->
    64 channels over 55x55 planes) are the narrow ones the numba plugin runs by Winograd; the
    whole network agrees with onnxruntime."""
    narrow = []
    try:
        from onemodel.numba import winograd
    except ImportError:  # the core without the plugin: the reference kernels
        winograd = None
    else:
        fits = winograd.fits

        def spy(plan, xshape, wshape, group):
            taken = fits(plan, xshape, wshape, group)
            if taken and min(xshape[1], wshape[0]) < winograd.MIN_CHANNELS:
                narrow.append(xshape)
            return taken
        monkeypatch.setattr(winograd, "fits", spy)
    _agrees_with_onnxruntime("tv_squeezenet", (1, 3, 224, 224), seed=6)
    if winograd is not None:  # fire2 and fire3's expand3x3 (each asked at least once)
        assert len(narrow) >= 2 and set(narrow) == {(1, 16, 55, 55)}, narrow


TILED = [  # (model, inputs that the numba plugin's register tiles must see at 2x3x64x64, and
    # the 3-channel stem's, which the convolution rows take where the CPU has AVX-512)
    # the 3x3 convolutions over 4x4 and 2x2 planes (128 -> 32 channels), the 7x7 stem
    ("tv_densenet121", {(2, 128, 4, 4), (2, 128, 2, 2)}, (2, 3, 64, 64)),
]


@pytest.mark.torch
@pytest.mark.parametrize("model, inputs, stem", TILED, ids=[m for m, _, _ in TILED])
def test_register_tiles_agree_with_onnxruntime(monkeypatch, model, inputs, stem):
    """Networks whose convolutions the numba plugin runs by register tiles (when the CPU has
    AVX2 and FMA), and whose stem by convolution rows (AVX-512) or the tiles, agree with
    onnxruntime as a whole."""
    taken, rows = [], []
    try:
        from onemodel.numba import conv_rows, tiled
    except ImportError:  # the core without the plugin: the reference kernels
        tiled = None
    else:
        # the weights laid out for either kernel at plan time: every call of that convolution
        # then runs it (by ``run``, or from the compiled plan directly)
        real, real_rows = tiled.Tiled.__init__, conv_rows.ConvRows.__init__

        def spy(self, w, plan, xshape):
            taken.append(tuple(xshape))
            real(self, w, plan, xshape)

        def spy_rows(self, w, plan, xshape):
            rows.append(tuple(xshape))
            real_rows(self, w, plan, xshape)
        monkeypatch.setattr(tiled.Tiled, "__init__", spy)
        monkeypatch.setattr(conv_rows.ConvRows, "__init__", spy_rows)
    _agrees_with_onnxruntime(model, (2, 3, 64, 64), seed=7)
    if tiled is not None and tiled.host_has_fma():
        assert inputs <= set(taken), sorted(set(taken))
        assert stem in (rows if conv_rows.host_has_avx512() else taken), (rows, taken)


@pytest.mark.torch
def test_squeezenet_with_pooling_lanes_agrees_with_onnxruntime(monkeypatch):
    """SqueezeNet at 2x3x64x64: its 3x3/2 ceil_mode MaxPools run on the numba plugin's vector
    kernels (one thread): where the CPU has AVX-512, those over the 31x31 and 15x15 planes on
    sixteen-lane rows (``pool_strided``) and the one over 7x7 planes with eight channels in
    vector lanes; with AVX2 and FMA only, the 15x15 and 7x7 ones in lanes. The whole network
    agrees with onnxruntime."""
    pooled, rows = [], []
    try:
        from onemodel.numba import pool, pool_lanes, pool_strided
    except ImportError:  # the core without the plugin: the reference kernels
        pool_lanes = None
    else:
        real = pool_lanes.geometry

        def geometry(shape, *args):
            found = real(shape, *args)
            if found is not None:
                pooled.append(tuple(shape))
            return found
        monkeypatch.setattr(pool_lanes, "geometry", geometry)
        real_call = pool._max_call

        def max_call(plan, kernel_shape, *args, **kwargs):
            kernel, tail = real_call(plan, kernel_shape, *args, **kwargs)
            if kernel is pool_strided.max_pool_kernel(*kernel_shape):
                rows.append(plan[0][:2])  # the input plane (h, w)
            return kernel, tail
        monkeypatch.setattr(pool, "_max_call", max_call)
    _agrees_with_onnxruntime("tv_squeezenet", (2, 3, 64, 64), seed=9)
    if pool_lanes is not None and pool_strided.host_has_avx512():
        assert {(31, 31), (15, 15)} <= set(rows), sorted(set(rows))
        assert (2, 256, 7, 7) in pooled, sorted(set(pooled))
    elif pool_lanes is not None and pool_lanes.host_has_fma():
        assert {(2, 128, 15, 15), (2, 256, 7, 7)} <= set(pooled), sorted(set(pooled))


@pytest.mark.torch
def test_efficientnet_with_silu_fused_and_channel_lanes_agrees_with_onnxruntime(monkeypatch):
    """EfficientNet-B0 at 2x3x64x64: each of its 49 SiLUs (a Sigmoid and a Mul reading the
    convolution's output) runs as the convolution's activation, and its 1x1 convolutions over
    2x2 planes with 0.5-1.6 MiB of weights on the numba plugin's channel lanes (when the CPU
    has AVX2 and FMA); the whole network agrees with onnxruntime."""
    session = Session.load(tvm.exported("tv_efficientnet_b0", "torchscript"), threads=1)
    fused = [n for n in session.graph.nodes if n.attrs.get("activation") == "Silu"]
    assert len(fused) == 49 and {n.op for n in fused} == {"FusedConv"}
    assert "Sigmoid" not in {n.op for n in session.graph.nodes}  # the SE gates: FusedConv too
    lanes = []
    try:
        from onemodel.numba import conv, pointwise
    except ImportError:  # the core without the plugin: the reference kernels
        pointwise = None
    else:
        real_site = conv._pointwise_site

        def pointwise_site(plan, xshape, *args):
            if pointwise.kernel(plan, xshape, 1) is pointwise.channel_lanes:
                lanes.append(tuple(xshape))
            return real_site(plan, xshape, *args)
        monkeypatch.setattr(conv, "_pointwise_site", pointwise_site)
    _agrees_with_onnxruntime("tv_efficientnet_b0", (2, 3, 64, 64), seed=7)
    if pointwise is not None and pointwise.host_has_fma():
        assert {(2, 192, 2, 2), (2, 1152, 2, 2), (2, 320, 2, 2)} <= set(lanes), sorted(set(lanes))


@pytest.mark.torch
def test_depthwise_lanes_and_pointwise_tiles_agree_with_onnxruntime(monkeypatch):
    """MNASNet at 2x3x64x64: the numba plugin runs its depthwise convolutions over 8x8 and
    smaller planes with eight channels in vector lanes, its 3x3 ones over 16x16 and 32x32
    planes on sixteen-lane rows where the CPU has AVX-512 (else the strided one in lanes too),
    and its small 1x1 convolutions on register tiles (when the CPU has AVX2 and FMA); the
    whole network agrees with onnxruntime."""
    planned, pointwise, rows = [], [], []
    try:
        from onemodel.numba import conv, depthwise_lanes, depthwise_rows
    except ImportError:  # the core without the plugin: the reference kernels
        depthwise_lanes = None
    else:
        real_kernel = depthwise_rows.kernel

        def rows_kernel(plan, xshape, *args):
            found = real_kernel(plan, xshape, *args)
            if found is not None:
                rows.append(tuple(xshape))
            return found
        monkeypatch.setattr(depthwise_rows, "kernel", rows_kernel)
        class Recorded(depthwise_lanes.Geometry):
            def __init__(self, plan, xshape):
                planned.append(tuple(xshape))
                super().__init__(plan, xshape)
        monkeypatch.setattr(depthwise_lanes, "Geometry", Recorded)
        real_site = conv._pointwise_site

        def pointwise_site(plan, xshape, *args):
            pointwise.append(tuple(xshape))
            return real_site(plan, xshape, *args)
        monkeypatch.setattr(conv, "_pointwise_site", pointwise_site)
    _agrees_with_onnxruntime("tv_mnasnet", (2, 3, 64, 64), seed=8)
    if depthwise_lanes is not None and depthwise_lanes.host_has_fma():
        # pixel lanes over 16x16 planes, channel lanes over 2x2 planes
        assert {(2, 16, 16, 16), (2, 96, 2, 2)} <= set(pointwise), sorted(set(pointwise))
    if depthwise_lanes is not None and depthwise_rows.host_has_avx512():
        # (2, 24, 32, 32): 3x3 at stride 2; (2, 48, 16, 16): 3x3 at stride 1
        assert {(2, 24, 32, 32), (2, 48, 16, 16)} <= set(rows), sorted(set(rows))
        assert (2, 240, 4, 4) in planned, sorted(set(planned))  # 5x5 over 4x4: the lanes
    elif depthwise_lanes is not None and depthwise_lanes.host_has_fma():
        # (2, 24, 32, 32): 3x3 at stride 2; (2, 240, 4, 4): 5x5 over 4x4
        assert {(2, 24, 32, 32), (2, 240, 4, 4)} <= set(planned), sorted(set(planned))


@pytest.mark.torch
def test_mobilenet_v3_small_head_on_panels_and_stem_on_rows_or_sixteen_channel_tiles(
        monkeypatch):
    """MobileNetV3-Small at 2x3x64x64 by a one-thread session: its classifier head (a Linear
    576 -> 1024 at batch 2, which PyTorch exports as Gemm with transB=1) goes by the numba
    plugin's packed panels over the weights' frozen transpose, and its 3-channel stem (16
    outputs) by convolution rows where the CPU has AVX-512, else by register tiles of sixteen
    channels (AVX2 and FMA); the whole network agrees with onnxruntime."""
    panels, stems = [], []
    try:
        from onemodel.numba import conv_rows, gemm, tiled
    except ImportError:  # the core without the plugin: the reference kernels
        tiled = None
    else:
        real_panels, real_tiles = gemm._panel_product, tiled.Tiled.__init__
        real_rows = conv_rows.ConvRows.__init__

        def panel_product(b, *args, **kwargs):
            panels.append(b.shape)
            return real_panels(b, *args, **kwargs)

        def tiles(self, w, plan, xshape):  # (laid out for the kernel: every call runs it)
            real_tiles(self, w, plan, xshape)
            if self.kernel is tiled._tiles16:
                stems.append(("tiles", tuple(xshape)))

        def rows(self, w, plan, xshape):
            stems.append(("rows", tuple(xshape)))
            real_rows(self, w, plan, xshape)
        monkeypatch.setattr(gemm, "_panel_product", panel_product)
        monkeypatch.setattr(tiled.Tiled, "__init__", tiles)
        monkeypatch.setattr(conv_rows.ConvRows, "__init__", rows)
    _agrees_with_onnxruntime("tv_mobilenet_v3_small", (2, 3, 64, 64), seed=10)
    if tiled is not None and tiled.host_has_fma():
        assert (576, 1024) in panels, panels
        kind = "rows" if conv_rows.host_has_avx512() else "tiles"
        assert (kind, (2, 3, 64, 64)) in stems, stems


@pytest.mark.torch
@pytest.mark.parametrize(("model", "adds", "activation", "seed"),
                         [("tv_mnasnet", 10, "", 11), ("tv_resnet18", 8, "Relu", 12)])
def test_residual_adds_fused_into_their_convolutions_agree_with_onnxruntime(
        monkeypatch, model, adds, activation, seed):
    """With the numba plugin, each residual Add (and the Relu after it) runs in the
    convolution before it (FusedConv with Z): MNASNet's ten after 1x1 projections, which the
    1x1 lanes kernels add as they store their output over planes of 8x8 and less (when the
    CPU has AVX2 and FMA);
    ResNet-18's eight Add+Relu after 3x3 convolutions. The whole network agrees with
    onnxruntime."""
    session = Session.load(tvm.exported(model, "torchscript"), threads=1)
    residual = [n for n in session.graph.nodes if n.op == "FusedConv" and len(n.inputs) > 3]
    lanes = []
    try:
        from onemodel.numba import conv, pointwise
    except ImportError:  # the core without the plugin (nor its pass): the Adds stay
        pointwise = None
        assert residual == []
    else:
        assert len(residual) == adds, [n.name for n in residual]
        assert {n.attrs["activation"] for n in residual} == {activation}
        real_site = conv._pointwise_residual_site

        def recorded(kernel, args, wide, xshape, *rest):
            lanes.append(tuple(xshape))
            return real_site(kernel, args, wide, xshape, *rest)
        monkeypatch.setattr(conv, "_pointwise_residual_site", recorded)
    _agrees_with_onnxruntime(model, (2, 3, 64, 64), seed=seed)
    if pointwise is not None and pointwise.host_has_fma() and model == "tv_mnasnet":
        # pixel lanes over 8x8 and 4x4 planes, channel lanes over 2x2 (the rest: tiles)
        assert {(2, 72, 8, 8), (2, 240, 4, 4), (2, 576, 2, 2)} <= set(lanes), lanes
