"""Small 1x1 convolutions on register tiles (onemodel.numba.pointwise) against a float64
product and the reference kernel: planes of a multiple of eight pixels and of others, output
channels past the tiles of four (pixel lanes) and of 32 (channel lanes), pixel counts that
leave one or two pixels after the tiles of three, every activation, with and without bias,
NaN and infinite inputs; taken for float32 constant weights on one thread over the shapes
:func:`pointwise.fits` admits, and any other call goes to the generic kernel."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from conv_arrays import conv_arrays, file_constant

from onemodel.numba import _jit, conv, pointwise
from onemodel.numba._simd import host_has_fma
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.specialize import CallSite, specialize

pytestmark = [pytest.mark.skipif(not host_has_fma(), reason="this CPU has no AVX2/FMA: "
                                "the kernels are never chosen"),
              pytest.mark.usefixtures("serial")]  # the kernels run on one thread only

ACTIVATIONS = {0: "", 1: "Relu", 2: "Sigmoid", 3: "Tanh", 4: "HardSwish", 5: "Relu6",
               6: "Silu"}
TOL = 5e-6  # relative to the output's scale


def _expected(x, w, b, act):
    """The 1x1 convolution in float64, then the activation by the reference FusedConv's numpy
    rule (onemodel.tensors, not the plugin's) on the sums rounded to float32."""
    from onemodel.tensors.ops.fused import _activate

    n, c = x.shape[:2]
    m = w.shape[0]
    y = np.einsum("mc,ncp->nmp", w.reshape(m, c).astype(np.float64),
                  x.reshape(n, c, -1).astype(np.float64))
    if b is not None:
        y += b.astype(np.float64)[:, None]
    y = y.reshape((n, m) + x.shape[2:]).astype(np.float32)
    if not act:
        return y
    with np.errstate(over="ignore", invalid="ignore"):
        return _activate(y, ACTIVATIONS[act])


def _close(got, want, pre=None):
    """``got`` equals ``want`` where it is NaN or infinite and within TOL of the scale of the
    sums before the activation (``pre``, else ``want``) elsewhere."""
    of = want if pre is None else pre
    scale = max(float(np.max(np.abs(of[np.isfinite(of)]), initial=1.0)), 1.0)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)],
                                  want[~finite & ~np.isnan(want)])
    assert float(np.abs(got[finite] - want[finite]).max(initial=0.0)) <= TOL * scale


def _run(kernel, x, w, b, act, wide=False):
    y = np.full((x.shape[0], w.shape[0]) + x.shape[2:], np.nan, np.float32)
    if kernel is pointwise.pixel_lanes:
        bias = b if b is not None else np.empty(0, np.float32)
        kernel(x, np.ascontiguousarray(w).reshape(-1), bias, b is not None, act, y, wide)
    else:
        kernel(x, *pointwise.packed_weights(w, b), act, y, wide)
    return y


# (input, output channels): planes of 64, 16 and 8 pixels (tiles of three, two and one
# vectors; with two images), 1, 4, 5 and 9 pixels (gathered for pixel lanes), 1-3 pixels in
# all (channel lanes' remainders), output channels 1-3 past the fours, 8-24 past the 32s;
# for sixteen lanes, planes of 24, 32, 48 and 80 pixels (a vector of eight after the
# sixteens; two, three, then three and two vectors of sixteen)
SHAPES = [
    ((2, 8, 8, 8), 48), ((2, 48, 8, 8), 8), ((1, 5, 4, 4), 7), ((3, 16, 2, 4), 12),
    ((2, 7, 16, 16), 13), ((2, 40, 1, 1), 240), ((2, 240, 1, 1), 40), ((1, 33, 1, 1), 70),
    ((3, 9, 1, 1), 100), ((2, 24, 2, 2), 144), ((2, 144, 2, 2), 24), ((1, 12, 1, 5), 33),
    ((2, 48, 3, 3), 192), ((1, 3, 3, 3), 5), ((4, 20, 7, 7), 36), ((1, 1, 1, 1), 1),
    ((1, 9, 3, 8), 36), ((1, 6, 4, 8), 5), ((2, 10, 6, 8), 33), ((1, 4, 10, 8), 14),
]


