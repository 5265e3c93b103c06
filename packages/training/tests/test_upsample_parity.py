"""A small U-Net (conv, pool, Upsample, concatenated skip) trained here and in PyTorch from the
same weights agrees step for step; traced with symbolic batch and spatial axes it runs in the
Session and, exported to ONNX, in onnxruntime at other sizes; ONNX files PyTorch writes with
F.interpolate (and legacy Upsample/Resize-10 nodes) import and agree with onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel import training as T
from onemodel.tensors import Tensor, concat
from onemodel.tensors import functional as F
from onemodel.training import losses

torch = pytest.importorskip("torch")
nn = torch.nn
TF = torch.nn.functional


class UNet(T.Module):
    def __init__(self, mode: str, align_corners: bool | None):
        super().__init__()
        self.enc1 = T.Conv2d(2, 4, 3, padding=1)
        self.pool = T.MaxPool2d(2)
        self.enc2 = T.Conv2d(4, 8, 3, padding=1)
        self.up = T.Upsample(scale_factor=2, mode=mode, align_corners=align_corners)
        self.dec = T.Conv2d(12, 4, 3, padding=1)
        self.head = T.Conv2d(4, 1, 1)

    def forward(self, x):
        s1 = self.enc1(x).relu()
        u = self.up(self.enc2(self.pool(s1)).relu())
        return self.head(self.dec(concat([u, s1], axis=1)).relu())


class TorchUNet(nn.Module):
    def __init__(self, mode: str, align_corners: bool | None):
        super().__init__()
        self.enc1 = nn.Conv2d(2, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.enc2 = nn.Conv2d(4, 8, 3, padding=1)
        self.up = nn.Upsample(scale_factor=2, mode=mode, align_corners=align_corners)
        self.dec = nn.Conv2d(12, 4, 3, padding=1)
        self.head = nn.Conv2d(4, 1, 1)

    def forward(self, x):
        s1 = self.enc1(x).relu()
        u = self.up(self.enc2(self.pool(s1)).relu())
        return self.head(self.dec(torch.cat([u, s1], dim=1)).relu())


UPSAMPLING = [("nearest", None), ("bilinear", False), ("bilinear", True), ("bicubic", False)]


def _pair(mode, align_corners, seed=0):
    torch.manual_seed(seed)
    theirs = TorchUNet(mode, align_corners)
    ours = UNet(mode, align_corners)
    ours.load_state_dict({k: v.detach().numpy().copy() for k, v in theirs.state_dict().items()})
    return ours, theirs


def _batch(step):
    r = np.random.default_rng(100 + step)
    x = r.standard_normal((3, 2, 6, 10)).astype(np.float32)
    target = (x[:, :1] * x[:, 1:] + 0.5 * np.roll(x[:, :1], 1, axis=3)).astype(np.float32)
    return x, target


@pytest.fixture
def one_torch_thread():
    """Tiny tensors: torch's thread pool only adds contention (and time) here."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize(("mode", "align_corners", "optimizer"), [
    (mode, ac, opt) for (mode, ac), opt in zip(UPSAMPLING, ["sgd", "adam", "sgd", "adam"])])
def test_unet_with_upsample_trains_like_torch(mode, align_corners, optimizer):
    ours, theirs = _pair(mode, align_corners)
    if optimizer == "adam":
        o_opt, t_opt = T.Adam(ours.parameters(), 1e-2), torch.optim.Adam(theirs.parameters(), 1e-2)
    else:
        o_opt = T.SGD(ours.parameters(), 0.02, momentum=0.9)
        t_opt = torch.optim.SGD(theirs.parameters(), 0.02, momentum=0.9)
    o_losses, t_losses = [], []
    for _ in range(5):
        x, target = _batch(0)
        with T.ActivationScope():
            o_opt.zero_grad()
            lo = losses.mse(ours(Tensor.from_numpy(x)), Tensor.from_numpy(target))
            lo.backward()
            o_opt.step()
            o_losses.append(lo.item())
        t_opt.zero_grad()
        lt = TF.mse_loss(theirs(torch.from_numpy(x)), torch.from_numpy(target))
        lt.backward()
        t_opt.step()
        t_losses.append(lt.item())
    np.testing.assert_allclose(o_losses, t_losses, rtol=1e-4)
    theirs_sd = theirs.state_dict()
    for name, value in ours.state_dict().items():
        np.testing.assert_allclose(value.numpy(), theirs_sd[name].detach().numpy(), rtol=1e-3,
                                   atol=1e-4, err_msg=name)
    assert o_losses[-1] < o_losses[0]


# traced: symbolic batch, height and width --------------------------------------------------------

def _ort(path, feeds):
    ort = pytest.importorskip("onnxruntime")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(None,
                                                                                          feeds)


@pytest.mark.parametrize(("mode", "align_corners"), [("nearest", None), ("bilinear", True),
                                                     ("bicubic", False)])
