"""Each path of the numba convolution (the depthwise channels-last, tap-table, written-out and
padded-plane kernels, the direct 1x1 GEMMs, columns with one GEMM per image or one GEMM over the whole
batch, chunked or not) against the reference kernel, with and without a planned ``out=``
buffer; the gradients over several chunks and of depthwise convolutions; Relu keeping NaN as
the reference does. Each case also checks that it takes the path it is named for, so a change
of the selection rules cannot leave a path untested."""

from __future__ import annotations

import numpy as np
import pytest
from conv_arrays import conv_arrays

from onemodel.numba import conv
from onemodel.tensors.ops import OPS

TOL = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-11, atol=1e-11)}
# the skinny product sums a thousand terms of size ~1 in another order than BLAS: float32
# rounding of sums of ~30 (the reassociated sums of test_kernels' table are checked likewise)
TOL_DEEP = dict(rtol=2e-5, atol=2e-4)


def _tol(path, dtype):
    return TOL_DEEP if path == conv._SKINNY and dtype == np.float32 else TOL[dtype]

# (path, X shape, W shape, attrs)
CASES = [
    (conv._DW_TABLE, (2, 12, 2, 2), (12, 1, 5, 5), dict(group=12, pads=(2, 2, 2, 2))),
    (conv._DW_TABLE, (2, 6, 8, 7), (12, 1, 5, 3), dict(group=6, strides=(2, 2),
                                                       pads=(2, 1, 1, 0), dilations=(1, 2))),
    (conv._DW_TABLE, (1, 5, 3, 3), (5, 1, 3, 3), dict(group=5, auto_pad="SAME_UPPER")),
    # dilated 5x5 over a 4x4 plane (LR-ASPP): most taps fall in the padding
    (conv._DW_TABLE, (2, 6, 4, 4), (6, 1, 5, 5), dict(group=6, pads=(4, 4, 4, 3),
                                                      dilations=(2, 2))),
    (conv._DW_TAPS, (2, 4, 9, 8), (4, 1, 3, 3), dict(group=4, pads=(1, 1, 0, 0))),
    # a channel multiplier, strides, dilations and uneven pads: every phase of the plane
    (conv._DW_TAPS, (2, 3, 27, 29), (6, 1, 3, 5), dict(group=3, strides=(2, 3),
                                                       pads=(2, 1, 1, 3), dilations=(2, 1))),
    (conv._DW_TAPS, (1, 16, 16, 16), (16, 1, 3, 3), dict(group=16, pads=(1, 1, 1, 1),
                                                         dilations=(1, 2))),
    # 7x7 (ConvNeXt) and 5x5 windows: their taps summed in several passes
    (conv._DW_TAPS, (2, 8, 8, 8), (8, 1, 7, 7), dict(group=8, pads=(3, 3, 3, 2))),
    (conv._DW_TAPS, (1, 5, 19, 17), (5, 1, 7, 7), dict(group=5, strides=(2, 2),
                                                       pads=(3, 2, 3, 1))),
    (conv._DW_TAPS, (1, 4, 12, 12), (8, 1, 5, 5), dict(group=4, pads=(2, 2, 1, 1))),
    # stride 1, the output the input's size, 8x8 or larger: the whole-plane kernel, for odd
    # and even sizes, every begin pad a window allows, a channel multiplier, 7x7 windows (two
    # passes over the taps), even and one-row windows
    (conv._DW_FLAT, (2, 4, 9, 8), (4, 1, 3, 3), dict(group=4, pads=(1, 1, 1, 1))),
    (conv._DW_FLAT, (1, 16, 16, 16), (16, 1, 3, 3), dict(group=16, pads=(0, 2, 2, 0))),
    (conv._DW_FLAT, (2, 8, 8, 8), (8, 1, 7, 7), dict(group=8, pads=(3, 3, 3, 3))),
    (conv._DW_FLAT, (1, 4, 12, 12), (8, 1, 5, 5), dict(group=4, pads=(2, 2, 2, 2))),
    (conv._DW_FLAT, (2, 3, 11, 13), (6, 1, 5, 5), dict(group=3, pads=(4, 0, 0, 4))),
    (conv._DW_FLAT, (1, 6, 10, 7), (6, 1, 2, 2), dict(group=6, pads=(0, 1, 1, 0))),
    (conv._DW_FLAT, (2, 5, 8, 9), (5, 1, 1, 3), dict(group=5, auto_pad="SAME_LOWER")),
    (conv._DW_TAPS, (1, 16, 33, 32), (16, 1, 3, 3), dict(group=16, strides=(2, 2),
                                                         pads=(0, 1, 1, 0))),
    # more taps than the written-out kernel takes: the per-tap padded-plane kernel
    (conv._DW, (1, 3, 12, 12), (3, 1, 9, 9), dict(group=3, pads=(4, 4, 4, 4))),
    (conv._DIRECT, (1, 10, 5, 6), (7, 10, 1, 1), {}),
    # 1x1 over 1x1 planes (squeeze-and-excitation): the numba product on the input as it is
    # (float64: BLAS, (N, C) @ (C, M) when C >= M, else one GEMM per image)
    (conv._SKINNY, (3, 10, 1, 1), (7, 10, 1, 1), {}),
    (conv._SKINNY, (2, 6, 1, 1), (11, 6, 1, 1), {}),
    (conv._DIRECT, (17, 10, 1, 1), (7, 10, 1, 1), {}),  # more images: (N, C) @ (C, M)
    (conv._DIRECT, (17, 6, 1, 1), (11, 6, 1, 1), {}),  # C < M: one GEMM per image
    (conv._DIRECT, (2, 8, 4, 3), (6, 4, 1, 1), dict(group=2)),
    (conv._ONE_GEMM, (3, 5, 6, 6), (7, 5, 3, 3), dict(pads=(1, 1, 1, 1), strides=(2, 2))),
    (conv._ONE_GEMM, (2, 6, 5, 4), (4, 3, 2, 3), dict(group=2, pads=(0, 1, 1, 1),
                                                      dilations=(2, 1))),
    (conv._ONE_GEMM, (2, 4, 7, 7), (6, 4, 1, 1), dict(strides=(2, 2))),
    (conv._BY_IMAGE, (2, 3, 12, 11), (5, 3, 3, 3), dict(pads=(1, 1, 1, 1))),
    (conv._BY_IMAGE, (3, 4, 10, 9), (6, 2, 3, 2), dict(group=2, pads=(1, 0, 1, 1))),
    (conv._DW_TABLE, (0, 4, 3, 3), (4, 1, 3, 3), dict(group=4)),
    (conv._BY_IMAGE, (1, 3, 9, 9), (4, 3, 3, 3), {}),
    # strided with output rows of 32 or more, or 7x7 windows: the columns copied from the
    # stride's phases (_im2col_phased), in both layouts; and a strided gather on shorter rows
    (conv._BY_IMAGE, (1, 2, 6, 96), (4, 2, 3, 2), dict(strides=(2, 3), pads=(2, 1, 1, 0),
                                                      dilations=(2, 1))),
    (conv._ONE_GEMM, (2, 3, 3, 96), (5, 3, 3, 2), dict(strides=(2, 3), pads=(2, 1, 1, 0),
                                                      dilations=(2, 1))),
    (conv._BY_IMAGE, (1, 2, 21, 21), (3, 2, 7, 7), dict(strides=(2, 2), pads=(3, 3, 3, 3))),
    (conv._BY_IMAGE, (1, 3, 16, 40), (4, 3, 3, 2), dict(strides=(2, 3), pads=(2, 1, 1, 0),
                                                       dilations=(2, 1))),
    # patches (a window no wider than its stride, as a ViT's): a strided gather, even on long
    # rows or with 64 taps
    (conv._BY_IMAGE, (1, 3, 128, 256), (16, 3, 8, 8), dict(strides=(8, 8))),
    (conv._ONE_GEMM, (2, 3, 16, 16), (5, 3, 4, 4), dict(strides=(4, 4))),
    # no padding, every window inside the plane: the columns read the input itself (patches
    # that leave the last rows and columns out, dilated and grouped windows); pads only at
    # the end keep the zero-bordered copy
    (conv._BY_IMAGE, (1, 2, 17, 13), (3, 2, 4, 4), dict(strides=(4, 4))),
    (conv._BY_IMAGE, (1, 2, 11, 11), (3, 2, 3, 3), dict(dilations=(2, 2))),
    (conv._ONE_GEMM, (2, 4, 9, 8), (6, 2, 3, 3), dict(group=2, strides=(1, 2))),
    (conv._BY_IMAGE, (1, 2, 9, 9), (3, 2, 3, 3), dict(pads=(0, 0, 2, 2))),
    (conv._ONE_GEMM, (2, 2, 9, 9), (3, 2, 3, 3), dict(pads=(0, 0, 1, 2), strides=(2, 2))),
    (conv._DW_NHWC, (2, 20, 4, 4), (20, 1, 5, 5), dict(group=20, pads=(2, 2, 2, 2))),
    (conv._DW_NHWC, (2, 17, 13, 12), (17, 1, 3, 3), dict(group=17, strides=(2, 3),
                                                         pads=(2, 1, 0, 1), dilations=(2, 1))),
    (conv._DW_NHWC, (1, 32, 3, 3), (32, 1, 3, 3), dict(group=32, auto_pad="SAME_UPPER")),
    # narrow products with 256 KiB of weights or more (ResNet's last stage on small images):
    # 4x4 blocks of rows and columns and every leftover (weights of 65 rows, 5 and 6 columns)
    (conv._SKINNY, (1, 128, 3, 7), (65, 128, 3, 3), {}),
    (conv._SKINNY, (3, 300, 2, 1), (260, 300, 1, 1), {}),
    # two images of 3x3 planes: 18 columns (SqueezeNet's last fire modules)
    (conv._SKINNY, (2, 64, 3, 3), (128, 64, 3, 3), dict(pads=(1, 1, 1, 1))),
]
ACTIVATIONS = ["", "Relu", "Sigmoid", "Tanh", "HardSwish", "Silu"]