@pytest.mark.parametrize("kernel", [pointwise.pixel_lanes, pointwise.channel_lanes],
                         ids=["pixel_lanes", "channel_lanes"])
@pytest.mark.parametrize("xs, m", SHAPES, ids=[f"{xs}->{m}" for xs, m in SHAPES])
@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
@pytest.mark.parametrize("wide", [False, True], ids=["eight", "sixteen"])
def test_kernels_match_a_float64_product(kernel, xs, m, act, wide):
    """On eight lanes and on sixteen (AVX-512's; right on any x86 CPU, where LLVM splits
    the vectors when the CPU's are narrower)."""
    x, w, b = conv_arrays(xs, (m, xs[1], 1, 1), np.float32, seed=m + act)
    _close(_run(kernel, x, w, b, act, wide), _expected(x, w, b, act), _expected(x, w, b, 0))
    if act in (0, 1):  # without a bias: the sums start at zero
        _close(_run(kernel, x, w, None, act, wide), _expected(x, w, None, act))


@pytest.mark.parametrize("kernel", [pointwise.pixel_lanes, pointwise.channel_lanes],
                         ids=["pixel_lanes", "channel_lanes"])
@pytest.mark.parametrize("xs, m", [((2, 16, 8, 8), 12), ((2, 30, 1, 1), 64), ((2, 9, 2, 2), 40)])
@pytest.mark.parametrize("wide", [False, True], ids=["eight", "sixteen"])
def test_nan_and_infinity_reach_the_outputs_they_touch(kernel, xs, m, wide):
    x, w, b = conv_arrays(xs, (m, xs[1], 1, 1), np.float32, seed=3)
    x[0, 1].flat[0] = np.nan
    x[-1, 2].flat[-1] = np.inf
    want = _expected(x, w, b, 0)
    _close(_run(kernel, x, w, b, 0, wide), want)
    assert np.isnan(want).any()


def _site(x, w, b, act):
    kernel = conv.fused_conv if act else conv.conv
    attrs = {"activation": act} if act else {}
    generic = partial(kernel, **attrs)
    inputs = (x, w) if b is None else (x, w, b)
    want = generic(*inputs)
    site = CallSite(tuple(a.shape for a in inputs), tuple(a.dtype for a in inputs),
                    (None, *inputs[1:]), attrs, (want.shape,), generic)
    return specialize(kernel, site), inputs, OPS["FusedConv" if act else "Conv"].kernel(
        *inputs, **attrs)


@pytest.mark.parametrize("xs, m, chosen", [
    ((2, 8, 8, 8), 48, pointwise.pixel_lanes), ((2, 96, 4, 4), 40, pointwise.pixel_lanes),
    ((2, 40, 1, 1), 240, pointwise.channel_lanes), ((2, 96, 2, 2), 16, pointwise.channel_lanes),
    ((2, 48, 3, 3), 192, pointwise.channel_lanes),
    ((2, 256, 8, 8), 64, pointwise.pixel_lanes),  # 64 KiB of input, 64 outputs: packed tiles
    ((1, 16, 32, 32), 32, pointwise.pixel_lanes),  # a 1024-pixel plane, packed tiles
    # past 512 K multiply-adds, where the register tiles (tiled.fits) would be taken too
    ((2, 576, 2, 2), 128, pointwise.channel_lanes), ((2, 512, 3, 3), 64, pointwise.channel_lanes),
])
@pytest.mark.parametrize("act", ["", "Relu6", "HardSwish"])
def test_planned_calls_take_the_tiles_and_agree_with_the_reference(xs, m, chosen, act):
    x, w, b = conv_arrays(xs, (m, xs[1], 1, 1), np.float32)
    w, b = file_constant(w), file_constant(b)
    plan = conv._plan(xs, w.shape, 4, None, None, None, None, "NOTSET", 1, True)
    assert pointwise.kernel(plan, xs, 1) is chosen
    call, inputs, ref = _site(x, w, b, act)
    assert call.__name__ == "pointwise_at"
    pre = OPS["Conv"].kernel(x, w, b)  # the sums' scale (a clipping activation hides it)
    out = np.empty_like(ref)
    for got in (call(*inputs), call(*inputs, out=out)):
        _close(got, ref, pre)
    # a strided input is copied; other weights, a bias given at run time or an out of another
    # layout go to the generic call
    wide = np.repeat(x, 2, axis=3)[..., ::2]
    _close(call(wide, w, b), ref, pre)
    other = w * 2
    _close(call(x, other, b), OPS["Conv"].kernel(x, other, b) if not act else
           OPS["FusedConv"].kernel(x, other, b, activation=act), pre * 2)
    strided_out = np.empty(ref.shape[:-1] + (2 * ref.shape[-1],), np.float32)[..., ::2]
    call(x, w, b, out=strided_out)
    _close(strided_out, ref, pre)


