"""FusedConv with a residual Z (a residual block's Conv, Add and activation as one node):
the 1x1 lanes kernels that add Z as they store their output, and every other path (3x3,
depthwise, 1-D, float64, the generic call) that adds it in one pass after the convolution,
against the reference FusedConv (the convolution, then + Z, then the activation) and a float64
product; calls outside the plan (Z of another shape, dtype or layout) take the generic call."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np
import pytest
from conv_arrays import conv_arrays, file_constant

from onemodel.numba import conv, pointwise
from onemodel.numba._simd import host_has_fma
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.specialize import CallSite, specialize

pytestmark = pytest.mark.usefixtures("serial")  # the lanes are planned on one thread only

TOL = 5e-6  # relative to the output's scale


def _reference(x, w, b, z, act, **attrs):
    return OPS["FusedConv"].kernel(x, w, b, z, activation=act, **attrs)


def _close(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    scale = float(np.abs(want[finite]).max(initial=1.0))
    assert float(np.abs(got[finite] - want[finite]).max(initial=0.0)) <= TOL * scale


def _planned(x, w, b, z, act, **attrs):
    """The plan's call of FusedConv(x, w, b, z) with the weights and bias as constants."""
    kernel_attrs = {"activation": act, **attrs}
    generic = partial(conv.fused_conv, **kernel_attrs)
    inputs = (x, w, b, z)
    want = generic(*inputs)
    site = CallSite(tuple(a.shape for a in inputs), tuple(a.dtype for a in inputs),
                    (None, w, b, None), kernel_attrs, (want.shape,), generic)
    return specialize(conv.fused_conv, site)


@pytest.mark.skipif(not host_has_fma(), reason="no AVX2/FMA: the lanes are never chosen")
@pytest.mark.parametrize("kernel", [pointwise.pixel_lanes, pointwise.channel_lanes],
                         ids=["pixel_lanes", "channel_lanes"])
@pytest.mark.parametrize("xs, m", [((2, 48, 8, 8), 8), ((1, 5, 4, 4), 7), ((2, 240, 1, 1), 40),
                                   ((2, 144, 2, 2), 24), ((1, 12, 1, 5), 33),
                                   ((2, 40, 6, 8), 36)])
@pytest.mark.parametrize("act", [0, 1, 5, 6])
@pytest.mark.parametrize("wide", [False, True], ids=["eight", "sixteen"])
def test_lanes_add_the_residual_before_the_activation(kernel, xs, m, act, wide):
    x, w, b = conv_arrays(xs, (m, xs[1], 1, 1), np.float32, seed=m + act)
    y_shape = (xs[0], m) + xs[2:]
    z = np.random.default_rng(act).standard_normal(y_shape).astype(np.float32) * 4
    z.flat[0] = np.nan
    z.flat[-1] = -np.inf
    y = np.full(y_shape, 7.0, np.float32)
    if kernel is pointwise.pixel_lanes:
        pointwise.RESIDUAL[kernel](x, np.ascontiguousarray(w).reshape(-1), b, True, act, z, y,
                                   wide)
    else:
        pointwise.RESIDUAL[kernel](x, *pointwise.packed_weights(w, b), act, z, y, wide)
    names = {0: "", 1: "Relu", 5: "Relu6", 6: "Silu"}
    with np.errstate(invalid="ignore", over="ignore"):
        want = _reference(x, w, b, z, names[act])
    _close(y, want)


@pytest.mark.skipif(not host_has_fma(), reason="no AVX2/FMA: the lanes are never chosen")
@pytest.mark.parametrize("xs, m", [((2, 8, 8, 8), 48), ((2, 96, 4, 4), 40), ((2, 40, 1, 1), 240),
                                   ((2, 96, 2, 2), 16)])
@pytest.mark.parametrize("act", ["", "Relu"])
def test_planned_1x1_residual_takes_the_lanes_and_falls_back_for_other_calls(xs, m, act):
    x, w, b = conv_arrays(xs, (m, xs[1], 1, 1), np.float32, seed=m)
    w, b = file_constant(w), file_constant(b)
    z = np.random.default_rng(1).standard_normal((xs[0], m) + xs[2:]).astype(np.float32)
    call = _planned(x, w, b, z, act)
    assert call.__name__ == "pointwise_residual_at"
    want = _reference(x, w, b, z, act)
    out = np.empty_like(want)
    assert call(x, w, b, z, out=out) is out
    _close(out, want)
    _close(call(x, w, b, z), want)
    # a strided Z, one of float64 or broadcast from one channel, other weights: generic call
    strided = np.repeat(z, 2, axis=3)[..., ::2]
    _close(call(x, w, b, strided), want)
    wide = z.astype(np.float64)  # numpy's promotion, as the Add it replaces
    got = call(x, w, b, wide)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, _reference(x, w, b, wide, act), rtol=1e-6, atol=1e-5)
    shift = z[:, :1]
    _close(call(x, w, b, shift), _reference(x, w, b, shift, act))
    _close(call(x, w * 2, b, z), _reference(x, w * 2, b, z, act))


@pytest.mark.parametrize("xs, ws, attrs", [
    ((2, 8, 9, 9), (8, 8, 3, 3), {"pads": (1, 1, 1, 1)}),                  # a 3x3 (ResNet)
    ((2, 16, 8, 8), (16, 1, 3, 3), {"pads": (1, 1, 1, 1), "group": 16}),   # depthwise
    ((2, 16, 16, 16), (24, 16, 1, 1), {}),                                 # a larger 1x1
    ((2, 6, 20), (6, 6, 3), {"pads": (1, 1)}),                             # 1-D
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", ["", "Relu", "HardSwish"])
def test_other_paths_add_the_residual_after_the_convolution(xs, ws, attrs, dtype, act):
    x, w, b = conv_arrays(xs, ws, dtype, seed=len(xs))
    w, b = file_constant(w), file_constant(b)
    want_conv = OPS["Conv"].kernel(x, w, b, **attrs)
    z = np.random.default_rng(2).standard_normal(want_conv.shape).astype(dtype)
    z.flat[3] = np.nan
    want = _reference(x, w, b, z, act, **attrs)
    call = _planned(x, w, b, z, act, **attrs)
    assert call is not None
    out = np.empty_like(want)
    for got in (call(x, w, b, z), call(x, w, b, z, out=out)):
        _close(got, want)
    # the eager kernel too: the same sum
    _close(conv.fused_conv(x, w, b, z, activation=act, **attrs), want)


def test_a_residual_of_another_shape_is_refused_naming_the_shapes():
    x, w, b = conv_arrays((1, 4, 5, 5), (4, 4, 3, 3), np.float32)
    z = np.zeros((1, 4, 3, 3), np.float32)
    with pytest.raises(Exception, match="broadcast|shape"):
        conv.fused_conv(x, w, b, z, activation="Relu", pads=(1, 1, 1, 1))
    site = CallSite((x.shape, w.shape, b.shape, z.shape), (x.dtype,) * 4, (None, w, b, None),
                    {"activation": "Relu"}, ((1, 4, 3, 3),), None)
    assert specialize(conv.fused_conv, replace(site, out_shapes=((1, 4, 5, 5),))) is None
