"""Register-tiled direct convolutions (onemodel.numba.tiled) against the reference kernel and
PyTorch: strides, dilations, uneven pads, 1-D and 1x1 convolutions, output channels that leave part of
a 32-channel block unused, pixel counts that leave one or two pixels after the tiles of three,
every activation (NaN passes through as in the reference), with and without bias and ``out=``;
taken only for float32 constant weights on one thread and the shapes :func:`tiled.fits`
admits. torchvision's DenseNet-121 through a session against onnxruntime:
integration-tests/realmodels/test_torchvision_models.py."""

from __future__ import annotations

import numpy as np
import pytest
from conv_arrays import assert_call_agrees, conv_arrays, file_constant, fused_site

from onemodel.numba import _jit, conv, conv_rows, tiled, winograd
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.specialize import specialize

pytestmark = pytest.mark.skipif(not tiled.host_has_fma(), reason="this CPU has no AVX2/FMA: "
                                "the tiles are never chosen")

ACTIVATIONS = ["", "Relu", "Sigmoid", "Tanh", "HardSwish", "Relu6", "Silu"]
TOL = 5e-6  # relative to the output's scale: fused multiply-adds in another order
RULE_MIN_TAPS = tiled.MIN_TAPS  # (the fixture below admits any number of taps)


@pytest.fixture(autouse=True)
def one_thread(monkeypatch, no_small_convolutions, serial):
    """Serial kernels (the tiles run on one thread only), small shapes admitted."""
    monkeypatch.setattr(tiled, "MIN_TAPS", 1)
    monkeypatch.setattr(tiled, "POINTWISE_MIN_WEIGHTS", 0)


@pytest.fixture(params=["eight", "sixteen"])
def lanes(request, monkeypatch):
    """Blocks of 32 channels on either kernel, whatever this CPU would choose: on eight lanes
    (_tiles) or on sixteen (_tiles_wide, AVX-512's; right on any x86 CPU, where LLVM splits
    its vectors when the CPU's are narrower)."""
    wide = request.param == "sixteen"
    monkeypatch.setattr(tiled, "host_has_avx512", lambda: wide)
    # the convolution rows take convolutions of four input channels or fewer ahead of the
    # tiles where the CPU has AVX-512 (test_conv_rows.py)
    monkeypatch.setattr(conv_rows, "fits", lambda *args: False)
    return tiled._tiles_wide if wide else tiled._tiles


def _prepared(xs, ws, attrs):
    x4, w4 = (xs, ws) if len(xs) == 4 else ((xs[0], xs[1], 1, xs[2]), (ws[0], ws[1], 1, ws[2]))
    two = (lambda v: v) if len(xs) == 4 else (lambda v: None if v is None else (1, *v))
    pads = attrs.get("pads")
    if pads is not None and len(xs) == 3:
        pads = (0, pads[0], 0, pads[1])
    plan = conv._plan(x4, w4, 4, None, conv._key(two(attrs.get("strides"))), conv._key(pads),
                      conv._key(two(attrs.get("dilations"))), attrs.get("auto_pad", "NOTSET"),
                      1, True)
    _, w, _ = conv_arrays(xs, ws, np.float32)
    return conv._prepared_weights(plan, x4, file_constant(w).reshape(w4))


