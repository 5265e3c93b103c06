"""The one-call small-convolution kernel (conv._small_conv): every case takes that path and
matches PyTorch (conv2d/conv1d, then the activation) and the columns-and-GEMM path it replaces,
in float32 and float64, with and without bias, each activation, with and without ``out=``;
odd sizes, strides, asymmetric pads, pads wider than the taps reach (output rows that only get
the bias), dilations, groups, a kernel as big as the image, Conv1d; strided inputs and the
specialized call's fallback to the generic call for other shapes. Also which convolutions
take the path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conv_arrays import conv_arrays

from onemodel.numba import conv
from onemodel.tensors import ShapeError
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.nn import _geometry
from onemodel.tensors.ops.specialize import CallSite, specialize

TOL = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-11, atol=1e-11)}
ACTS = ["", "Relu", "Sigmoid", "Tanh", "HardSwish"]
TORCH_ACT = {"": lambda t: t, "Relu": torch.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh,
             "HardSwish": lambda t: t * torch.clamp(t / 6 + 0.5, 0, 1)}  # ONNX's formula

# (X shape, W shape, attributes); every one is small (asserted)
CASES = [
    ((2, 3, 9, 7), (4, 3, 3, 3), dict(pads=(1, 0, 2, 1), strides=(2, 1))),
    ((1, 4, 6, 5), (6, 2, 2, 3), dict(group=2, dilations=(2, 1), pads=(1, 1, 0, 2))),
    ((3, 2, 5, 8), (5, 2, 1, 1), dict(strides=(2, 3))),
    ((2, 6, 4, 4), (6, 3, 3, 3), dict(group=2, pads=(1, 1, 1, 1))),
    ((1, 3, 11, 10), (2, 3, 4, 4), dict(strides=(4, 4))),  # a patch embedding
    ((2, 5, 7, 7), (3, 5, 5, 5), dict(pads=(4, 4, 4, 4), dilations=(2, 2))),
    ((1, 2, 3, 3), (3, 2, 3, 3), dict(auto_pad="SAME_LOWER", strides=(2, 2))),
    ((2, 4, 1, 1), (5, 4, 1, 1), {}),
    ((1, 3, 5, 5), (4, 3, 5, 5), {}),  # the kernel covers the image: a 1x1 output
    ((1, 2, 2, 2), (3, 2, 3, 3), dict(pads=(3, 3, 3, 2))),  # rows and columns of bias only
    ((2, 8, 8, 8), (8, 8, 3, 3), dict(pads=(1, 1, 1, 1))),  # wide: above the narrow limit
    ((2, 9, 3, 5), (6, 3, 2, 2), dict(group=3, strides=(1, 2), pads=(0, 1, 1, 0))),
    ((1, 4, 6, 6), (8, 2, 3, 3), dict(group=2, pads=(1, 1, 1, 1))),
    ((2, 16, 32), (32, 16, 3), dict(pads=(1, 1))),  # Whisper's stem, 1-D
    ((2, 32, 32), (32, 32, 3), dict(pads=(1, 1), strides=(2,))),
    ((1, 4, 9), (6, 2, 3), dict(group=2, dilations=(2,), pads=(2, 0))),
    ((3, 3, 7), (2, 3, 2), dict(auto_pad="SAME_UPPER", strides=(2,))),
    # a few output pixels: the kernel of dot products along the weights
    ((2, 6, 3, 3), (4, 3, 3, 3), dict(group=2, strides=(2, 2), pads=(1, 0, 1, 1))),
    ((1, 2, 2, 2), (3, 2, 3, 3), dict(pads=(3, 3, 3, 3), strides=(3, 3))),  # bias-only pixels
    ((2, 40, 1, 1), (10, 40, 1, 1), {}),  # squeeze-and-excitation
    # strided over 128+ output pixels: up to the strided limit (295k multiply-adds here)
    ((8, 8, 8, 8), (32, 8, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1))),
    ((1, 4, 5), (6, 2, 3), dict(group=2, dilations=(2,), strides=(3,), pads=(1, 1))),
    # 1x1 at stride 1 over more than eight pixels: each image's planes are its columns
    ((2, 12, 5, 7), (10, 12, 1, 1), {}),
    ((3, 6, 4, 3), (8, 3, 1, 1), dict(group=2)),
    ((2, 6, 10), (9, 6, 1), {}),
]


def _attrs_2d(xs, ws, attrs):
    """The attributes of a 1-D case as the 2-D ones the plan sees."""
    if len(xs) == 4:
        return xs, ws, attrs
    a = dict(attrs)
    for key, two in (("pads", lambda p: (0, p[0], 0, p[1])), ("strides", lambda s: (1, s[0])),
                     ("dilations", lambda d: (1, d[0]))):
        if key in a:
            a[key] = two(a[key])
    return (xs[0], xs[1], 1, xs[2]), (ws[0], ws[1], 1, ws[2]), a


def _plan(xs, ws, attrs, itemsize=4):
    xs, ws, a = _attrs_2d(xs, ws, attrs)
    return conv._plan(xs, ws, itemsize, None, conv._key(a.get("strides")),
                      conv._key(a.get("pads")), conv._key(a.get("dilations")),
                      a.get("auto_pad", "NOTSET"), a.get("group", 1))


def _torch(x, w, b, act, attrs):
    """PyTorch's convolution: the ONNX pads (or auto_pad) made explicit with F.pad."""
    nd = x.ndim - 2
    k = w.shape[2:]
    s, pb, pe, d, _, _ = _geometry(x.shape[2:], k, attrs.get("strides"), attrs.get("pads"),
                                   attrs.get("dilations"), attrs.get("auto_pad", "NOTSET"))
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    tb = None if b is None else torch.from_numpy(b)
    widths = []
    for i in reversed(range(nd)):  # F.pad takes the last axis first
        widths += [pb[i], pe[i]]
    tx = torch.nn.functional.pad(tx, widths)
    fn = torch.nn.functional.conv2d if nd == 2 else torch.nn.functional.conv1d
    y = fn(tx, tw, tb, stride=s, dilation=d, groups=attrs.get("group", 1))
    return TORCH_ACT[act](y).numpy()


