"""Depthwise convolutions with eight channels in vector lanes (onemodel.numba.depthwise_lanes)
against the reference kernel and PyTorch: strides, dilations, uneven pads, 3x3 to 7x7 windows,
planes narrower than eight columns and pixel counts that leave pixels after the tiles of eight,
every activation, with and without bias and ``out=``, infinite and NaN values where the
reference has them; taken only for float32 constant weights with a multiple of eight channels
on one thread, over the shapes :func:`depthwise_lanes.fits` admits. On AVX-512 CPUs some of
them go by ``depthwise_rows`` instead: here that choice is switched off to test the lanes on
every CPU, and test_depthwise_rows.py tests it."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from conv_arrays import assert_call_agrees, conv_arrays, file_constant

from onemodel.numba import conv, depthwise_lanes, depthwise_rows
from onemodel.numba._simd import host_has_fma
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.specialize import CallSite, specialize

pytestmark = pytest.mark.skipif(not host_has_fma(), reason="this CPU has no AVX2/FMA: "
                                "the lanes are never chosen")

ACTIVATIONS = ["", "Relu", "Sigmoid", "Tanh", "HardSwish", "Relu6", "Silu"]
TOL = 5e-6  # relative to the output's scale


PLANNED: list[tuple] = []  # the inputs whose planned calls were laid out for the lanes


@pytest.fixture(autouse=True)
def one_thread(monkeypatch, no_small_convolutions, serial):
    """Serial kernels (the lanes run on one thread only), small shapes admitted, the rows
    kernels off; the planned calls that take the lanes recorded."""
    monkeypatch.setattr(depthwise_rows, "kernel", lambda *args: None)

    class Recorded(depthwise_lanes.Geometry):
        def __init__(self, plan, xshape):
            PLANNED.append(tuple(xshape))
            super().__init__(plan, xshape)
    monkeypatch.setattr(depthwise_lanes, "Geometry", Recorded)
    PLANNED.clear()


def _planned(x, w, b, attrs, act, taken):
    kernel = conv.fused_conv if act else conv.conv
    attrs = {**attrs, "group": x.shape[1], **({"activation": act} if act else {})}
    generic = partial(kernel, **attrs)
    inputs = (x, w) if b is None else (x, w, b)
    want = generic(*inputs)
    site = CallSite(tuple(a.shape for a in inputs), tuple(a.dtype for a in inputs),
                    (None, w, *(() if b is None else (b,))), attrs, (want.shape,), generic)
    before = len(PLANNED)
    call = specialize(kernel, site)
    assert (len(PLANNED) > before) == taken
    ref = OPS["FusedConv" if act else "Conv"].kernel(*inputs, **attrs)
    return call, inputs, ref


CASES = [  # (X shape, attrs): depthwise, C a multiple of eight
    ((2, 24, 32, 32), dict(pads=(1, 1, 1, 1), strides=(2, 2))),  # MNASNet's: 256 pixels
    ((2, 16, 9, 7), dict(pads=(1, 1, 1, 1), strides=(2, 2))),  # 7 columns: 20 pixels
    ((1, 8, 6, 6), dict(pads=(2, 2, 2, 2), kernel=5)),  # 36 pixels: four after the tiles
    ((2, 16, 8, 8), dict(pads=(1, 1, 1, 1))),  # 3x3 over 8x8 at stride 1
    ((1, 32, 12, 10), dict(pads=(3, 0, 2, 1), strides=(2, 1), dilations=(1, 2), kernel=5)),
    ((1, 8, 13, 11), dict(pads=(3, 3, 3, 3), strides=(2, 2), kernel=7)),
    ((3, 8, 4, 4), dict(pads=(1, 1, 1, 1))),  # 4x4: two pixels' worth of tiles per image
]


@pytest.mark.parametrize("xs, attrs", CASES)
def test_lanes_match_the_reference(xs, attrs):
    attrs = dict(attrs)
    k = attrs.pop("kernel", 3)
    ws = (xs[1], 1, k, k)
    x, w, b = conv_arrays(xs, ws, np.float32, seed=5)
    w, b = file_constant(w), file_constant(b)
    plan = conv._plan(xs, ws, 4, None, conv._key(attrs.get("strides")),
                      conv._key(attrs.get("pads")), conv._key(attrs.get("dilations")), "NOTSET",
                      xs[1], True)
    assert depthwise_lanes.fits(plan, xs, np.float32, xs[1])
    for act, bias in zip(ACTIVATIONS, (b, None, b, None, b, None, b)):
        call, inputs, want = _planned(x, w, bias, attrs, act, True)
        scale = max(float(np.abs(want).max()), 1.0)
        assert_call_agrees(call, inputs, want, TOL, scale, act)


def test_lanes_match_pytorch():
    torch = pytest.importorskip("torch")
    xs, ws = (2, 40, 15, 13), (40, 1, 5, 5)
    x, w, b = conv_arrays(xs, ws, np.float32, seed=9)
    w, b = file_constant(w), file_constant(b)
    call, inputs, _ = _planned(x, w, b, dict(pads=(2, 1, 2, 1), strides=(2, 2)), "", True)
    got = call(*inputs)
    want = torch.nn.functional.conv2d(
        torch.from_numpy(x.astype(np.float64)), torch.from_numpy(w.astype(np.float64)),
        torch.from_numpy(b.astype(np.float64)), stride=2, padding=(2, 1), groups=40).numpy()
    assert float(np.abs(got - want).max()) <= TOL * float(np.abs(want).max())


def test_nan_and_inf_propagate_like_the_reference():
    """(Plans whose other kernel skips the padding send non-finite weights to the generic
    call before this choice: this plan's other kernel reads the padding.)"""
    xs, ws = (1, 16, 32, 32), (16, 1, 3, 3)
    x, w, b = conv_arrays(xs, ws, np.float32, seed=2)
    x[0, 3, 4, 4] = np.nan
    w[5, 0, 0, 0] = np.inf  # the border too: zero times infinity, as the reference has it
    w, b = file_constant(w), file_constant(b)
    for act in ("", "Relu"):
        call, inputs, want = _planned(x, w, b, dict(pads=(1, 1, 1, 1), strides=(2, 2)), act,
                                      True)
        got = call(*inputs)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        assert np.isnan(got).any()
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-4)