CASES = [  # (X shape, W shape, attrs): output pixels n*oh*ow noted where they end a tile early
    ((2, 16, 15, 15), (64, 16, 3, 3), dict(pads=(1, 1, 1, 1))),  # SqueezeNet at 64x64: 450
    ((1, 5, 7, 6), (48, 5, 3, 3), dict(pads=(1, 1, 1, 1))),  # 42; 48 of two blocks (64)
    ((2, 6, 9, 11), (56, 6, 3, 3), dict(pads=(1, 1, 1, 1), strides=(2, 2))),  # 2x5x6 = 60
    ((1, 4, 12, 10), (32, 4, 5, 5), dict(pads=(2, 0, 1, 3), dilations=(2, 1))),  # uneven
    ((3, 3, 16, 16), (32, 3, 4, 4), dict(strides=(4, 4))),  # patches: 3x4x4 = 48
    ((1, 7, 5, 4), (48, 7, 3, 3), {}),  # no padding: 3x2 = 6 pixels
    ((1, 6, 4, 4), (32, 6, 3, 3), dict(pads=(1, 1, 1, 1))),  # 16: one left after the tiles
    ((1, 6, 5, 1), (32, 6, 3, 3), dict(pads=(1, 1, 1, 1))),  # 5: two left
    ((1, 8, 3, 3), (64, 8, 2, 2), dict(auto_pad="SAME_UPPER")),
    ((2, 8, 40), (32, 8, 5), dict(pads=(2, 2), strides=(3,))),  # Conv1d
    ((1, 4, 40, 40), (32, 4, 3, 3), dict(pads=(1, 1, 1, 1))),  # 1600: several chunks of 96
    ((2, 8, 2, 2), (96, 8, 1, 1), {}),  # 1x1 over 8 pixels, three blocks (prefetch past the end)
    ((1, 5, 3, 5), (64, 5, 1, 1), {}),  # 1x1 over 15 pixels
    ((2, 7, 1, 1), (32, 7, 1, 1), {}),  # 1x1 over 2 pixels: no tile of three
    ((1, 6, 6, 7), (30, 6, 3, 3), dict(pads=(1, 1, 1, 1))),  # 30 channels: 6 past the 8x8s
    ((3, 3, 9, 9), (32, 3, 3, 3), dict(strides=(2, 2))),  # a stem: 16-pixel images in chunks
    # 256 taps or more: tiles of eight pixels on sixteen lanes (EIGHT_PIXELS_MIN_TAPS), then
    # three, two and one
    ((1, 32, 5, 7), (64, 32, 3, 3), dict(pads=(1, 1, 1, 1))),  # 35 = 4x8 + 3
    ((2, 30, 6, 5), (32, 30, 3, 3), dict(pads=(1, 1, 1, 1))),  # 60 = 7x8 + 3 + 1
    ((1, 32, 3, 5), (32, 32, 3, 3), dict(pads=(1, 1, 1, 1))),  # 15 = 8 + 3 + 3 + 1
    ((1, 29, 10, 11), (32, 29, 3, 3), dict(pads=(1, 1, 1, 1))),  # 110: 96 in 12 eights, 14
    # blocks of eight channels (_tiles8): tiles of twelve pixels, then four, then one
    ((2, 3, 32, 32), (8, 3, 7, 7), dict(pads=(3, 3, 3, 3), strides=(2, 2))),  # a stem: 512
    ((1, 5, 7, 5), (8, 5, 3, 3), dict(pads=(1, 1, 1, 1))),  # 35 = 2x12 + 2x4 + 3
    ((1, 5, 7, 5), (20, 5, 3, 3), dict(pads=(1, 1, 1, 1))),  # three blocks, 4 unused
    # blocks of sixteen channels (_tiles16): tiles of six pixels, then one
    ((2, 3, 64, 64), (16, 3, 3, 3), dict(pads=(1, 1, 1, 1), strides=(2, 2))),  # a stem: 2048
    ((1, 5, 7, 5), (12, 5, 3, 3), dict(pads=(1, 1, 1, 1))),  # 35 = 5x6 + 5; 4 unused
    ((2, 4, 9, 10), (16, 4, 3, 3), dict(pads=(1, 2, 0, 1), dilations=(2, 1))),
    ((1, 3, 13, 11), (14, 3, 3, 3), dict(strides=(2, 2))),  # 6x5 = 30 in a chunk: 5x6
]


def test_blocks_are_the_widest_that_waste_at_most_a_quarter(lanes):
    widths = {m: tiled.block(m) for m in (8, 12, 14, 16, 20, 24, 32, 40, 48)}
    assert widths == {8: 8, 12: 16, 14: 16, 16: 16, 20: 8, 24: 32, 32: 32, 40: None, 48: 32}
    kernels = {8: tiled._tiles8, 16: tiled._tiles16, 32: lanes}
    for m in (8, 16, 24):
        xs, ws = (1, 3, 9, 9), (m, 3, 3, 3)
        assert _prepared(xs, ws, {}).kernel is kernels[tiled.block(m)]


@pytest.mark.parametrize("xs, ws, attrs", CASES)
def test_tiles_match_the_reference(xs, ws, attrs, lanes):
    x, w, b = conv_arrays(xs, ws, np.float32, seed=3)
    w = file_constant(w)
    prepared = _prepared(xs, ws, attrs)
    assert isinstance(prepared, tiled.Tiled)
    if tiled.block(ws[0]) == tiled.BLOCK:
        assert prepared.kernel is lanes
    scale = max(float(np.abs(OPS["Conv"].kernel(x, w, b, **attrs)).max()), 1.0)
    for act, bias in zip(ACTIVATIONS, (b, None, b, None, b, None, b)):
        kernel, site, inputs = fused_site(x, w, bias, attrs, act)
        call = specialize(kernel, site)
        want = OPS["FusedConv" if act else "Conv"].kernel(
            *inputs, **attrs, **({"activation": act} if act else {}))
        assert_call_agrees(call, inputs, want, TOL, scale, act)