def _ours(x, w, b, act, attrs, out=None):
    if act:
        return conv.fused_conv(x, w, b, activation=act, out=out, **attrs)
    return conv.conv(x, w, b, out=out, **attrs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("xs, ws, attrs", CASES)
def test_small_path_matches_torch(xs, ws, attrs, dtype):
    assert _plan(xs, ws, attrs)[0] == conv._SMALL
    x, w, b = conv_arrays(xs, ws, dtype)
    for i, act in enumerate(ACTS):
        for bias in (b, None):
            want = _torch(x, w, bias, act, attrs)
            got = _ours(x, w, bias, act, attrs)
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_allclose(got, want, **TOL[dtype])
            if i % 2 == 0:  # a planned buffer, NaN-filled: every element written
                out = np.full(want.shape, np.nan, dtype)
                assert _ours(x, w, bias, act, attrs, out=out) is out
                np.testing.assert_allclose(out, want, **TOL[dtype])


@pytest.fixture
def columns_only(monkeypatch):
    """Plans with the small path switched off (the columns and GEMM path)."""
    names = ("_SMALL_MAX_WORK", "_SMALL_MAX_WORK_WIDE", "_SMALL_MAX_WORK_NARROW",
             "_SMALL_MAX_WORK_STRIDED")
    saved = tuple(getattr(conv, name) for name in names)

    def switch(on):
        for name, value in zip(names, saved):
            monkeypatch.setattr(conv, name, value if on else -1)
        conv._plan.cache_clear()
        conv._PLANS.clear()
    yield switch
    conv._plan.cache_clear()
    conv._PLANS.clear()


@pytest.mark.parametrize("xs, ws, attrs", CASES)
def test_small_path_matches_the_columns_path(xs, ws, attrs, columns_only):
    x, w, b = conv_arrays(xs, ws, np.float32, seed=1)
    got = conv.fused_conv(x, w, b, activation="Sigmoid", **attrs)
    columns_only(False)
    assert _plan(xs, ws, attrs)[0] != conv._SMALL
    want = conv.fused_conv(x, w, b, activation="Sigmoid", **attrs)
    columns_only(True)
    np.testing.assert_allclose(got, want, **TOL[np.float32])
    # and the reference kernel
    np.testing.assert_allclose(conv.conv(x, w, None, **attrs),
                               OPS["Conv"].kernel(x, w, None, **attrs), **TOL[np.float32])


def test_relu_keeps_nan_and_infinities():
    x, w, b = conv_arrays((2, 3, 6, 6), (4, 3, 3, 3), np.float32, seed=2)
    x[0, 0, 0, 0] = np.nan
    x[1, 2, 5, 5] = np.inf
    x[1, 0, 0, 5] = -np.inf
    attrs = dict(pads=(1, 1, 1, 1))
    assert _plan(x.shape, w.shape, attrs)[0] == conv._SMALL
    with np.errstate(invalid="ignore"):
        want = OPS["FusedConv"].kernel(x, w, b, activation="Relu", **attrs)
        got = conv.fused_conv(x, w, b, activation="Relu", **attrs)
    assert np.isnan(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, **TOL[np.float32])


def _site(kernel, inputs, attrs, consts):
    generic = lambda *a, **k: kernel(*a, **attrs, **k)
    y = generic(*inputs)
    return CallSite(tuple(a.shape for a in inputs), tuple(a.dtype for a in inputs),
                    tuple(a if i in consts else None for i, a in enumerate(inputs)),
                    dict(attrs), (y.shape,), generic)


@pytest.mark.parametrize("xs, ws, attrs", [CASES[0], CASES[3], CASES[-4], CASES[-2]])
@pytest.mark.parametrize("consts", [(1, 2), ()], ids=["const", "inputs"])
def test_specialized_call(xs, ws, attrs, consts):
    """The specialized call of a small convolution: the one kernel on planned shapes (strided
    inputs copied, constant weights used as they are, out= filled), the generic call for
    other shapes, dtypes or a missing bias."""
    x, w, b = conv_arrays(xs, ws, np.float32, seed=3)
    attrs = dict(attrs, activation="Tanh")
    site = _site(conv.fused_conv, [x, w, b], attrs, consts)
    call = specialize(conv.fused_conv, site)
    assert call is not None and call.__name__ == "conv_small_at"
    want = _torch(x, w, b, "Tanh", attrs)
    np.testing.assert_allclose(call(x, w, b), want, **TOL[np.float32])
    big = np.full(x.shape[:-1] + (2 * x.shape[-1],), np.nan, np.float32)
    big[..., ::2] = x
    np.testing.assert_allclose(call(big[..., ::2], w.copy(), b.copy()), want, **TOL[np.float32])
    out = np.full(want.shape, np.nan, np.float32)
    assert call(x, w, b, out=out) is out
    np.testing.assert_allclose(out, want, **TOL[np.float32])
    x2 = np.concatenate([x, x[:1] + 1])  # another batch: the generic call
    np.testing.assert_allclose(call(x2, w, b), _torch(x2, w, b, "Tanh", attrs),
                               **TOL[np.float32])
    x64, w64, b64 = (a.astype(np.float64) for a in (x, w, b))
    got = call(x64, w64, b64)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, _torch(x64, w64, b64, "Tanh", attrs), **TOL[np.float64])
    np.testing.assert_allclose(call(x, w, None), _torch(x, w, None, "Tanh", attrs),
                               **TOL[np.float32])