def test_taken_only_where_it_measured_faster():
    """At a stride, over at most 8x8 outputs, windows larger than 3x3 over at most 16x16;
    never for fewer than eight outputs, channels that are not a multiple of eight, float64,
    depth multipliers, or planes past MAX_PLANE_BYTES."""
    def fits(xs, k=3, s=1, group=None, m=None, dtype=np.float32):
        c = xs[1]
        ws = (m or c, 1, k, k)
        plan = conv._plan(xs, ws, 4, None, (s, s), (k // 2,) * 4, None, "NOTSET",
                          group or c, True)
        return depthwise_lanes.fits(plan, xs, dtype, group or c)
    assert fits((2, 24, 32, 32), s=2)
    assert fits((1, 96, 112, 112), s=2)
    assert fits((2, 96, 8, 8))
    assert fits((2, 72, 16, 16), k=5)
    assert not fits((2, 72, 32, 32), k=5)  # 5x5 over 32x32 at stride 1
    assert not fits((2, 32, 32, 32))  # 3x3 over 32x32 at stride 1
    assert not fits((2, 144, 16, 16))
    assert not fits((2, 1152, 2, 2))  # 4 outputs
    assert not fits((2, 20, 8, 8))  # 20 channels
    assert not fits((2, 16, 8, 8), dtype=np.float64)
    assert not fits((2, 16, 8, 8), m=32)  # two outputs per channel
    assert not fits((1, 8, 200, 200), s=2)  # 202 x 202 x 8 floats: 1.3 MB


def test_writable_weights_keep_the_other_kernels():
    """Weights that can change in place are not laid out once: an update after planning is
    seen (they go by the plan's other kernel)."""
    xs, ws = (2, 16, 8, 8), (16, 1, 3, 3)
    x, w, b = conv_arrays(xs, ws, np.float32, seed=6)
    call, inputs, _ = _planned(x, w, b, dict(pads=(1, 1, 1, 1), strides=(2, 2)), "", False)
    w *= 3
    np.testing.assert_allclose(call(*inputs), OPS["Conv"].kernel(
        x, w, b, group=16, pads=(1, 1, 1, 1), strides=(2, 2)), rtol=2e-5, atol=2e-5)


def test_strided_inputs_give_the_same_result():
    """An input that is a strided view is read as its values (the planned call copies it)."""
    xs, ws = (2, 16, 10, 10), (16, 1, 3, 3)
    x, w, b = conv_arrays(xs, ws, np.float32, seed=12)
    w, b = file_constant(w), file_constant(b)
    call, _, _ = _planned(x, w, b, dict(pads=(1, 1, 1, 1), strides=(2, 2)), "Relu", True)
    wide = np.zeros((2, 16, 10, 20), np.float32)
    wide[..., ::2] = x
    view = wide[..., ::2]
    assert not view.flags.c_contiguous
    np.testing.assert_array_equal(call(view, w, b), call(x, w, b))