@pytest.fixture(autouse=True)
def no_small_path(no_small_convolutions):
    """Each case takes the path it is named for, not the one-call small kernel."""


def test_strided_cases_take_both_column_builders():
    """The phased column builder is chosen for the cases above that are meant for it."""
    builders = set()
    for path, xs, ws, attrs in CASES:
        if path in (conv._BY_IMAGE, conv._ONE_GEMM) and attrs.get("strides", (1, 1)) != (1, 1):
            plan = conv._plan(xs, ws, 4, None, attrs.get("strides"), attrs.get("pads"),
                              attrs.get("dilations"), "NOTSET", attrs.get("group", 1))
            builders.add(conv._columns(plan[5], plan[2], plan[1][3]))
    assert builders == {conv._im2col, conv._im2col_phased}


def test_patches_are_gathered_without_phases():
    """Windows that do not overlap read each input once: no phase copy for them."""
    assert conv._columns((8, 8), (8, 8), 32) is conv._im2col
    assert conv._columns((16, 16), (16, 16), 14) is conv._im2col
    assert conv._columns((7, 7), (2, 2), 16) is conv._im2col_phased


def _path(x, w, attrs):
    return conv._plan(x.shape, w.shape, x.itemsize, conv._key(attrs.get("kernel_shape")),
                      conv._key(attrs.get("strides")), conv._key(attrs.get("pads")),
                      conv._key(attrs.get("dilations")), attrs.get("auto_pad", "NOTSET"),
                      attrs.get("group", 1))[0]


