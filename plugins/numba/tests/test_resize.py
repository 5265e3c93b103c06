"""The numba Resize against the reference kernel (itself tested against the ONNX backend
suite and PyTorch) over every mode, coordinate transformation, antialias and exclude_outside,
sizes and scales, up and down; the cases it hands to the reference (other axes, extrapolated
positions); its plan-time specialization; and a session against onnxruntime."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from onemodel.numba import resize
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.specialize import CallSite, specialize

TOL = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-11, atol=1e-11)}


def _sizes(*v):
    return np.array(v, np.int64)


def _scales(*v):
    return np.array(v, np.float32)


# (X shape, roi, scales, sizes, attrs)
CASES = [
    ((2, 3, 5, 7), None, None, _sizes(2, 3, 11, 13), dict(mode="linear")),
    ((1, 2, 8, 8), None, None, _sizes(1, 2, 64, 64), dict(mode="linear")),  # 8x: LR-ASPP
    ((1, 4, 9, 8), None, _scales(1, 1, 0.5, 1.75), None,
     dict(mode="linear", coordinate_transformation_mode="align_corners")),
    ((2, 2, 6, 5), None, _scales(1, 1, 2.5, 0.6), None,
     dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel")),
    ((1, 3, 7, 6), None, None, _sizes(1, 3, 12, 4),
     dict(mode="cubic", coordinate_transformation_mode="asymmetric", exclude_outside=1)),
    ((1, 2, 6, 9), None, None, _sizes(1, 2, 13, 5),
     dict(mode="cubic", cubic_coeff_a=-0.5, coordinate_transformation_mode="half_pixel_symmetric")),
    ((1, 2, 16, 16), None, None, _sizes(1, 2, 5, 7), dict(mode="linear", antialias=1)),
    ((1, 2, 17, 15), None, None, _sizes(1, 2, 6, 4), dict(mode="cubic", antialias=1)),
    ((2, 3, 5, 6), None, None, _sizes(2, 3, 10, 15),
     dict(mode="nearest", nearest_mode="round_prefer_ceil",
          coordinate_transformation_mode="pytorch_half_pixel")),
    ((1, 2, 12, 10), None, None, _sizes(1, 2, 5, 3),
     dict(mode="nearest", nearest_mode="floor", coordinate_transformation_mode="asymmetric")),
    ((1, 2, 6, 6), None, None, _sizes(1, 2, 13, 11), dict(mode="nearest", nearest_mode="ceil")),
    ((2, 3, 5, 7), None, None, _sizes(9), dict(mode="linear", axes=(3,))),  # W only
    ((2, 3, 5, 7), None, _scales(3.0), None, dict(mode="linear", axes=(-2,))),  # H only
    ((1, 2, 6, 8), None, None, _sizes(1, 2, 12, 12),
     dict(mode="linear", keep_aspect_ratio_policy="not_larger")),
    # handed to the reference: the channel axis changes; tf_crop_and_resize extrapolates
    ((1, 3, 4, 4), None, None, _sizes(1, 6, 8, 8), dict(mode="nearest")),
    ((1, 2, 5, 5), np.array([0, 0, -0.2, 0.1, 1, 1, 1.3, 0.9], np.float32), None,
     _sizes(1, 2, 7, 6), dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
                              extrapolation_value=-3.0)),
]
HANDED_ON = {len(CASES) - 2, len(CASES) - 1}


def _x(shape, dtype, contiguous=True, seed=0):
    x = (np.random.default_rng(seed).standard_normal(shape) * 2).astype(dtype)
    if contiguous:
        return x
    big = np.zeros(shape[:-1] + (2 * shape[-1],), dtype)
    big[..., ::2] = x
    return big[..., ::2]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "strided"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_resize_matches_the_reference(case, contiguous, dtype):
    shape, roi, scales, sizes, attrs = CASES[case]
    x = _x(shape, dtype, contiguous, seed=case)
    want = OPS["Resize"].kernel(x, roi, scales, sizes, **attrs)
    got = resize.resize(x, roi, scales, sizes, **attrs)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, **TOL[dtype])
    plan_args = {k: v for k, v in attrs.items() if k != "extrapolation_value"}
    taps = resize._taps(shape, resize._key(roi), resize._key(scales), resize._key(sizes),
                        resize._attr_key({**resize._DEFAULTS, **plan_args}), np.dtype(dtype))
    assert (taps is None) == (case in HANDED_ON)  # the numba kernel ran where it says it does


def test_special_values_pass_through():
    """Infinities and NaN reach the outputs whose taps read them, as in the reference's
    per-tap sums (a plane big enough that the reference gathers taps rather than multiplying
    by a dense matrix, which would spread a NaN along its whole row)."""
    x = np.arange(70 * 70, dtype=np.float32).reshape(1, 1, 70, 70)
    x[0, 0, 11, 12] = np.nan
    x[0, 0, 40, 3] = np.inf
    for mode in ("nearest", "linear"):
        with np.errstate(invalid="ignore"):
            got = resize.resize(x, None, None, _sizes(1, 1, 140, 150), mode=mode)
            want = OPS["Resize"].kernel(x, None, None, _sizes(1, 1, 140, 150), mode=mode)
        assert 0 < np.isnan(got).sum() < 100
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        np.testing.assert_allclose(got, want, rtol=1e-6)


def _site(x, sizes, attrs):
    generic = partial(resize.resize, **attrs)
    want = generic(x, None, None, sizes)
    return CallSite((x.shape, None, None, sizes.shape), (x.dtype, None, None, sizes.dtype),
                    (None, None, None, sizes), dict(attrs), (want.shape,), generic)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_specialized_call_equals_the_generic_one(dtype):
    x = _x((2, 3, 6, 5), dtype)
    sizes = _sizes(2, 3, 13, 9)
    attrs = dict(mode="linear", coordinate_transformation_mode="half_pixel")
    site = _site(x, sizes, attrs)
    call = specialize(resize.resize, site)
    assert call is not None
    want = site.generic(x, None, None, sizes)
    for args in ((x, None, None, sizes), (_x((2, 3, 6, 5), dtype, False), None, None,
                                          sizes.copy())):
        got = call(*args)
        assert got.tobytes() == want.tobytes()
    # other sizes, another input shape or dtype: the generic call, so the right answer
    other = _sizes(2, 3, 7, 7)
    np.testing.assert_array_equal(call(x, None, None, other), site.generic(x, None, None, other))
    assert call(x, None, None, other).shape == (2, 3, 7, 7)
    y = _x((1, 3, 6, 5), dtype)
    np.testing.assert_array_equal(call(y, None, None, _sizes(1, 3, 13, 9)),
                                  site.generic(y, None, None, _sizes(1, 3, 13, 9)))
    z = x.astype(np.float64 if dtype == np.float32 else np.float32)
    assert call(z, None, None, sizes).dtype == z.dtype


def test_sizes_fed_at_run_time_keep_the_generic_call():
    x = _x((1, 2, 4, 4), np.float32)
    site = _site(x, _sizes(1, 2, 8, 8), dict(mode="linear"))
    fed = CallSite(site.shapes, site.dtypes, (None, None, None, None), site.attrs,
                   site.out_shapes, site.generic)
    assert specialize(resize.resize, fed) is None


def test_a_session_matches_onnxruntime():
    """Upsampling by 2 then by 8 (bilinear, half_pixel: what torchvision's segmentation heads
    export), sizes computed from the input's shape, at two input sizes."""
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from onemodel.onnx.importer import from_model
    from onemodel.runtime import Session

    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "two"], ["nc"]),
        helper.make_node("Slice", ["shape", "two", "four"], ["hw"]),
        helper.make_node("Mul", ["hw", "k2"], ["hw2"]),
        helper.make_node("Concat", ["nc", "hw2"], ["s2"], axis=0),
        helper.make_node("Resize", ["x", "", "", "s2"], ["up2"], mode="linear"),
        helper.make_node("Relu", ["up2"], ["r"]),
        helper.make_node("Resize", ["r", "", "sc"], ["y"], mode="linear"),
    ]
    inits = [onnx.numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
             (("zero", [0]), ("two", [2]), ("four", [4]), ("k2", [2, 2]))]
    inits.append(onnx.numpy_helper.from_array(np.array([1, 1, 8, 8], np.float32), "sc"))
    graph = helper.make_graph(
        nodes, "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                    ["n", 3, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ours = Session(from_model(model))
    for shape in ((2, 3, 4, 5), (1, 3, 7, 3)):
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        want = theirs.run(None, {"x": x})[0]
        got = ours.run({"x": x}, return_numpy=True)["y"]
        assert got.shape == want.shape == (shape[0], 3, shape[2] * 16, shape[3] * 16)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