@pytest.mark.parametrize("xs, m", [
    ((2, 8, 8, 8), 6),      # output channels not a multiple of four over 8x8 planes
    ((2, 16, 32, 32), 16),  # 1024-pixel planes under 32 outputs
    ((2, 256, 8, 8), 32),  # an image's input past 48 KiB, under 64 outputs
    ((2, 8, 32, 32), 24),  # 1024-pixel planes under 32 outputs: rows 4 KiB apart
    ((2, 16, 15, 15), 64),  # 225 pixels, not a multiple of eight
    ((2, 512, 3, 3), 10),   # nine pixels, fewer than 32 outputs
])
def test_shapes_outside_the_rules_keep_the_plans_kernel(xs, m):
    plan = conv._plan(xs, (m, xs[1], 1, 1), 4, None, None, None, None, "NOTSET", 1, True)
    assert not pointwise.fits(plan, xs, (m, xs[1], 1, 1), 1)


def test_3x3_and_strided_convolutions_are_not_taken():
    for ws, strides, pads in [((8, 8, 3, 3), (1, 1), (1, 1, 1, 1)),
                              ((8, 8, 1, 1), (2, 2), (0, 0, 0, 0)),
                              ((8, 8, 1, 1), (1, 1), (1, 1, 1, 1))]:
        plan = conv._plan((2, 8, 8, 8), ws, 4, None, strides, pads, None, "NOTSET", 1, True)
        assert not pointwise.fits(plan, (2, 8, 8, 8), ws, 1)
    plan = conv._plan((2, 8, 8, 8), (8, 4, 1, 1), 4, None, None, None, None, "NOTSET", 2, True)
    assert not pointwise.fits(plan, (2, 8, 8, 8), (8, 4, 1, 1), 2)


def test_writable_weights_and_float64_keep_the_plans_kernel():
    x, w, b = conv_arrays((2, 8, 8, 8), (48, 8, 1, 1), np.float32)
    call, inputs, _ = _site(x, w, b, "")  # writable: an update in place must show
    assert call.__name__ != "pointwise_at"
    w *= 2
    _close(call(*inputs), OPS["Conv"].kernel(x, w, b))
    x64, w64, b64 = conv_arrays((2, 8, 8, 8), (48, 8, 1, 1), np.float64)
    call, _, _ = _site(x64, file_constant(w64), file_constant(b64), "")
    assert call.__name__ != "pointwise_at"


def test_more_than_one_thread_keeps_the_plans_kernel(monkeypatch):
    monkeypatch.setattr(_jit, "_parallel", True)
    x, w, b = conv_arrays((2, 8, 8, 8), (48, 8, 1, 1), np.float32)
    call, _, _ = _site(x, file_constant(w), file_constant(b), "")
    assert call.__name__ != "pointwise_at"