def _run(x, w, b, act, attrs, out=None):
    if act:
        want = OPS["FusedConv"].kernel(x, w, b, activation=act, **attrs)
        got = conv.fused_conv(x, w, b, activation=act, out=out, **attrs)
    else:
        want = OPS["Conv"].kernel(x, w, b, **attrs)
        got = conv.conv(x, w, b, out=out, **attrs)
    return got, want


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=[f"{p}-{i}" for i, (p, *_) in enumerate(CASES)])
def test_each_path_matches_the_reference(case, dtype):
    path, xs, ws, attrs = case
    x, w, b = conv_arrays(xs, ws, dtype)
    if path == conv._SKINNY and dtype == np.float64:  # float32 only: BLAS takes float64
        assert _path(x, w, attrs) != path
    else:
        assert _path(x, w, attrs) == path
    for act, bias in zip(ACTIVATIONS, (b, None, b, None, b, None)):
        got, want = _run(x, w, bias, act, attrs)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, **_tol(path, dtype))


@pytest.mark.parametrize("case", CASES, ids=[f"{p}-{i}" for i, (p, *_) in enumerate(CASES)])
def test_out_is_filled_and_returned(case):
    _, xs, ws, attrs = case
    x, w, b = conv_arrays(xs, ws, np.float32, seed=1)
    for act in ("", "Relu"):
        want = _run(x, w, b, act, attrs)[1]
        out = np.full(want.shape, np.nan, np.float32)
        got, _ = _run(x, w, b, act, attrs, out=out)
        assert got is out
        np.testing.assert_allclose(out, want, **_tol(case[0], np.float32))