def test_traced_unet_runs_at_other_sizes_in_the_session_and_onnxruntime(mode, align_corners,
                                                                      tmp_path):
    pytest.importorskip("onemodel.onnx")
    ours, _ = _pair(mode, align_corners, seed=3)
    ours.eval()
    traced = ours.trace(Tensor.randn(3, 2, 6, 10), "batch", None, "h", "w")
    out_shape = traced.graph.outputs[0].shape
    assert all(not isinstance(d, int) for d in (out_shape[0], out_shape[2], out_shape[3]))
    session = traced.session()
    path = tmp_path / "unet.onnx"
    traced.save_onnx(path)
    rng = np.random.default_rng(4)
    for shape in ((2, 2, 8, 4), (5, 2, 4, 12)):
        x = rng.standard_normal(shape).astype(np.float32)
        want = ours(Tensor.from_numpy(x)).numpy()
        assert want.shape == (shape[0], 1, shape[2], shape[3])
        got = session.run({"input": x})["output"].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str(shape))
        (onnx_out,) = _ort(path, {"input": x})
        np.testing.assert_allclose(onnx_out, want, rtol=1e-4, atol=1e-5, err_msg=str(shape))


def test_interpolate_to_a_size_computed_from_symbolic_axes_stays_symbolic():
    from onemodel.tracing import Tracer

    def f(x):
        return F.interpolate(x, size=(x.shape[2] * 2 + 1, x.shape[3]), mode="bicubic",
                             align_corners=True)

    traced = Tracer(f).trace({"x": Tensor.randn(2, 3, 5, 7)},
                             axes={"x": ("batch", None, "h", "w")})
    assert str(traced.graph.outputs[0]).endswith("F32[batch, 3, (2 * h) + 1, w]")
    rng = np.random.default_rng(9)
    for shape in ((1, 3, 4, 9), (3, 3, 6, 2)):
        x = rng.standard_normal(shape).astype(np.float32)
        want = TF.interpolate(torch.from_numpy(x), size=(shape[2] * 2 + 1, shape[3]),
                              mode="bicubic", align_corners=True).numpy()
        np.testing.assert_allclose(traced.session().run({"x": x})["output"].numpy(), want,
                                   rtol=1e-5, atol=1e-5)


def test_tracing_a_non_integral_scale_factor_is_refused_with_the_way_out():
    from onemodel.tracing import TraceError

    model = T.Upsample(scale_factor=1.5, mode="bilinear")
    with pytest.raises(TraceError, match="size="):  # 5 * 1.5 -> 7: not the ratio 1.5
        model.trace(Tensor.randn(2, 3, 5, 6), "batch", None, None, None)
    # where the sizes give the factor exactly, they say the same thing: traceable
    traced = model.trace(Tensor.randn(2, 3, 4, 6), "batch", None, None, None)
    x = np.random.default_rng(0).standard_normal((3, 3, 4, 6)).astype(np.float32)
    np.testing.assert_allclose(traced.session().run({"input": x})["output"].numpy(),
                               TF.interpolate(torch.from_numpy(x), scale_factor=1.5,
                                              mode="bilinear").numpy(), rtol=1e-5, atol=1e-6)
    # recompute_scale_factor=True samples at the ratio of sizes: traceable
    model = T.Upsample(scale_factor=1.5, mode="bilinear", recompute_scale_factor=True)
    traced = model.trace(Tensor.randn(2, 3, 5, 6), "batch", None, None, None)
    x = np.random.default_rng(0).standard_normal((3, 3, 5, 6)).astype(np.float32)
    np.testing.assert_allclose(traced.session().run({"input": x})["output"].numpy(),
                               TF.interpolate(torch.from_numpy(x), scale_factor=1.5,
                                              mode="bilinear",
                                              recompute_scale_factor=True).numpy(),
                               rtol=1e-5, atol=1e-6)


# ONNX files written by PyTorch, and legacy forms ----------------------------------------------