def test_tiles_match_pytorch(lanes):
    """An independent oracle: PyTorch's conv2d in float64 over a dilated, strided case."""
    torch = pytest.importorskip("torch")
    xs, ws = (2, 9, 17, 13), (64, 9, 3, 3)
    attrs = dict(pads=(2, 1, 2, 1), strides=(2, 1), dilations=(2, 1))
    x, w, b = conv_arrays(xs, ws, np.float32, seed=8)
    w = file_constant(w)
    kernel, site, inputs = fused_site(x, w, b, attrs, "")
    assert isinstance(_prepared(xs, ws, attrs), tiled.Tiled)
    got = specialize(kernel, site)(*inputs)
    want = torch.nn.functional.conv2d(
        torch.from_numpy(x.astype(np.float64)), torch.from_numpy(w.astype(np.float64)),
        torch.from_numpy(b.astype(np.float64)), stride=(2, 1), padding=(2, 1),
        dilation=(2, 1)).numpy()
    assert float(np.abs(got - want).max()) <= TOL * float(np.abs(want).max())


def test_nan_and_inf_propagate_like_the_reference():
    """A NaN input reaches every output whose window holds it, Relu keeps it (as np.maximum
    does), and an infinite weight gives inf or NaN where the reference does."""
    xs, ws = (1, 4, 6, 6), (32, 4, 3, 3)
    x, w, b = conv_arrays(xs, ws, np.float32, seed=2)
    x[0, 1, 2, 3] = np.nan
    w[3, 2, 1, 1] = np.inf
    w = file_constant(w)
    attrs = dict(pads=(1, 1, 1, 1))
    for act in ("", "Relu"):
        kernel, site, inputs = fused_site(x, w, b, attrs, act)
        got = specialize(kernel, site)(*inputs)
        want = OPS["FusedConv" if act else "Conv"].kernel(
            *inputs, **attrs, **({"activation": act} if act else {}))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        assert np.isnan(got).any() and np.isinf(got).any()
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-4)


def test_taken_only_where_it_measured_faster(monkeypatch):
    """float32 constants on one thread, no groups, at least MIN_TAPS taps, at most a quarter
    of a block unused, bordered planes within MAX_PLANES_BYTES; 1x1 only over a few pixels
    with weights that come from memory; Winograd first."""
    monkeypatch.setattr(tiled, "MIN_TAPS", RULE_MIN_TAPS)
    monkeypatch.setattr(tiled, "POINTWISE_MIN_WEIGHTS", 256 << 10)
    # Winograd first on eight lanes (sixteen: test_sixteen_lanes_take_winograds_narrow_...)
    monkeypatch.setattr(tiled, "host_has_avx512", lambda: False)

    def fits(xs, ws, group=1, pads=(1, 1, 1, 1), strides=None):
        plan = conv._plan(xs, ws, 4, None, strides, pads, None, "NOTSET", group, True)
        return tiled.fits(plan, xs, ws, group)
    assert fits((2, 16, 15, 15), (64, 16, 3, 3))  # 144 taps
    assert fits((2, 3, 64, 64), (64, 3, 3, 3), strides=(2, 2))  # a stem: 27 taps
    assert not fits((2, 2, 64, 64), (64, 2, 3, 3))  # 18 taps
    assert fits((2, 3, 32, 32), (8, 3, 7, 7), pads=(3, 3, 3, 3), strides=(2, 2))  # eights
    assert fits((1, 16, 7, 7), (12, 16, 3, 3))  # 12 of 16: a quarter unused
    assert not fits((1, 16, 7, 7), (10, 16, 3, 3))  # 10 of 16
    assert not fits((2, 192, 2, 2), (16, 192, 1, 1), pads=None)  # 1x1: blocks of 32 only
    assert fits((1, 3, 224, 224), (64, 3, 7, 7), pads=(3, 3, 3, 3), strides=(2, 2))  # 620 KiB
    assert fits((2, 3, 32, 32), (32, 3, 8, 8), pads=None, strides=(8, 8))  # patches: 192
    assert not fits((2, 64, 16, 16), (128, 64, 1, 1), pads=None, strides=(2, 2))  # 1x1 s2
    assert not fits((2, 32, 8, 8), (64, 16, 3, 3), group=2)
    assert fits((1, 16, 7, 7), (48, 16, 3, 3))  # 48 of 64: a quarter unused
    assert not fits((1, 16, 7, 7), (40, 16, 3, 3))  # 40 of 64
    assert fits((1, 128, 14, 14), (32, 128, 3, 3))  # 128 x 16 x 16 x 4 bytes: 128 KiB
    assert not fits((2, 512, 16, 16), (64, 512, 3, 3))  # 1.3 MiB of bordered planes
    # 1x1: over at most 16 pixels, with at least 256 KiB of weights
    assert fits((2, 192, 2, 2), (1152, 192, 1, 1), pads=None)  # EfficientNet: 864 KiB
    assert fits((1, 112, 4, 4), (672, 112, 1, 1), pads=None)
    assert not fits((2, 112, 4, 4), (672, 112, 1, 1), pads=None)  # 32 pixels
    assert not fits((2, 192, 2, 2), (320, 192, 1, 1), pads=None)  # 240 KiB
    assert not fits((2, 192, 4, 4), (1152, 192, 1, 1), pads=None, strides=(2, 2))
    xs, ws = (1, 32, 8, 8), (64, 32, 3, 3)
    plan = conv._plan(xs, ws, 4, None, None, (1, 1, 1, 1), None, "NOTSET", 1, True)
    _, w, _ = conv_arrays(xs, ws, np.float32, seed=4)
    assert isinstance(conv._prepared_weights(plan, xs, file_constant(w)), conv._Winograd)
    monkeypatch.setattr(winograd, "MIN_PLANE", 1 << 30)
    assert isinstance(conv._prepared_weights(plan, xs, file_constant(w)), tiled.Tiled)
    assert conv._prepared_weights(plan, xs, file_constant(w.astype(np.float64))) is None
    monkeypatch.setattr(_jit, "_parallel", True)
    assert conv._prepared_weights(plan, xs, file_constant(w)) is None