@pytest.fixture
def small_chunks(monkeypatch):
    """Column budget of a few KB: every batch is split into chunks of one or two images."""
    monkeypatch.setattr(conv, "_COLS_BUDGET", 3000)
    conv._plan.cache_clear()
    conv._PLANS.clear()
    yield
    conv._plan.cache_clear()
    conv._PLANS.clear()


@pytest.mark.parametrize("xs, ws, attrs", [
    ((5, 3, 6, 6), (4, 3, 3, 3), dict(pads=(1, 1, 1, 1))),  # one GEMM per chunk
    ((3, 2, 13, 12), (4, 2, 3, 3), dict(pads=(1, 1, 1, 1))),  # one GEMM per image
    ((5, 4, 5, 5), (6, 2, 3, 3), dict(group=2, strides=(2, 1), pads=(1, 1, 1, 1))),
    ((4, 2, 4, 4), (40, 2, 1, 1), dict(strides=(2, 2))),  # chunks bounded by the GEMM result
])
def test_chunks_forward_and_gradients(xs, ws, attrs, small_chunks):
    x, w, b = conv_arrays(xs, ws, np.float64, seed=2)
    assert conv._plan(x.shape, w.shape, 8, None, conv._key(attrs.get("strides")),
                      conv._key(attrs.get("pads")), None, "NOTSET", attrs.get("group", 1))[-1] < \
        xs[0]
    got, want = _run(x, w, b, "Relu", attrs)
    np.testing.assert_allclose(got, want, **TOL[np.float64])
    dy = np.random.default_rng(3).standard_normal(want.shape)
    for op, fn in (("ConvInputGrad", conv.conv_input_grad),
                   ("ConvWeightGrad", conv.conv_weight_grad)):
        np.testing.assert_allclose(fn(x, w, dy, **attrs), OPS[op].kernel(x, w, dy, **attrs),
                                   **TOL[np.float64])


@pytest.fixture
def small_bands(monkeypatch, serial):  # bands are built on one thread only
    """Bands of a few output rows (about 700 bytes of columns), for any size of columns."""
    monkeypatch.setattr(conv, "_BAND_MIN_COLUMNS", 0)
    monkeypatch.setattr(conv, "_BAND_BYTES", 700)
    monkeypatch.setattr(conv, "_SMALL_MAX_WORK_STRIDED", -1)


