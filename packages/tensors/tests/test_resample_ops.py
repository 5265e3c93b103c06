"""Resampling ops (Resize and its gradient, GridSample, AffineGrid, CenterCropPad, Col2Im) and
``F.interpolate``: forward and backward against PyTorch, gradients against finite differences
and the adjoint identity, shape rules on symbolic dims."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.tensors import DType, OneModelError, Tensor
from onemodel.tensors import functional as F
from onemodel.tensors.dispatch import dispatch
from onemodel.tensors.errors import ShapeError
from onemodel.tensors.ops import OPS, TensorSpec
from onemodel.tensors.ops.base import UnknownValueError
from onemodel.tensors.symbolic import DimExpr

torch = pytest.importorskip("torch")
TF = torch.nn.functional

# (mode, spatial rank); shapes are small and odd
MODES = [("nearest", 1), ("nearest", 2), ("nearest", 3), ("nearest-exact", 2), ("linear", 1),
         ("bilinear", 2), ("bicubic", 2), ("trilinear", 3), ("area", 2)]
HOW = [dict(scale_factor=2), dict(scale_factor=0.5), dict(scale_factor=1.5),
       dict(size=(11, 3, 2)), dict(size=(1, 1, 1)),
       dict(scale_factor=1.7, recompute_scale_factor=True)]


def _cases():
    for mode, nd in MODES:
        corners = [None] if mode in ("nearest", "nearest-exact", "area") else [False, True]
        for ac in corners:
            for how in HOW:
                how = {k: (v[:nd] if k == "size" else v) for k, v in how.items()}
                yield pytest.param(mode, nd, ac, how, id=f"{mode}-{nd}d-ac{ac}-{how}")


@pytest.mark.parametrize(("mode", "nd", "align_corners", "how"), list(_cases()))
def test_interpolate_matches_torch_forward_and_backward(mode, nd, align_corners, how):
    rng = np.random.default_rng(nd)
    x = rng.standard_normal((2, 3, *(5, 7, 3)[:nd])).astype(np.float32)
    tx = torch.tensor(x, requires_grad=True)
    want = TF.interpolate(tx, mode=mode, align_corners=align_corners, **how)
    ox = Tensor.from_numpy(x).requires_grad_()
    got = F.interpolate(ox, mode=mode, align_corners=align_corners, **how)
    assert tuple(got.shape) == tuple(want.shape)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    g = rng.standard_normal(tuple(want.shape)).astype(np.float32)
    want.backward(torch.tensor(g))
    got.backward(Tensor.from_numpy(g))
    np.testing.assert_allclose(ox.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("how", [dict(size=(5, 7)), dict(size=(4, 17)), dict(size=(20, 30)),
                                 dict(scale_factor=0.4)], ids=str)
def test_interpolate_with_antialias_matches_torch(mode, how):
    align_corners = False
    with pytest.raises(OneModelError, match="align_corners=True is not supported"):
        F.interpolate(Tensor.randn(1, 1, 6, 6), mode=mode, antialias=True, align_corners=True,
                      **how)
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 2, 13, 17)).astype(np.float32)
    tx = torch.tensor(x, requires_grad=True)
    want = TF.interpolate(tx, mode=mode, align_corners=align_corners, antialias=True, **how)
    ox = Tensor.from_numpy(x).requires_grad_()
    got = F.interpolate(ox, mode=mode, align_corners=align_corners, antialias=True, **how)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    g = rng.standard_normal(tuple(want.shape)).astype(np.float32)
    want.backward(torch.tensor(g))
    got.backward(Tensor.from_numpy(g))
    np.testing.assert_allclose(ox.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_interpolate_per_axis_scale_factors_match_torch():
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 6)).astype(np.float32)
    for mode in ("nearest", "bilinear", "bicubic"):
        want = TF.interpolate(torch.tensor(x), scale_factor=(2, 0.5), mode=mode)
        got = F.interpolate(Tensor.from_numpy(x), scale_factor=(2, 0.5), mode=mode)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_interpolate_refuses_what_torch_refuses():
    x = Tensor.randn(1, 2, 4, 4)
    with pytest.raises(OneModelError, match="exactly one of size and scale_factor"):
        F.interpolate(x)
    with pytest.raises(OneModelError, match="align_corners"):
        F.interpolate(x, scale_factor=2, align_corners=True)
    with pytest.raises(OneModelError, match="needs 3 spatial axes"):
        F.interpolate(x, scale_factor=2, mode="trilinear")
    with pytest.raises(OneModelError, match="mode 'cubic' is not one of"):
        F.interpolate(x, scale_factor=2, mode="cubic")
    with pytest.raises(OneModelError, match="size has 3 values for 2"):
        F.interpolate(x, size=(2, 3, 4))


# Resize's gradient: finite differences and the adjoint identity, in float64 --------------------

def _resize(x, scales=None, sizes=None, roi=None, **attrs):
    s = None if scales is None else Tensor.from_numpy(np.asarray(scales, np.float32))
    z = None if sizes is None else Tensor.from_numpy(np.asarray(sizes, np.int64))
    r = None if roi is None else Tensor.from_numpy(np.asarray(roi, np.float32))
    return dispatch("Resize", (x, r, s, z), attrs)


GRAD_CASES = [
    dict(scales=[1, 1, 2, 3], mode="nearest"),
    dict(scales=[1, 1, 0.6, 0.8], mode="nearest", nearest_mode="ceil"),
    dict(sizes=[2, 3, 7, 4], mode="linear"),
    dict(scales=[1, 1, 1.7, 0.6], mode="linear", coordinate_transformation_mode="align_corners"),
    dict(scales=[1, 1, 2.3, 0.7], mode="linear",
         coordinate_transformation_mode="half_pixel_symmetric"),
    dict(sizes=[2, 3, 9, 2], mode="cubic", exclude_outside=1, cubic_coeff_a=-0.5),
    dict(scales=[1, 1, 0.5, 0.6], mode="cubic", antialias=1),
    dict(scales=[1, 1, 0.6, 0.5], mode="linear", antialias=1),
    dict(sizes=[2, 3, 4, 4], roi=[0, 0, 0.2, -0.3, 1, 1, 0.9, 1.4], mode="linear",
         coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=2.5),
    dict(sizes=[6, 3], axes=[3, 2], mode="cubic", coordinate_transformation_mode="asymmetric"),
    dict(sizes=[8, 8], axes=[2, 3], mode="nearest", keep_aspect_ratio_policy="not_larger"),
]


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_resize_gradient_is_the_adjoint_and_matches_finite_differences(case):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 5, 4))
    xt = Tensor.from_numpy(x).requires_grad_()
    y = _resize(xt, **case)
    g = rng.standard_normal(tuple(y.shape))
    y.backward(Tensor.from_numpy(g))
    gx = xt.grad.numpy()
    # finite differences (Resize is affine in X: central differences are exact up to rounding)
    v = rng.standard_normal(x.shape)
    eps = 1e-3
    plus = _resize(Tensor.from_numpy(x + eps * v), **case).numpy()
    minus = _resize(Tensor.from_numpy(x - eps * v), **case).numpy()
    fd = np.sum((plus - minus) * g) / (2 * eps)
    assert np.sum(gx * v) == pytest.approx(fd, rel=1e-9, abs=1e-9)
    # the adjoint identity <R x, g> = <x, R^T g> (where nothing is extrapolated)
    if "extrapolation_value" not in case:
        assert np.sum(y.numpy() * g) == pytest.approx(np.sum(x * gx), rel=1e-10)


@pytest.mark.parametrize("case", [
    dict(shape=(1, 2, 70, 3), sizes=[1, 2, 140, 3], mode="linear"),
    dict(shape=(1, 1, 150, 2), scales=[1, 1, 0.27, 1], mode="cubic", antialias=1),
    dict(shape=(1, 1, 100, 3), sizes=[1, 1, 80, 3], mode="linear",
         roi=[0, 0, 0.5, 0, 1, 1, 0.52, 1], coordinate_transformation_mode="tf_crop_and_resize"),
], ids=["upsample", "antialias", "crop"])
def test_resize_of_long_axes_gathers_taps_and_its_gradient_stays_the_adjoint(case):
    # axes too long for a dense weight matrix: the forward gathers taps, the gradient gathers
    # transposed taps or (for the crop, where a few inputs feed every output) scatters
    case = dict(case)
    shape = case.pop("shape")
    rng = np.random.default_rng(11)
    x = rng.standard_normal(shape)
    xt = Tensor.from_numpy(x).requires_grad_()
    y = _resize(xt, **case)
    ins = [x.astype(np.float32), np.asarray(case.get("roi", []), np.float32),
           np.asarray(case.get("scales", []), np.float32)]
    if "sizes" in case:
        ins.append(np.asarray(case["sizes"], np.int64))
    attrs = {k: v for k, v in case.items() if k not in ("roi", "scales", "sizes")}
    np.testing.assert_allclose(y.numpy(), _onnx_reference("Resize", ins, **attrs), rtol=1e-4,
                               atol=1e-5)
    g = rng.standard_normal(tuple(y.shape))
    y.backward(Tensor.from_numpy(g))
    assert np.sum(y.numpy() * g) == pytest.approx(np.sum(x * xt.grad.numpy()), rel=1e-10)


def test_resize_of_integers_rounds_and_nearest_is_exact():
    x = np.arange(12, dtype=np.uint8).reshape(1, 1, 3, 4) * 20
    y = _resize(Tensor.from_numpy(x), scales=[1, 1, 2, 2], mode="nearest").numpy()
    np.testing.assert_array_equal(y, x.repeat(2, axis=2).repeat(2, axis=3))
    lin = _resize(Tensor.from_numpy(x), scales=[1, 1, 1, 0.5], mode="linear").numpy()
    assert lin.dtype == np.uint8
    np.testing.assert_array_equal(lin, np.rint(x.reshape(3, 2, 2).mean(-1)).reshape(1, 1, 3, 2)
                                  .astype(np.uint8))


# shape rules ----------------------------------------------------------------------------------

def _spec(shape, dtype=DType.F32, value=None):
    return TensorSpec(tuple(shape), dtype, value)


def test_resize_shape_rule_on_symbolic_dims():
    h, w = DimExpr.symbol("h"), DimExpr.symbol("w")
    x = _spec((2, 3, h, w))
    (out,) = OPS["Resize"].infer([x, None, _spec((4,), value=(1, 1, 2, 3))])
    assert out.shape == (2, 3, h * 2, w * 3)
    # a fractional scale: floor(h * 0.5) exactly
    (out,) = OPS["Resize"].infer([x, None, _spec((2,), value=(0.5, 0.25))], {"axes": (2, 3)})
    assert out.shape[2] == h // 2 and out.shape[3] == w // 4
    # sizes known as symbolic values (computed from Shape)
    (out,) = OPS["Resize"].infer([x, None, None, _spec((2,), DType.I64, (h * 2, 5))],
                                 {"axes": (2, 3)})
    assert out.shape == (2, 3, h * 2, 5)
    with pytest.raises(UnknownValueError, match="keep_aspect_ratio_policy"):
        OPS["Resize"].infer([x, None, None, _spec((2,), DType.I64, (4, 5))],
                            {"axes": (2, 3), "keep_aspect_ratio_policy": "not_larger"})
    with pytest.raises(UnknownValueError, match="scales must be known"):
        OPS["Resize"].infer([x, None, _spec((4,))])


def test_resize_shape_rule_refusals_name_the_problem():
    x = _spec((1, 1, 4, 4))
    scales = _spec((4,), value=(1, 1, 2, 2))
    sizes = _spec((4,), DType.I64, (1, 1, 8, 8))
    with pytest.raises(ShapeError, match="exactly one of scales and sizes"):
        OPS["Resize"].infer([x, None, scales, sizes])
    with pytest.raises(ShapeError, match="antialias=1 needs mode linear or cubic"):
        OPS["Resize"].infer([x, None, scales], {"antialias": 1})
    with pytest.raises(ShapeError, match="coordinate_transformation_mode 'tf_half"):
        OPS["Resize"].infer([x, None, scales],
                            {"coordinate_transformation_mode": "tf_half_pixel_for_nn"})
    with pytest.raises(ShapeError, match="tf_crop_and_resize needs roi"):
        OPS["Resize"].infer([x, None, scales],
                            {"coordinate_transformation_mode": "tf_crop_and_resize"})
    with pytest.raises(ShapeError, match="scales has 2 values for 4 axes"):
        OPS["Resize"].infer([x, None, _spec((2,), value=(2, 2))])


# GridSample, AffineGrid, CenterCropPad, Col2Im ------------------------------------------------

def _onnx_reference(op, inputs, **attrs):
    onnx = pytest.importorskip("onnx")
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = [f"i{k}" for k in range(len(inputs))]
    graph = helper.make_graph(
        [helper.make_node(op, names, ["y"], **attrs)], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in zip(names, inputs)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    return ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))[0]


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_matches_torch_forward_and_backward(mode, padding, align_corners):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 5, 6))
    grid = rng.uniform(-1.6, 1.6, (2, 4, 7, 2))
    ox, og = Tensor.from_numpy(x).requires_grad_(), Tensor.from_numpy(grid).requires_grad_()
    got = F.grid_sample(ox, og, mode=mode, padding_mode=padding, align_corners=align_corners)
    g = rng.standard_normal(tuple(got.shape))
    got.backward(Tensor.from_numpy(g))
    if mode == "bicubic" and padding == "border":
        # ONNX clamps the sampling point into the image before taking the 4 x 4 taps, PyTorch
        # clamps each tap: ONNX's reference evaluator and finite differences are the oracles
        want = _onnx_reference("GridSample", [x.astype(np.float32), grid.astype(np.float32)],
                               mode="cubic", padding_mode=padding,
                               align_corners=int(align_corners))
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
        eps = 1e-6
        for arr, grad in ((x, ox.grad.numpy()), (grid, og.grad.numpy())):
            v = rng.standard_normal(arr.shape)
            args = [(x + eps * v, grid), (x - eps * v, grid)] if arr is x else \
                [(x, grid + eps * v), (x, grid - eps * v)]
            plus, minus = (F.grid_sample(Tensor.from_numpy(a), Tensor.from_numpy(b), mode=mode,
                                         padding_mode=padding,
                                         align_corners=align_corners).numpy() for a, b in args)
            fd = np.sum((plus - minus) * g) / (2 * eps)
            assert np.sum(grad * v) == pytest.approx(fd, rel=1e-5, abs=1e-6)
        return
    tx, tg = torch.tensor(x, requires_grad=True), torch.tensor(grid, requires_grad=True)
    want = TF.grid_sample(tx, tg, mode=mode, padding_mode=padding, align_corners=align_corners)
    want.backward(torch.tensor(g))
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(ox.grad.numpy(), tx.grad.numpy(), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(og.grad.numpy(), tg.grad.numpy(), rtol=1e-7, atol=1e-9)


def test_grid_sample_3d_matches_torch():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
    grid = rng.uniform(-1.2, 1.2, (1, 2, 3, 4, 3)).astype(np.float32)
    for mode, padding in (("bilinear", "zeros"), ("nearest", "border"), ("bilinear", "reflection")):
        want = TF.grid_sample(torch.tensor(x), torch.tensor(grid), mode=mode,
                              padding_mode=padding, align_corners=False).numpy()
        got = dispatch("GridSample", (Tensor.from_numpy(x), Tensor.from_numpy(grid)),
                       {"mode": "linear" if mode == "bilinear" else mode,
                        "padding_mode": padding}).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("size", [(2, 3, 4, 5), (2, 1, 3, 4, 2)])
def test_affine_grid_matches_torch_forward_and_backward(size, align_corners):
    nd = len(size) - 2
    rng = np.random.default_rng(7)
    theta = rng.standard_normal((2, nd, nd + 1)).astype(np.float32)
    tt = torch.tensor(theta, requires_grad=True)
    want = TF.affine_grid(tt, list(size), align_corners=align_corners)
    ot = Tensor.from_numpy(theta).requires_grad_()
    got = dispatch("AffineGrid", (ot, Tensor.from_numpy(np.asarray(size, np.int64))),
                   {"align_corners": int(align_corners)})
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    g = rng.standard_normal(tuple(want.shape)).astype(np.float32)
    want.backward(torch.tensor(g))
    got.backward(Tensor.from_numpy(g))
    np.testing.assert_allclose(ot.grad.numpy(), tt.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_center_crop_pad_and_its_gradient():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 5, 4))
    xt = Tensor.from_numpy(x).requires_grad_()
    y = dispatch("CenterCropPad", (xt, Tensor.from_numpy(np.array([2, 7], np.int64))),
                 {"axes": (1, 2)})
    assert tuple(y.shape) == (3, 2, 7)
    np.testing.assert_array_equal(y.numpy()[:, :, 1:5], x[:, 1:3, :])  # crop 5 -> 2 from 1
    assert not y.numpy()[:, :, [0, 5, 6]].any()  # pad 4 -> 7: one before, two after
    g = rng.standard_normal((3, 2, 7))
    y.backward(Tensor.from_numpy(g))
    assert np.sum(y.numpy() * g) == pytest.approx(np.sum(x * xt.grad.numpy()))
    (out,) = OPS["CenterCropPad"].infer([_spec((DimExpr.symbol("b"), 5, 4)),
                                         _spec((2,), DType.I64, (2, 7))], {"axes": (1, 2)})
    assert out.shape == (DimExpr.symbol("b"), 2, 7)


@pytest.mark.parametrize(("image", "block", "kw"), [
    ((5, 6), (2, 3), {}),
    ((6, 7), (3, 2), dict(dilations=(2, 1), pads=(1, 0, 2, 1), strides=(2, 3))),
])
def test_col2im_matches_torch_fold(image, block, kw):
    d, p, s = kw.get("dilations", (1, 1)), kw.get("pads", (0, 0, 0, 0)), kw.get("strides", (1, 1))
    if p[:2] != p[2:]:  # torch's fold pads symmetrically: compare on the symmetric part
        p = p[:2] + p[:2]
        kw = {**kw, "pads": p}
    blocks = [(image[i] + 2 * p[i] - d[i] * (block[i] - 1) - 1) // s[i] + 1 for i in range(2)]
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3 * block[0] * block[1], blocks[0] * blocks[1])).astype(np.float32)
    want = TF.fold(torch.tensor(x), image, block, dilation=d, padding=p[:2], stride=s).numpy()
    got = dispatch("Col2Im", (Tensor.from_numpy(x), Tensor.from_numpy(np.asarray(image)),
                              Tensor.from_numpy(np.asarray(block))), kw).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError, match="blocks"):
        OPS["Col2Im"].infer([_spec((2, x.shape[1], x.shape[2] + 1)),
                             _spec((2,), DType.I64, image), _spec((2,), DType.I64, block)], kw)