def test_which_convolutions_are_small():
    """Small work takes the one-call kernel; wide output planes allow more work; large work,
    and depthwise convolutions (kernels of their own), keep their paths."""
    assert _plan((1, 4, 8, 8), (8, 4, 3, 3), dict(pads=(1, 1, 1, 1)))[0] == conv._SMALL
    assert _plan((2, 8, 8, 8), (8, 8, 3, 3), dict(pads=(1, 1, 1, 1)))[0] == conv._SMALL
    # 36864 multiply-adds over 16 output pixels: too narrow for more than _SMALL_MAX_WORK
    assert _plan((1, 16, 4, 4), (16, 16, 3, 3), dict(pads=(1, 1, 1, 1)))[0] != conv._SMALL
    # but up to _SMALL_MAX_WORK_NARROW on at most 8
    assert _plan((2, 16, 2, 2), (16, 16, 3, 3), dict(pads=(1, 1, 1, 1)))[0] == conv._SMALL
    assert _plan((2, 160, 1, 1), (100, 160, 1, 1), {})[0] == conv._SMALL
    assert _plan((2, 160, 1, 1), (160, 160, 1, 1), {})[0] == conv._SKINNY  # past the limit
    assert _plan((2, 16, 8, 8), (16, 16, 3, 3), dict(pads=(1, 1, 1, 1)))[0] != conv._SMALL
    assert _plan((2, 8, 8, 8), (8, 1, 3, 3), dict(group=8, pads=(1, 1, 1, 1)))[0] <= conv._DW
    assert _plan((2, 4, 4, 4), (4, 4, 1, 1), {})[0] == conv._SMALL  # 1x1 too
    # strided over 128 output pixels: up to _SMALL_MAX_WORK_STRIDED, not when grouped
    s2 = dict(strides=(2, 2), pads=(1, 1, 1, 1))
    assert _plan((8, 16, 8, 8), (32, 16, 3, 3), s2)[0] == conv._SMALL  # 590k
    assert _plan((8, 32, 8, 8), (32, 32, 3, 3), s2)[0] != conv._SMALL  # 1.2M
    assert _plan((8, 16, 8, 8), (32, 8, 3, 3), dict(s2, group=2))[0] != conv._SMALL
    assert _plan((2, 16, 8, 8), (32, 16, 3, 3), s2)[0] != conv._SMALL  # 32 pixels, 147k