BANDS = [  # (X shape, W shape, attrs): the last band shorter than the others in most
    ((1, 3, 12, 11), (5, 3, 3, 3), dict(pads=(1, 1, 1, 1))),
    ((2, 2, 30, 40), (4, 2, 3, 2), dict(strides=(2, 3), pads=(2, 1, 1, 0), dilations=(2, 1))),
    ((1, 2, 21, 21), (3, 2, 7, 7), dict(strides=(2, 2), pads=(3, 3, 3, 3))),
    ((1, 1, 9, 30), (2, 1, 5, 1), dict(pads=(0, 0, 4, 0))),  # bands wholly in the padding
    ((2, 4, 12, 12), (6, 4, 2, 2), {}),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("xs, ws, attrs", BANDS)
def test_bands_of_output_rows_match_the_reference(xs, ws, attrs, dtype, small_bands):
    x, w, b = conv_arrays(xs, ws, dtype, seed=9)
    want = OPS["Conv"].kernel(x, w, b, **attrs)
    rows = ws[1] * ws[2] * ws[3]
    band = conv._band_rows(ws[0], rows, want.shape[2] * want.shape[3], want.shape[3], 1,
                           x.itemsize)
    assert _path(x, w, attrs) == conv._BY_IMAGE and 0 < band < want.shape[2]
    for act, bias in zip(ACTIVATIONS, (b, None, b, None, b, None)):
        got, want = _run(x, w, bias, act, attrs)
        np.testing.assert_allclose(got, want, **TOL[dtype])
        out = np.full(want.shape, np.nan, dtype)
        assert _run(x, w, bias, act, attrs, out=out)[0] is out
        np.testing.assert_allclose(out, want, **TOL[dtype])


def test_bands_with_the_default_sizes(serial):
    """A plane whose columns pass the default threshold (8 MiB for 1x16x120x120, 3x3) goes by
    bands on one thread and matches the reference; wide outputs never do."""
    x, w, b = conv_arrays((1, 16, 120, 120), (24, 16, 3, 3), np.float32, seed=10)
    attrs = dict(pads=(1, 1, 1, 1))
    assert 0 < conv._band_rows(24, 144, 14400, 120, 1, 4) < 120
    assert conv._band_rows(conv._BAND_MAX_OUT + 1, 144, 14400, 120, 1, 4) == 0
    got, want = _run(x, w, b, "Relu", attrs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_cached_chunks_on_one_thread(dtype, serial, monkeypatch):
    """On one thread a batch whose columns have many rows goes by one GEMM per chunk of
    images (about 1 MiB of columns; here a few KB, so chunks of two and a last of one):
    forward and both gradients match the reference. On more threads the plan is unchanged."""
    x, w, b = conv_arrays((5, 32, 9, 9), (7, 32, 3, 3), dtype, seed=11)
    monkeypatch.setattr(conv, "_CACHED_CHUNK_BYTES", 2 * 288 * 81 * x.itemsize)  # two images
    conv._plan.cache_clear()
    conv._PLANS.clear()
    attrs = dict(pads=(1, 1, 1, 1))
    plan = conv._plan(x.shape, w.shape, x.itemsize, None, None, (1, 1, 1, 1), None, "NOTSET", 1,
                      True)
    assert plan[0] == conv._ONE_GEMM and plan[-1] == 2
    assert conv._plan(x.shape, w.shape, x.itemsize, None, None, (1, 1, 1, 1), None, "NOTSET",
                      1, False)[0] == conv._BY_IMAGE
    got, want = _run(x, w, b, "Relu", attrs)
    np.testing.assert_allclose(got, want, **TOL[dtype])
    dy = np.random.default_rng(12).standard_normal(want.shape).astype(dtype)
    for op, fn in (("ConvInputGrad", conv.conv_input_grad),
                   ("ConvWeightGrad", conv.conv_weight_grad)):
        np.testing.assert_allclose(fn(x, w, dy, **attrs), OPS[op].kernel(x, w, dy, **attrs),
                                   **TOL[dtype])
    conv._plan.cache_clear()
    conv._PLANS.clear()


def test_no_bands_on_more_threads(parallel_variants):
    """With parallel kernels the whole image is one GEMM (bands would fork and join each
    step); the result is the same."""
    assert conv._band_rows(24, 144, 14400, 120, 1, 4) == 0
    x, w, b = conv_arrays((1, 16, 120, 120), (24, 16, 3, 3), np.float32, seed=10)
    got, want = _run(x, w, b, "Relu", dict(pads=(1, 1, 1, 1)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


_NAN_PATHS = {"table": conv._DW_TABLE, "taps": conv._DW_TAPS, "plane": conv._DW,
              "direct": conv._DIRECT, "one-gemm": conv._ONE_GEMM, "by-image": conv._BY_IMAGE,
              "nhwc": conv._DW_NHWC, "skinny": conv._SKINNY}


@pytest.mark.parametrize("case", [next(c for c in CASES if c[0] == p) for p in _NAN_PATHS.values()],
                         ids=list(_NAN_PATHS))
def test_relu_keeps_nan_and_infinities_like_the_reference(case):
    _, xs, ws, attrs = case
    x, w, b = conv_arrays(xs, ws, np.float32, seed=4)
    x[0, 0, 0, 0] = np.nan
    x[-1, -1, -1, -1] = np.inf
    x[-1, 0, -1, 0] = -np.inf
    with np.errstate(invalid="ignore"):
        got, want = _run(x, w, b, "Relu", attrs)
    assert np.isnan(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, **TOL[np.float32])


def test_the_plan_is_made_once_per_signature():
    """Attributes as lists or tuples: the same plan, worked out once."""
    x, w, b = conv_arrays((2, 4, 6, 7), (5, 4, 3, 3), np.float32)
    conv.conv(x, w, b, pads=[1, 1, 1, 1], strides=[1, 2])
    misses = conv._plan.cache_info().misses
    conv.fused_conv(x, w, b, pads=(1, 1, 1, 1), strides=(1, 2), activation="Tanh")
    conv.conv(x, w, b, pads=(1, 1, 1, 1), strides=(1, 2))
    conv.conv(x, w, b, pads=[1, 1, 1, 1], strides=[1, 2])
    assert conv._plan.cache_info().misses == misses


@pytest.mark.parametrize("xs, ws, attrs", [
    ((2, 5, 9, 8), (5, 1, 3, 3), dict(group=5, pads=(1, 1, 1, 1))),
    ((3, 4, 11, 10), (8, 1, 5, 3), dict(group=4, strides=(2, 3), pads=(2, 1, 0, 1),
                                        dilations=(1, 2))),
    ((2, 6, 4, 4), (6, 1, 5, 5), dict(group=6, pads=(4, 4, 4, 4), dilations=(2, 2))),
    ((1, 3, 7, 7), (3, 1, 3, 3), dict(group=3, auto_pad="SAME_LOWER", strides=(2, 2))),
    ((0, 3, 5, 5), (3, 1, 3, 3), dict(group=3)),
    ((1, 2, 17, 16), (2, 1, 3, 3), dict(group=2, pads=(1, 1, 1, 1))),  # dW by columns
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_depthwise_gradients_match_the_reference(xs, ws, attrs, dtype):
    """The tap-table gradients of depthwise convolutions (a channel multiplier, strides,
    dilation, padding that swallows most taps, an empty batch)."""
    x, w, _ = conv_arrays(xs, ws, dtype, seed=5)
    assert conv._depthwise_grad(x, attrs["group"], 1, 1, ws[2:])
    dy = np.random.default_rng(6).standard_normal(
        OPS["Conv"].kernel(x, w, **attrs).shape).astype(dtype)
    for op, fn in (("ConvInputGrad", conv.conv_input_grad),
                   ("ConvWeightGrad", conv.conv_weight_grad)):
        got, want = fn(x, w, dy, **attrs), OPS[op].kernel(x, w, dy, **attrs)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, **TOL[dtype])


@pytest.mark.parametrize("case", CASES, ids=[f"{p}-{i}" for i, (p, *_) in enumerate(CASES)])
def test_parallel_variants_match_the_reference(case, parallel_variants):
    path, xs, ws, attrs = case
    x, w, b = conv_arrays(xs, ws, np.float32, seed=7)
    got, want = _run(x, w, b, "Relu", attrs)
    np.testing.assert_allclose(got, want, **_tol(path, np.float32))
    if path <= conv._DW:
        dy = np.random.default_rng(8).standard_normal(want.shape).astype(np.float32)
        for op, fn in (("ConvInputGrad", conv.conv_input_grad),
                       ("ConvWeightGrad", conv.conv_weight_grad)):
            np.testing.assert_allclose(fn(x, w, dy, **attrs), OPS[op].kernel(x, w, dy, **attrs),
                                       rtol=1e-4, atol=1e-4)


CONV1D = [
    ((2, 80, 16), (32, 80, 3), dict(pads=(1, 1))),  # Whisper's first convolution
    ((2, 32, 16), (32, 32, 3), dict(pads=(1, 1), strides=(2,))),  # and its second
    ((3, 6, 11), (6, 1, 5), dict(group=6, pads=(2, 1), dilations=(2,))),  # depthwise
    ((1, 4, 9), (5, 4, 1), {}),
    ((2, 4, 9), (6, 2, 3), dict(group=2, auto_pad="SAME_UPPER")),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs, ws, attrs", CONV1D)
def test_conv1d_runs_as_2d_and_matches_the_reference(xs, ws, attrs, dtype):
    x, w, b = conv_arrays(xs, ws, dtype)
    want = OPS["Conv"].kernel(x, w, b, **attrs)
    got = conv.conv(x, w, b, **attrs)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, **TOL[dtype])
    out = np.full(want.shape, np.nan, dtype)
    assert conv.fused_conv(x, w, b, activation="Relu", out=out, **attrs) is out
    np.testing.assert_allclose(out, np.maximum(want, 0), **TOL[dtype])


@pytest.mark.parametrize("case", CASES, ids=[f"{p}-{i}" for i, (p, *_) in enumerate(CASES)])
def test_gradients_of_each_path_match_the_reference(case):
    """The gradients follow the forward's path choice (per image for long rows, one GEMM
    over the batch for short ones): each against the reference kernels."""
    _, xs, ws, attrs = case
    x, w, _ = conv_arrays(xs, ws, np.float64, seed=11)
    want = OPS["Conv"].kernel(x, w, **attrs)
    dy = np.random.default_rng(12).standard_normal(want.shape)
    for op, fn in (("ConvInputGrad", conv.conv_input_grad),
                   ("ConvWeightGrad", conv.conv_weight_grad)):
        np.testing.assert_allclose(fn(x, w, dy, **attrs), OPS[op].kernel(x, w, dy, **attrs),
                                   **TOL[np.float64])


def _phases_by_definition(xf, xb, h, w, sh, sw, ph, pw, hq, wq, buf):
    """Input (iy, ix) is padded (iy + ph, ix + pw): phase (row % sh, column % sw), position
    (row // sh, column // sw) in it, dropped past the phase's end."""
    for iy in range(h):
        for ix in range(w):
            row, col = iy + ph, ix + pw
            if row // sh < hq and col // sw < wq:
                at = ((row % sh) * sw + col % sw) * hq * wq + (row // sh) * wq + col // sw
                buf[at] = xf[xb + iy * w + ix]


@pytest.mark.parametrize("sw", [1, 2, 3])
def test_phases_are_the_padded_plane_split_by_the_stride(sw):
    """conv._into_phases (the strided depthwise kernels' and _im2col_phased's plane copy; at a
    column stride of 2 it has a vectorized loop of its own) against its definition: odd and
    even sizes, begin pads past a stride, phases shorter than the plane (dropped rows and
    columns) and longer (their zeros kept)."""
    rng = np.random.default_rng(sw)
    cases = 0
    for h, w in [(1, 1), (1, 6), (5, 1), (4, 7), (7, 4), (6, 6), (9, 13), (32, 31)]:
        for sh in (1, 2, 3):
            for ph, pw in [(0, 0), (1, 1), (2, 3), (3, 2), (0, 4)]:
                for dq in (-1, 0, 2):
                    hq = max(1, (h + ph + sh - 1) // sh + dq)
                    wq = max(1, (w + pw + sw - 1) // sw + dq)
                    xf = rng.standard_normal(h * w + 3).astype(np.float32)
                    got = np.zeros(sh * sw * hq * wq, np.float32)
                    want = got.copy()
                    conv._into_phases(xf, 3, h, w, sh, sw, ph, pw, hq, wq, got)
                    _phases_by_definition(xf, 3, h, w, sh, sw, ph, pw, hq, wq, want)
                    np.testing.assert_array_equal(got, want)
                    cases += 1
    assert cases == 8 * 3 * 5 * 3


def test_the_whole_plane_kernel_gives_the_padded_plane_kernels_values():
    """depthwise.flat_kernel (stride 1, the output the input's size) against the written-out
    padded-plane kernel on the same arguments: the same values everywhere (NaN where it has
    NaN), for windows of 1 to 49 taps, every begin pad, planes from 1x1 up, a channel
    multiplier, NaN and infinities in the input and an infinite weight (whose product with the
    padding is NaN in both)."""
    from onemodel.numba import depthwise

    rng = np.random.default_rng(11)
    cases = 0
    for kh, kw in [(3, 3), (5, 5), (7, 7), (1, 3), (2, 2), (3, 5)]:
        for ph in range(kh):
            for pw in range(kw):
                for h, w in [(1, 1), (2, 3), (5, 7), (8, 8)]:
                    x = rng.standard_normal((2, 3, h, w)).astype(np.float32)
                    x[0, 0, 0, 0] = np.nan
                    x[1, 2, h - 1, w - 1] = np.inf
                    wt = rng.standard_normal((6, 1, kh, kw)).astype(np.float32)
                    wt[1, 0, 0, 0] = np.inf
                    b = rng.standard_normal(6).astype(np.float32)
                    want = np.empty((2, 6, h, w), np.float32)
                    got = np.empty_like(want)
                    depthwise.kernel(kh, kw).serial(x, wt, 2, 1, 1, ph, pw, 1, 1, b, True, 5,
                                                    want)
                    depthwise.flat_kernel(kh, kw, pw).serial(
                        x, wt, 2, ph, depthwise.column_flags(h, w, kw, pw), b, True, 5, got)
                    np.testing.assert_array_equal(got, want)
                    cases += 1
    assert cases == 4 * (9 + 25 + 49 + 3 + 4 + 15)


@pytest.mark.parametrize("path,xshape,wshape,attrs", [
    case for case in CASES if case[0] in (conv._DW_NHWC, conv._DW_TABLE) and case[1][0] > 0])
def test_a_weight_that_is_not_finite_meets_the_padding_as_in_the_reference(path, xshape,
                                                                            wshape, attrs):
    """The channels-last and tap-table kernels visit only the taps inside the image. An
    infinite or NaN weight times the padding's zero is NaN in the reference (and PyTorch), so
    weights with one take a kernel that reads the padding: generic calls, planned calls with
    a file's weights, and planned calls whose weights became infinite in place after
    planning."""
    from onemodel.tensors.ops.specialize import CallSite, specialize

    rng = np.random.default_rng(5)
    x = rng.standard_normal(xshape).astype(np.float32)
    assert _path(x, np.zeros(wshape, np.float32), attrs) == path
    for bad in (np.inf, -np.inf, np.nan):
        w = rng.standard_normal(wshape).astype(np.float32)
        w[1, 0, 0, 0] = bad
        want = OPS["Conv"].kernel(x, w, **attrs)
        assert np.isnan(want).any()
        np.testing.assert_allclose(conv.conv(x, w, **attrs), want, rtol=2e-5, atol=2e-5)
        file_w = np.frombuffer(w.tobytes(), np.float32).reshape(w.shape)
        writable = rng.standard_normal(wshape).astype(np.float32)
        for weights in (file_w, writable):
            site = CallSite((x.shape, weights.shape), (x.dtype, weights.dtype),
                            (None, weights), dict(attrs), (want.shape,),
                            lambda X, W, B=None, out=None: conv.conv(X, W, B, out=out, **attrs))
            call = specialize(conv.conv, site)
            if weights is writable:
                call(x, weights)  # planned and run with finite weights, then updated in place
                weights[...] = w
            np.testing.assert_allclose(call(x, weights), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("pads", [(1, 3, 1, -1), (1, -1, 1, 3), (-1, 1, 3, 1)])
def test_negative_pads_are_refused_by_every_path(pads):
    """Pads adding up to the window's size less one keep the output the input's size even
    when one is negative; the kernels index the padded input, so a negative pad (which ONNX
    does not define) is a ShapeError that names it, from the numba kernel and the reference
    alike, never a read outside the input."""
    from onemodel.tensors.errors import ShapeError

    x = np.random.default_rng(3).standard_normal((1, 4, 10, 10)).astype(np.float32)
    w = np.random.default_rng(4).standard_normal((4, 1, 3, 3)).astype(np.float32)
    for kernel in (conv.conv, OPS["Conv"].kernel):
        with pytest.raises(ShapeError, match="pads must be non-negative"):
            kernel(x, w, group=4, pads=pads)
