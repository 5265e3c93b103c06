"""Convolutions of a few input channels on sixteen-lane output rows (onemodel.numba.conv_rows)
against PyTorch and the reference kernel: one to four input channels, 1x1 to 7x7 windows,
strides 1 and 2 (and 3 along the rows), begin and end pads apart, output rows of 1 to 70
pixels (one vector, two, a remainder past 32), output channel counts that leave a block of
eight short, no bias, each activation the plan passes (Relu in registers, the others over the
stored row), NaN and infinities; the planned call taking the rows for a network's stem where
the CPU has AVX-512, also where the plan would make one small-convolution call. The kernels
run on every x86 CPU (LLVM splits their vectors where AVX-512 is missing)."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

from onemodel.numba import conv, conv_rows
from onemodel.tensors.errors import DTypeError
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.specialize import CallSite, specialize

# (input shape, output channels, window, strides, pads (top, left, bottom, right))
CASES = [
    ((2, 3, 64, 64), 64, 3, (2, 2), (0, 0, 0, 0)),  # SqueezeNet's stem: 31x31
    ((2, 3, 64, 64), 16, 3, (2, 2), (1, 1, 1, 1)),  # MNASNet's: 32x32
    ((2, 3, 64, 64), 20, 7, (2, 2), (3, 3, 3, 3)),  # a 7x7 stem, 20 outputs: 8 + 8 + 4
    ((1, 1, 28, 28), 7, 3, (1, 1), (1, 1, 1, 1)),  # one channel in, seven out
    ((3, 4, 9, 70), 9, 3, (1, 1), (0, 2, 1, 0)),  # rows of 70: 32 + 32 + 6
    ((1, 2, 11, 35), 8, 5, (2, 2), (2, 1, 0, 2)),  # 17 pixels: a vector and one
    ((2, 3, 20, 33), 5, 3, (3, 2), (1, 1, 1, 1)),  # row stride 3
    ((1, 3, 6, 7), 12, 1, (1, 2), (0, 0, 0, 0)),  # 1x1 at column stride 2: 4 pixels
    ((1, 3, 16, 33), 8, 2, (2, 1), (0, 0, 0, 0)),  # 32 pixels exactly
]
IDS = [f"{c[0]}-{c[1]}-k{c[2]}-s{c[3]}-p{c[4]}" for c in CASES]
ACTIVATIONS = {"": 0, "Relu": 1, "HardSwish": 4, "Sigmoid": 2, "Relu6": 5}


def _torch(x, w, b, strides, pads):
    t = torch.nn.functional.pad(torch.from_numpy(x), (pads[1], pads[3], pads[0], pads[2]))
    return torch.nn.functional.conv2d(t, torch.from_numpy(w), None if b is None else
                                      torch.from_numpy(b), stride=strides)


def _plan(xs, m, k, strides, pads):
    return conv._plan(xs, (m, xs[1], k, k), 4, (k, k), strides, pads, (1, 1), "NOTSET", 1,
                      True)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("xs, m, k, strides, pads", CASES, ids=IDS)
def test_rows_equal_torch_and_the_reference(xs, m, k, strides, pads, bias):
    rng = np.random.default_rng(sum(xs) + m)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal((m, xs[1], k, k)) / k).astype(np.float32)
    # a bias of 4 or so: Relu6 clips at both ends
    b = (rng.standard_normal(m) * 4).astype(np.float32) if bias else None
    plan = _plan(xs, m, k, strides, pads)
    rows = conv_rows.ConvRows(w, plan, xs)
    pre = _torch(x, w, b, strides, pads)
    for act, code in ACTIVATIONS.items():
        want = OPS["FusedConv"].kernel(x, w, b, activation=act, strides=strides,
                                       pads=pads) if act else OPS["Conv"].kernel(
                                           x, w, b, strides=strides, pads=pads)
        y = np.full(want.shape, np.nan, np.float32)
        assert rows.run(x, conv._NO_BIAS[np.dtype(np.float32)] if b is None else b,
                        b is not None, code, plan, y) is y
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
        if act in ("", "Relu"):
            torch_want = pre.numpy() if act == "" else torch.relu(pre).numpy()
            np.testing.assert_allclose(y, torch_want, rtol=1e-5, atol=1e-5)


def test_nan_and_infinities_reach_what_they_reach_in_the_reference():
    rng = np.random.default_rng(5)
    xs, m, k, strides, pads = (2, 3, 20, 36), 10, 3, (2, 2), (1, 1, 1, 1)
    x = rng.standard_normal(xs).astype(np.float32)
    x[0, 0, 5, 7] = np.nan
    x[1, 2, 0, 35] = np.inf  # the last column: read by the row's last output
    x[1, 1, 19, 0] = -np.inf
    w = rng.standard_normal((m, 3, k, k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    plan = _plan(xs, m, k, strides, pads)
    with np.errstate(invalid="ignore", over="ignore"):
        for act, code in (("", 0), ("Relu", 1)):
            y = np.empty(plan[1], np.float32)
            conv_rows.ConvRows(w, plan, xs).run(x, b, True, code, plan, y)
            want = OPS["FusedConv"].kernel(x, w, b, activation=act, strides=strides,
                                           pads=pads) if act else OPS["Conv"].kernel(
                                               x, w, b, strides=strides, pads=pads)
            np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
            np.testing.assert_array_equal(np.isinf(y), np.isinf(want))
            finite = np.isfinite(want)
            np.testing.assert_allclose(y[finite], want[finite], rtol=1e-5, atol=1e-5)
            assert np.isnan(y[0, :, 2:4, 3:5]).all() and np.isinf(y[1]).any()


def test_phase_planes_hold_the_bordered_input():
    """Row r, phase f, column q of the planes is the bordered input's (r, q * stride + f),
    zero in the border and past the input's end (what the loads of a row's last 32 pixels
    read)."""
    rng = np.random.default_rng(9)
    for xs, strides, pads in (((2, 3, 7, 37), (1, 1), (2, 3)), ((1, 2, 5, 70), (2, 2), (1, 2)),
                              ((1, 1, 4, 33), (2, 2), (0, 0)),
                              ((1, 2, 3, 62), (2, 2), (1, 1))):  # 31 columns from a read on
        x = rng.standard_normal(xs).astype(np.float32)
        plan = _plan(xs, 8, 3, strides, pads + pads)
        hp, wph = conv_rows._phase_shape(xs, plan)
        sw = strides[1]
        got = conv_rows._phases(x, pads[0], pads[1], sw, hp, wph).reshape(
            xs[0], xs[1], hp, sw, wph)
        bordered = np.zeros(xs[:2] + (hp, sw * wph), np.float32)
        bordered[:, :, pads[0]:pads[0] + xs[2], pads[1]:pads[1] + xs[3]] = x
        for f in range(sw):
            np.testing.assert_array_equal(got[:, :, :, f], bordered[..., f::sw])


def _planned(xs, m, k, strides, pads, w, b, act="Relu"):
    attrs = dict(group=1, pads=pads, kernel_shape=(k, k), strides=strides, dilations=(1, 1),
                 activation=act)
    generic = partial(conv.fused_conv, **attrs)
    out = generic(np.zeros(xs, np.float32), w, b).shape
    site = CallSite((xs, w.shape, b.shape), (np.dtype(np.float32),) * 3, (None, w, b), attrs,
                    (out,), generic)
    return specialize(conv.fused_conv, site)


def _takes_rows(call) -> bool:
    cells = {n: c.cell_contents for n, c in zip(call.__code__.co_freevars,
                                                  call.__closure__ or ())}
    return isinstance(cells.get("w_prepared"), conv_rows.ConvRows)


def _constants(rng, *shape, scale=1.0):
    """A file's constants: read-only views of immutable bytes."""
    return np.frombuffer((rng.standard_normal(shape) * scale).astype(np.float32).tobytes(),
                         np.float32).reshape(shape)