@pytest.mark.parametrize("ws", [(5, 2, 3, 3), (5, 2, 3)])
def test_output_channels_not_a_multiple_of_group_is_an_error(ws):
    """Groups of unequal size: a ShapeError naming the problem, not a result."""
    x = np.ones((1, 4, 5, 5)[:len(ws)], np.float32)
    with pytest.raises(ShapeError, match="multiple of group"):
        conv.conv(x, np.ones(ws, np.float32), group=2)


@pytest.mark.parametrize("xs, ws, attrs", [c for c in CASES if len(c[0]) == 4][:6])
def test_gradients_of_small_convolutions(xs, ws, attrs):
    """The gradients of a convolution planned as small take the batch-wide GEMM path: against
    the reference kernels."""
    assert _plan(xs, ws, attrs, 8)[0] == conv._SMALL
    x, w, _ = conv_arrays(xs, ws, np.float64, seed=4)
    dy = np.random.default_rng(5).standard_normal(OPS["Conv"].kernel(x, w, **attrs).shape)
    for op, fn in (("ConvInputGrad", conv.conv_input_grad),
                   ("ConvWeightGrad", conv.conv_weight_grad)):
        np.testing.assert_allclose(fn(x, w, dy, **attrs), OPS[op].kernel(x, w, dy, **attrs),
                                   **TOL[np.float64])


def test_both_kernels_are_covered():
    """The cases above run both the wide kernel and the narrow one (few output pixels)."""
    narrow = []
    for xs, ws, attrs in CASES:
        plan = _plan(xs, ws, attrs)
        xs, ws, _ = _attrs_2d(xs, ws, attrs)
        narrow.append(conv._small_table(xs, ws, attrs.get("group", 1), 0, True, plan)[
            conv._T_NARROW])
    assert sum(narrow) >= 5 and len(narrow) - sum(narrow) >= 10


def _file_constant(a):
    """``a`` as a constant loaded from a file: a read-only view of immutable bytes."""
    return np.frombuffer(a.tobytes(), a.dtype).reshape(a.shape)