def test_sixteen_lanes_take_winograds_narrow_convolutions(monkeypatch):
    """With sixteen lanes, a convolution that Winograd would take goes by the tiles when it
    has at most 32 outputs or at most 64 inputs (WIDE_OVER_WINOGRAD_MAX_OUTPUTS and _INPUTS);
    with 128 of both Winograd keeps it, and on eight lanes Winograd keeps them all."""
    monkeypatch.setattr(tiled, "MIN_TAPS", RULE_MIN_TAPS)

    def prepared(c, m, wide):
        monkeypatch.setattr(tiled, "host_has_avx512", lambda: wide)
        xs, ws = (2, c, 8, 8), (m, c, 3, 3)
        plan = conv._plan(xs, ws, 4, None, None, (1, 1, 1, 1), None, "NOTSET", 1, True)
        _, w, _ = conv_arrays(xs, ws, np.float32, seed=5)
        return conv._prepared_weights(plan, xs, file_constant(w))
    assert isinstance(prepared(128, 32, True), tiled.Tiled)
    assert isinstance(prepared(64, 128, True), tiled.Tiled)
    assert isinstance(prepared(128, 64, True), conv._Winograd)
    assert isinstance(prepared(128, 32, False), conv._Winograd)
    assert isinstance(prepared(64, 128, False), conv._Winograd)


def test_weights_changed_in_place_are_seen(monkeypatch):
    """Weights that can change in place are not packed once: an update after planning shows."""
    xs, ws = (1, 8, 9, 9), (32, 8, 3, 3)
    x, w, b = conv_arrays(xs, ws, np.float32, seed=6)
    attrs = dict(pads=(1, 1, 1, 1))
    kernel, site, inputs = fused_site(x, w, b, attrs, "")
    call = specialize(kernel, site)
    w *= 2
    np.testing.assert_allclose(call(*inputs), OPS["Conv"].kernel(x, w, b, **attrs),
                               rtol=2e-5, atol=2e-5)


def test_strided_inputs_give_the_same_result():
    """An input that is a strided view (a channel slice, a transposed copy) is read as its
    values, through the planned call's contiguous copy."""
    xs, ws = (2, 16, 9, 9), (64, 16, 3, 3)
    x, w, b = conv_arrays(xs, ws, np.float32, seed=11)
    w = file_constant(w)
    attrs = dict(pads=(1, 1, 1, 1))
    kernel, site, _ = fused_site(x, w, b, attrs, "Relu")
    assert isinstance(_prepared(xs, ws, attrs), tiled.Tiled)
    call = specialize(kernel, site)
    wide = np.zeros((2, 32, 9, 9), np.float32)
    wide[:, ::2] = x
    strided = wide[:, ::2]
    transposed = np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    want = call(x, w, b)
    for view in (strided, transposed):
        assert not view.flags.c_contiguous
        np.testing.assert_array_equal(call(view, w, b), want)


def test_a_read_only_output_is_refused_not_written():
    """The machine code bound at the first call writes its output unchecked: a read-only one
    goes through numba's dispatch, which refuses it."""
    xs, ws, attrs = CASES[0]
    x, _, b = conv_arrays(xs, ws, np.float32, seed=3)
    tiles = _prepared(xs, ws, attrs)
    plan = conv._plan(xs, ws, 4, None, None, (1, 1, 1, 1), None, "NOTSET", 1, True)
    y = np.zeros(plan[1], np.float32)
    tiles.run(x, b, True, 1, plan, y)  # binds the machine code
    frozen = np.zeros(plan[1], np.float32)
    frozen.flags.writeable = False
    with pytest.raises(Exception):  # noqa: B017 - numba's typing error
        tiles.run(x, b, True, 1, plan, frozen)
    assert not frozen.any()