@pytest.mark.parametrize("xs, m, k, strides, pads", [
    ((2, 3, 64, 64), 64, 3, (2, 2), (0, 0, 0, 0)),
    ((2, 3, 64, 64), 16, 3, (2, 2), (1, 1, 1, 1)),
    ((2, 3, 64, 64), 64, 7, (2, 2), (3, 3, 3, 3)),
    ((2, 3, 32, 32), 32, 3, (2, 2), (1, 1, 1, 1)),  # a plan of one small-convolution call
    ((8, 3, 16, 16), 8, 3, (1, 1), (1, 1, 1, 1)),
])
def test_planned_stems_take_the_rows_on_avx512(xs, m, k, strides, pads, serial):
    rng = np.random.default_rng(3)
    w = _constants(rng, m, xs[1], k, k, scale=(xs[1] * k * k) ** -0.5)  # sums of about 1
    b = _constants(rng, m)
    call = _planned(xs, m, k, strides, pads, w, b)
    assert _takes_rows(call) == conv_rows.host_has_avx512()
    x = rng.standard_normal(xs).astype(np.float32)
    want = torch.relu(_torch(x, w.copy(), b.copy(), strides, pads)).numpy()
    np.testing.assert_allclose(call(x, w, b), want, rtol=1e-5, atol=1e-5)
    out = np.full(want.shape, np.nan, np.float32)
    assert call(x, w, b, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_a_call_on_the_same_arrays_reads_their_values_now(serial):
    """The planned call binds its machine code at the first call: the same input and out
    objects again, their values changed in place, give the convolution of what they hold now;
    a strided input is copied each call."""
    rng = np.random.default_rng(8)
    xs, m, k, strides, pads = (2, 3, 20, 20), 16, 3, (2, 2), (1, 1, 1, 1)
    w, b = _constants(rng, m, 3, k, k, scale=0.2), _constants(rng, m)
    call = _planned(xs, m, k, strides, pads, w, b)
    assert _takes_rows(call) == conv_rows.host_has_avx512()
    x = np.empty(xs, np.float32)
    wide = np.empty(xs[:3] + (2 * xs[3],), np.float32)
    out = np.empty((2, m, 10, 10), np.float32)
    for step in range(3):
        x[...] = rng.standard_normal(xs)
        want = torch.relu(_torch(x, w.copy(), b.copy(), strides, pads)).numpy()
        assert call(x, w, b, out=out) is out
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        wide[..., ::2] = x[...] * (step + 2)
        want = torch.relu(_torch(wide[..., ::2].copy(), w.copy(), b.copy(), strides,
                                 pads)).numpy()
        np.testing.assert_allclose(call(wide[..., ::2], w, b), want, rtol=1e-5, atol=1e-5)


def test_an_out_of_another_dtype_is_refused_naming_it(serial):
    """The bound machine code checks only an array's item size: an int32 out= of the right
    shape would take float32 bits, so the call refuses it, naming both dtypes."""
    rng = np.random.default_rng(2)
    xs = (2, 3, 16, 16)
    w, b = _constants(rng, 8, 3, 3, 3), _constants(rng, 8)
    call = _planned(xs, 8, 3, (1, 1), (1, 1, 1, 1), w, b)
    x = rng.standard_normal(xs).astype(np.float32)
    call(x, w, b, out=np.empty((2, 8, 16, 16), np.float32))  # binds the machine code
    out = np.zeros((2, 8, 16, 16), np.int32)
    with pytest.raises(DTypeError, match="int32.*float32"):
        call(x, w, b, out=out)
    assert not out.any()


def test_the_rows_are_chosen_for_few_inputs_and_column_strides_1_and_2(monkeypatch):
    monkeypatch.setattr(conv_rows, "host_has_avx512", lambda: True)

    def fits(c=3, k=3, s=(2, 2), d=(1, 1), pads=(1, 1, 1, 1), group=1, hw=64):
        xs = (2, c * group if group > 1 else c, hw, hw)
        plan = conv._plan(xs, (8 * group, c, k, k), 4, (k, k), s, pads, d, "NOTSET", group,
                          True)
        return conv_rows.fits(plan, xs, (8 * group, c, k, k), group)
    assert fits() and fits(c=1) and fits(c=4) and fits(s=(1, 1)) and fits(s=(3, 2))
    assert fits(k=7, pads=(3, 3, 3, 3)) and fits(k=1, pads=(0, 0, 0, 0))
    assert not fits(c=5)  # the tiles take more input channels
    assert not fits(s=(2, 3)) and not fits(s=(4, 4))  # column strides other than 1 and 2
    assert not fits(d=(2, 2))
    assert not fits(group=2)
    assert not fits(hw=400)  # phase planes past 1 MiB
    monkeypatch.setattr(conv_rows, "host_has_avx512", lambda: False)
    assert not fits()
