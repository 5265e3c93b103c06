"""MaxPool with eight channels in vector lanes (onemodel.numba.pool_lanes) against the reference
kernel and PyTorch: strides 1 and 2, padding, ceil_mode, dilation, rectangular and 5x5
windows, outputs that leave pixels after the tiles of eight, NaN and infinities, a strided
input and a planned ``out``; taken for float32 with a multiple of eight channels over small
planes on one thread, and any other call keeps the NCHW kernels. On AVX-512 CPUs the float32
pools of column stride 2 take ``pool_strided``'s rows instead: here that choice is switched off
to test the lanes on every CPU, and test_pool_strided.py tests it."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

from onemodel.numba import _jit, pool, pool_lanes, pool_strided
from onemodel.numba._simd import host_has_fma
from onemodel.tensors import OneModelError
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.specialize import CallSite, specialize

pytestmark = [pytest.mark.skipif(not host_has_fma(), reason="this CPU has no AVX2/FMA: "
                                "the kernel is never chosen"),
              pytest.mark.usefixtures("serial")]  # the kernels run on one thread only


@pytest.fixture(autouse=True)
def _without_strided_rows(monkeypatch):
    monkeypatch.setattr(pool_strided, "takes", lambda *args: False)


def _site(xs, attrs, dtype=np.float32):
    generic = partial(pool.max_pool, **attrs)
    want_shape = generic(np.zeros(xs, dtype)).shape
    site = CallSite((xs,), (np.dtype(dtype),), (None,), attrs, (want_shape,), generic)
    return specialize(pool.max_pool, site)


def _torch(x, attrs):
    pads = attrs.get("pads", (0, 0, 0, 0))
    assert pads[:2] == pads[2:], "torch pads both sides alike"
    return torch.nn.functional.max_pool2d(
        torch.from_numpy(x), attrs["kernel_shape"], attrs.get("strides", 1), pads[:2],
        attrs.get("dilations", (1, 1)), ceil_mode=bool(attrs.get("ceil_mode", 0))).numpy()


# (input, attributes): SqueezeNet's 3x3/2 ceil_mode pools, ResNet's padded 3x3/2, stride 1,
# a 5x5 window, a rectangular one, dilation, 3x3 outputs (one pixel past the tile of eight)
CASES = [
    ((2, 128, 15, 15), dict(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1)),
    ((2, 16, 7, 7), dict(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1)),
    ((1, 8, 16, 16), dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))),
    ((3, 24, 8, 8), dict(kernel_shape=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1))),
    ((1, 16, 11, 9), dict(kernel_shape=(5, 5), strides=(1, 1), pads=(2, 2, 2, 2))),
    ((2, 8, 12, 10), dict(kernel_shape=(2, 3), strides=(2, 1), pads=(1, 0, 1, 0))),
    ((1, 8, 13, 13), dict(kernel_shape=(3, 3), strides=(2, 2), dilations=(2, 2), pads=(1, 1, 1, 1))),
    ((2, 8, 7, 7), dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), ceil_mode=1)),
]


@pytest.mark.parametrize("xs, attrs", CASES, ids=[f"{xs}-{i}" for i, (xs, _) in
                                                  enumerate(CASES)])
def test_planned_calls_take_the_lanes_and_equal_the_reference_and_torch(xs, attrs):
    call = _site(xs, attrs)
    assert call.__name__ == "max_lanes_at"
    rng = np.random.default_rng(sum(xs))
    x = rng.standard_normal(xs).astype(np.float32)
    x[0, 1, 0, 0] = np.inf
    x[-1, -1, -1, -1] = -np.inf
    x[0, 2, xs[2] // 2, 1] = np.nan
    want = OPS["MaxPool"].kernel(x, **attrs)
    got = call(x)
    np.testing.assert_array_equal(got, want)  # NaN where the reference has it
    finite = np.where(np.isnan(x), 0, x)
    np.testing.assert_array_equal(call(finite), _torch(finite, attrs))
    out = np.full_like(want, 7.0)
    assert call(x, out=out) is out
    np.testing.assert_array_equal(out, want)
    strided = np.repeat(x, 2, axis=3)[..., ::2]
    np.testing.assert_array_equal(call(strided), want)


def test_other_calls_go_to_the_generic_kernel():
    xs, attrs = CASES[0]
    call = _site(xs, attrs)
    x = np.random.default_rng(1).standard_normal(xs).astype(np.float32)
    want = OPS["MaxPool"].kernel(x, **attrs)
    other = np.random.default_rng(2).standard_normal((1, *xs[1:])).astype(np.float32)
    np.testing.assert_array_equal(call(other), OPS["MaxPool"].kernel(other, **attrs))
    locked = np.empty_like(want)
    locked.flags.writeable = False  # the lanes' machine code would write it regardless
    with pytest.raises(OneModelError, match="read-only"):
        call(x, out=locked)


@pytest.mark.parametrize("xs, attrs, dtype", [
    ((2, 12, 15, 15), dict(kernel_shape=(3, 3), strides=(2, 2)), np.float32),  # 12 channels
    ((2, 64, 31, 31), dict(kernel_shape=(3, 3), strides=(2, 2)), np.float32),  # a large plane
    ((2, 64, 16, 16), dict(kernel_shape=(2, 2), strides=(2, 2)), np.float32),  # 2x2/2 tiles
    ((2, 16, 4, 4), dict(kernel_shape=(3, 3), strides=(2, 2)), np.float32),  # one output pixel
    ((2, 16, 15, 15), dict(kernel_shape=(3, 3), strides=(2, 2)), np.float64),
])
def test_shapes_and_dtypes_outside_the_rules_keep_the_nchw_kernels(xs, attrs, dtype):
    call = _site(xs, attrs, dtype)
    assert call.__name__ == "pool_at"
    x = np.random.default_rng(3).standard_normal(xs).astype(dtype)
    np.testing.assert_array_equal(call(x), OPS["MaxPool"].kernel(x, **attrs))


def test_two_threads_keep_the_nchw_kernels(monkeypatch):
    monkeypatch.setattr(_jit, "_parallel", True)
    assert _site(*CASES[0]).__name__ == "pool_at"


def test_fits_follows_the_measured_rule():
    plan = (None, (2, 128, 7, 7), (2, 2), (0, 0), (1, 1), (3, 3), None)
    assert pool_lanes.fits(plan, (2, 128, 15, 15))
    assert not pool_lanes.fits(plan, (2, 120, 17, 17))  # 289 input pixels