class Interpolations(nn.Module):
    def forward(self, x):
        a = TF.interpolate(x, scale_factor=2, mode="nearest")
        b = TF.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        c = TF.interpolate(x, size=(x.shape[2] * 2, x.shape[3] * 2), mode="bicubic",
                           align_corners=True)
        return a + b * c


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the TorchScript exporter's notice
@pytest.mark.parametrize("opset", [11, 17])
def test_torch_exported_interpolate_imports_and_agrees_with_onnxruntime(opset, tmp_path):
    pytest.importorskip("onemodel.onnx")
    from onemodel.runtime import Session

    path = tmp_path / "interp.onnx"
    torch.onnx.export(Interpolations().eval(), (torch.randn(2, 3, 5, 6),), str(path),
                      dynamo=False, input_names=["x"], output_names=["y"], opset_version=opset,
                      dynamic_axes={"x": {0: "batch", 2: "h", 3: "w"}})
    session = Session.load(path)
    rng = np.random.default_rng(5)
    for shape in ((1, 3, 4, 7), (3, 3, 6, 5)):
        x = rng.standard_normal(shape).astype(np.float32)
        got = session.run({"x": x})["y"].numpy()
        (want,) = _ort(path, {"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(shape))
        np.testing.assert_allclose(got, Interpolations()(torch.from_numpy(x)).numpy(),
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("op", "opset", "attrs", "scales"), [
    ("Upsample", 7, dict(mode="nearest", scales=[1.0, 1.0, 2.0, 3.0]), None),
    ("Upsample", 7, dict(mode="linear", scales=[1.0, 1.0, 2.0, 2.0]), None),
    ("Upsample", 9, dict(mode="nearest"), [1, 1, 2, 3]),
    ("Upsample", 9, dict(mode="linear"), [1, 1, 2, 2]),
    ("Resize", 10, dict(mode="nearest"), [1, 1, 3, 2]),
    ("Resize", 10, dict(mode="linear"), [1, 1, 2, 1.5]),
    ("Resize", 11, dict(mode="nearest", coordinate_transformation_mode="tf_half_pixel_for_nn"),
     [1, 1, 2.5, 1.5]),
    ("Resize", 11, dict(mode="nearest", coordinate_transformation_mode="tf_half_pixel_for_nn",
                        nearest_mode="floor"), [1, 1, 0.75, 2]),
], ids=lambda v: str(v) if not isinstance(v, dict) else "-".join(map(str, v.values())))
def test_legacy_upsample_and_resize_forms_import_and_agree_with_onnxruntime(op, opset, attrs,
                                                                            scales, tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onemodel.onnx")
    from onnx import TensorProto, helper, numpy_helper

    from onemodel.runtime import Session

    inits = []
    if scales is None:
        inputs = ["x"]
    elif opset == 11:
        inputs = ["x", "roi", "scales"]
        inits = [numpy_helper.from_array(np.zeros(0, np.float32), "roi")]
    else:
        inputs = ["x", "scales"]
    if scales is not None:
        inits.append(numpy_helper.from_array(np.asarray(scales, np.float32), "scales"))
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["y"], **attrs)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    path = tmp_path / "legacy.onnx"
    onnx.save(model, str(path))
    x = np.random.default_rng(6).standard_normal((1, 2, 4, 5)).astype(np.float32)
    got = Session.load(path).run({"x": x})["y"].numpy()
    (want,) = _ort(path, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# a spatial transformer: AffineGrid and GridSample, trained and traced ----------------------------

IDENTITY = np.array([[1, 0, 0], [0, 1, 0]], np.float32)


class STN(T.Module):
    def __init__(self):
        super().__init__()
        self.loc = T.Linear(2 * 6 * 8, 6)

    def forward(self, x):
        theta = self.loc(x.flatten(1)).reshape(-1, 2, 3) * 0.1 + Tensor.from_numpy(IDENTITY)
        grid = F.affine_grid(theta, (x.shape[0], 2, 5, 7), align_corners=False)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


class TorchSTN(nn.Module):
    def __init__(self):
        super().__init__()
        self.loc = nn.Linear(2 * 6 * 8, 6)

    def forward(self, x):
        theta = self.loc(x.flatten(1)).reshape(-1, 2, 3) * 0.1 + torch.from_numpy(IDENTITY)
        grid = TF.affine_grid(theta, [x.shape[0], 2, 5, 7], align_corners=False)
        return TF.grid_sample(x, grid, mode="bilinear", padding_mode="border",
                              align_corners=False)


@pytest.mark.usefixtures("one_torch_thread")
def test_spatial_transformer_trains_like_torch_and_exports(tmp_path):
    pytest.importorskip("onemodel.onnx")
    torch.manual_seed(2)
    theirs, ours = TorchSTN(), STN()
    ours.load_state_dict({k: v.detach().numpy().copy() for k, v in theirs.state_dict().items()})
    o_opt, t_opt = T.SGD(ours.parameters(), 0.5), torch.optim.SGD(theirs.parameters(), 0.5)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 2, 6, 8)).astype(np.float32)
    target = rng.standard_normal((4, 2, 5, 7)).astype(np.float32)
    for _ in range(4):
        o_opt.zero_grad()
        lo = losses.mse(ours(Tensor.from_numpy(x)), Tensor.from_numpy(target))
        lo.backward()
        o_opt.step()
        t_opt.zero_grad()
        lt = TF.mse_loss(theirs(torch.from_numpy(x)), torch.from_numpy(target))
        lt.backward()
        t_opt.step()
        assert lo.item() == pytest.approx(lt.item(), rel=1e-4)
    np.testing.assert_allclose(ours.loc.weight.numpy(), theirs.loc.weight.detach().numpy(),
                               rtol=1e-3, atol=1e-5)
    ours.eval()
    traced = ours.trace(Tensor.randn(5, 2, 6, 8), "batch", None, None, None)
    path = tmp_path / "stn.onnx"
    traced.save_onnx(path)
    for batch in (1, 4):
        xb = rng.standard_normal((batch, 2, 6, 8)).astype(np.float32)
        want = ours(Tensor.from_numpy(xb)).numpy()
        np.testing.assert_allclose(traced.session().run({"input": xb})["output"].numpy(), want,
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(_ort(path, {"input": xb})[0], want, rtol=1e-4, atol=1e-5)