# narrow, ungrouped, many output channels: the kernel along the output channels
BY_CHANNELS = [
    ((2, 40, 1, 1), (240, 40, 1, 1), {}),  # a squeeze-and-excitation expansion
    ((2, 24, 2, 2), (144, 24, 1, 1), {}),  # two 2x2 images: two blocks of four pixels
    ((1, 16, 1, 1), (33, 16, 1, 1), {}),  # one pixel, an odd channel count
    ((3, 7, 1, 1), (35, 7, 1, 1), {}),  # three pixels: no full block of four
    ((1, 6, 3, 3), (40, 6, 3, 3), dict(pads=(1, 0, 1, 1), strides=(2, 2))),  # taps, padding
    ((2, 8, 5), (32, 8, 3), dict(strides=(2,), pads=(0, 1))),  # Conv1d, 2 pixels per image
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("xs, ws, attrs", BY_CHANNELS)
def test_narrow_convolutions_by_output_channels(xs, ws, attrs, dtype, no_pointwise):
    """A file's weights (immutable) on a narrow ungrouped convolution with many outputs take
    conv._small_conv_by_channels (weights laid out once as (C*kh*kw, M)) and match PyTorch
    with every activation; writable weights, other weights and a missing bias take the dot
    products and match too. (Float32 1x1 ones on one thread take pointwise.py's tiles
    instead.)"""
    plan = _plan(xs, ws, attrs)
    assert plan[0] == conv._SMALL
    x4, w4, _ = _attrs_2d(xs, ws, attrs)
    assert conv._by_channels(conv._small_table(x4, w4, 1, 0, True, plan))
    x, w, b = conv_arrays(xs, ws, dtype, seed=5)
    wf, bf = _file_constant(w), _file_constant(b)
    calls = []
    for act in ACTS:
        a = dict(attrs, activation=act)
        site = _site(conv.fused_conv, [x, wf, bf], a, (1, 2))
        call = specialize(conv.fused_conv, site)
        assert call.__name__ == "conv_small_at"
        calls.append(call)
        want = _torch(x, w, b, act, attrs)
        out = np.full(want.shape, np.nan, dtype)
        assert call(x, wf, bf, out=out) is out
        np.testing.assert_allclose(out, want, **TOL[dtype])
        np.testing.assert_allclose(call(x, w, b), want, **TOL[dtype])  # other (equal) weights
    assert dict(zip(calls[0].__code__.co_freevars,
                    (c.cell_contents for c in calls[0].__closure__)))["w_cols"] is not None
    writable = specialize(conv.fused_conv, _site(conv.fused_conv, [x, w, b],
                                                 dict(attrs, activation="Relu"), (1, 2)))
    assert dict(zip(writable.__code__.co_freevars,
                    (c.cell_contents for c in writable.__closure__)))["w_cols"] is None
    np.testing.assert_allclose(writable(x, w, b), _torch(x, w, b, "Relu", attrs), **TOL[dtype])
    x2 = x * 3 - 1
    np.testing.assert_allclose(calls[1](x2, wf, bf), _torch(x2, w, b, "Relu", attrs),
                               **TOL[dtype])


def test_deep_reductions_keep_the_dot_products():
    """480 channels to 16 (thirty weights per output) stay with the dot products, which
    measured faster there; grouped and wide convolutions never take the kernel."""
    for xs, ws, group in [((2, 480, 1, 1), (16, 480, 1, 1), 1),
                          ((2, 64, 1, 1), (64, 16, 1, 1), 4),
                          ((2, 8, 8, 8), (48, 8, 1, 1), 1)]:
        plan = conv._plan(xs, ws, 4, None, None, None, None, "NOTSET", group)
        assert plan[0] == conv._SMALL
        assert not conv._by_channels(conv._small_table(xs, ws, group, 0, True, plan))


def test_a_1d_convolution_refuses_an_out_of_another_rank():
    """An ``out=`` that is not 3-D for a 1-D convolution is a ShapeError that says so (an
    IndexError from the reshape before)."""
    x, w, b = conv_arrays((2, 4, 9), (6, 4, 3), np.float32)
    for fn in (conv.conv, lambda *a, **k: conv.fused_conv(*a, activation="Relu", **k)):
        with pytest.raises(ShapeError, match="has 3 axes"):
            fn(x, w, b, out=np.zeros(6 * 2 * 7, np.float32))
