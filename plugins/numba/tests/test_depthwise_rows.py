"""Depthwise 3x3 convolutions on sixteen-lane rows (onemodel.numba.depthwise_rows), at
strides 1 and 2, against PyTorch and the reference kernel: output rows of 10 to 40 pixels (one
vector and a remainder, two vectors), plane heights that leave groups of eight rows short,
begin pads of 0 and 1 with other end pads, no bias, each activation the plan passes, NaN and
infinities in the input, an infinite weight (times the padding's zeros: NaN there, as in the
reference), and the planned call taking the rows where the CPU has AVX-512. The kernels run on
every x86 CPU (LLVM splits their vectors where AVX-512 is missing)."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

from onemodel.numba import conv, depthwise_rows
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.specialize import CallSite, specialize

# (input shape, pads (top, left, bottom, right))
CASES = [
    ((2, 16, 32, 32), (1, 1, 1, 1)),  # MNASNet's first depthwise convolution
    ((2, 48, 16, 16), (1, 1, 1, 1)),
    ((1, 5, 14, 14), (1, 1, 1, 1)),
    ((2, 3, 19, 23), (1, 1, 1, 1)),  # rows of 23: a vector and a remainder; 19 rows
    ((1, 4, 12, 18), (0, 0, 0, 0)),  # no padding: 10 x 16 outputs
    ((1, 3, 9, 30), (1, 0, 0, 1)),  # begin and end pads apart
    ((2, 2, 33, 33), (0, 1, 1, 0)),
]
IDS = [f"{xs}-{p}" for xs, p in CASES]
# at stride 2: (input shape, pads)
STRIDED = [
    ((2, 24, 32, 32), (1, 1, 1, 1)),  # MNASNet's: 16x16 outputs
    ((2, 16, 31, 31), (0, 0, 0, 0)),  # 15x15
    ((1, 3, 29, 33), (1, 0, 0, 1)),  # 15x17: a second vector of one pixel
    ((1, 2, 20, 80), (1, 1, 1, 1)),  # 10x40: three vectors a row
    ((2, 5, 37, 28), (0, 1, 1, 0)),  # 19 rows: two groups of eight and a short one
    ((1, 2, 34, 50), (0, 0, 0, 0)),  # the last row and column read by no output
]


def _torch(x, w, b, pads, act, stride=1):
    t = torch.nn.functional.pad(torch.from_numpy(x), (pads[1], pads[3], pads[0], pads[2]))
    y = torch.nn.functional.conv2d(t, torch.from_numpy(w), None if b is None else
                                   torch.from_numpy(b), stride=stride, groups=x.shape[1])
    return (torch.relu(y) if act == "Relu" else y).numpy()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("xs, pads", STRIDED, ids=[f"{xs}-{p}" for xs, p in STRIDED])
def test_strided_rows_equal_torch_and_the_reference(xs, pads, bias):
    rng = np.random.default_rng(sum(xs) + 1)
    x = rng.standard_normal(xs).astype(np.float32)
    x[0, 0, 3, 5] = np.nan
    x[-1, -1, -1, -1] = np.inf  # read by the last output or by none
    w = rng.standard_normal((xs[1], 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(xs[1]).astype(np.float32) if bias else None
    with np.errstate(invalid="ignore"):
        ref = OPS["Conv"].kernel(x, w, b, group=xs[1], pads=pads, strides=(2, 2))
        for act, code in (("", 0), ("Relu", 1)):
            want = _torch(x, w, b, pads, act, stride=2)
            y = np.full(want.shape, -7.0, np.float32)
            depthwise_rows.rows2(x, w, conv._NO_BIAS[np.dtype(np.float32)] if b is None else b,
                                 b is not None, pads[0], pads[1], code, y)
            np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
            if not act:
                np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("xs, pads", CASES, ids=IDS)
def test_rows_equal_torch_and_the_reference(xs, pads, bias):
    rng = np.random.default_rng(sum(xs))
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal((xs[1], 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(xs[1]).astype(np.float32) if bias else None
    ref = OPS["Conv"].kernel(x, w, b, group=xs[1], pads=pads)
    for act, code in (("", 0), ("Relu", 1)):
        want = _torch(x, w, b, pads, act)
        y = np.full(want.shape, np.nan, np.float32)
        depthwise_rows.rows(x, w, conv._NO_BIAS[np.dtype(np.float32)] if b is None else b,
                                  b is not None, pads[0], pads[1], code, y)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
        if not act:
            np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_nan_and_infinities_reach_what_they_reach_in_the_reference():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 3, 16, 20)).astype(np.float32)
    x[0, 0, 5, 7] = np.nan
    x[0, 1, 0, 19] = np.inf
    w = rng.standard_normal((3, 1, 3, 3)).astype(np.float32)
    w[2, 0, 0, 0] = np.inf  # times the top and left padding's zeros: NaN on that border
    b = rng.standard_normal(3).astype(np.float32)
    y = np.empty((1, 3, 16, 20), np.float32)
    with np.errstate(invalid="ignore"):
        depthwise_rows.rows(x, w, b, True, 1, 1, 0, y)
        want = OPS["Conv"].kernel(x, w, b, group=3, pads=(1, 1, 1, 1))
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(y[finite], want[finite], rtol=1e-5, atol=1e-5)
    assert np.isnan(y[0, 2, 0, :]).all() and np.isnan(y[0, 0, 4:7, 6:9]).all()


def _planned(xs, pads, w, b, stride=1):
    attrs = dict(group=xs[1], pads=pads, kernel_shape=(3, 3), strides=(stride, stride),
                 dilations=(1, 1), activation="Relu")
    generic = partial(conv.fused_conv, **attrs)
    out = generic(np.zeros(xs, np.float32), w, b).shape
    site = CallSite((xs, w.shape, b.shape), (np.dtype(np.float32),) * 3, (None, w, b), attrs,
                    (out,), generic)
    return specialize(conv.fused_conv, site)


def _kernel_of(call):
    cells = {n: c.cell_contents for n, c in zip(call.__code__.co_freevars,
                                                  call.__closure__ or ())}
    return cells.get("kernel")


def _reaches_rows(call) -> bool:
    return _kernel_of(call) is depthwise_rows.rows


@pytest.mark.parametrize("xs, pads", [CASES[1], CASES[3], ((2, 16, 8, 8), (1, 1, 1, 1)),
                                      ((1, 8, 56, 56), (1, 1, 1, 1))])
def test_planned_calls_take_the_rows_on_avx512_over_14_to_32_pixel_rows(xs, pads, serial):
    rng = np.random.default_rng(3)
    # a file's constants: read-only views of immutable bytes
    w = np.frombuffer(rng.standard_normal((xs[1], 1, 3, 3)).astype(np.float32).tobytes(),
                      np.float32).reshape(xs[1], 1, 3, 3)
    b = np.frombuffer(rng.standard_normal(xs[1]).astype(np.float32).tobytes(), np.float32)
    call = _planned(xs, pads, w, b)
    ow = xs[3] + pads[1] + pads[3] - 2
    assert _reaches_rows(call) == (depthwise_rows.MIN_WIDTH <= ow <= depthwise_rows.MAX_WIDTH
                                   and depthwise_rows.host_has_avx512())
    x = rng.standard_normal(xs).astype(np.float32)
    want = _torch(x, w.copy(), b.copy(), pads, "Relu")
    np.testing.assert_allclose(call(x, w, b), want, rtol=1e-5, atol=1e-5)
    out = np.full(want.shape, np.nan, np.float32)
    assert call(x, w, b, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("xs, pads, taken", [(STRIDED[0][0], STRIDED[0][1], True),
                                               ((2, 16, 16, 16), (1, 1, 1, 1), False),
                                               ((1, 8, 56, 56), (1, 1, 1, 1), False)])
def test_planned_strided_calls_take_the_rows_on_avx512_over_16_pixel_rows(xs, pads, taken,
                                                                          serial):
    rng = np.random.default_rng(4)
    w = np.frombuffer(rng.standard_normal((xs[1], 1, 3, 3)).astype(np.float32).tobytes(),
                      np.float32).reshape(xs[1], 1, 3, 3)
    b = np.frombuffer(rng.standard_normal(xs[1]).astype(np.float32).tobytes(), np.float32)
    call = _planned(xs, pads, w, b, stride=2)
    assert (_kernel_of(call) is depthwise_rows.rows2) == (taken and
                                                          depthwise_rows.host_has_avx512())
    x = rng.standard_normal(xs).astype(np.float32)
    np.testing.assert_allclose(call(x, w, b), _torch(x, w.copy(), b.copy(), pads, "Relu", 2),
                               rtol=1e-5, atol=1e-5)


def test_the_kernel_is_chosen_for_float32_3x3_windows_on_avx512(monkeypatch):
    monkeypatch.setattr(depthwise_rows, "host_has_avx512", lambda: True)

    def choice(ow=16, k=(3, 3), s=(1, 1), d=(1, 1), pb=(1, 1), m=8, dtype=np.float32):
        return depthwise_rows.kernel((None, (2, m, 16, ow), s, pb, d, k, None),
                                     (2, 8, 16, 16), dtype, 8)
    rows = depthwise_rows.rows
    assert choice() is rows and choice(ow=32) is rows and choice(ow=14) is rows
    assert choice(ow=13) is None and choice(ow=33) is None
    assert choice(s=(2, 2)) is depthwise_rows.rows2 and choice(s=(2, 2), ow=14) is \
        depthwise_rows.rows2
    assert choice(s=(2, 2), ow=8) is None and choice(s=(2, 2), ow=28) is None
    assert choice(s=(2, 1)) is None and choice(s=(3, 3)) is None
    assert choice(dtype=np.float64) is None
    assert choice(k=(5, 5)) is None
    assert choice(d=(2, 2)) is None
    assert choice(pb=(3, 1)) is None
    assert choice(m=16) is None  # a channel multiplier
    monkeypatch.setattr(depthwise_rows, "host_has_avx512", lambda: False)
    assert choice() is None and choice(s=(2, 2)) is None
