"""MaxPool on sixteen-lane rows along a column stride of two (onemodel.numba.pool_strided)
against the reference kernel bit for bit and PyTorch: rows of one to five 32-column blocks and
their remainders, begin pads of 0 to 2 columns, ceil_mode, window heights 1 to 5 at row
strides 1 to 3 (windows cut by the image's top and bottom), 2- and 3-wide windows, NaN on
either side of a block's edge, inf above -inf (a sum of NaN without a NaN read), ties of -0.0
and 0.0 (equal as values: which zero a tie keeps is no contract of ONNX's or numpy's), serially
and in parallel, and the planned call. The kernels run on every x86 CPU (LLVM
splits the vectors where AVX-512 is missing); they are chosen only where it is there."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from onemodel.numba import pool, pool_strided
from onemodel.numba._simd import host_has_fma
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.specialize import CallSite, specialize

# (input shape, attributes)
CASES = [
    ((2, 64, 31, 31), dict(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1)),  # SqueezeNet
    ((2, 16, 15, 15), dict(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1)),
    ((2, 16, 7, 7), dict(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1)),
    ((1, 4, 112, 112), dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))),  # ResNet
    ((1, 3, 9, 64), dict(kernel_shape=(3, 3), strides=(2, 2))),  # whole blocks, no remainder
    ((1, 3, 9, 65), dict(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1)),
    ((1, 3, 9, 97), dict(kernel_shape=(3, 3), strides=(2, 2), pads=(0, 2, 1, 2))),
    ((1, 2, 11, 160), dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), ceil_mode=1)),
    ((1, 3, 13, 33), dict(kernel_shape=(5, 3), strides=(1, 2), pads=(2, 1, 2, 1))),
    ((1, 3, 12, 34), dict(kernel_shape=(4, 3), strides=(3, 2), pads=(1, 0, 2, 0), ceil_mode=1)),
    ((2, 3, 7, 31), dict(kernel_shape=(1, 3), strides=(1, 2))),
    ((2, 3, 9, 33), dict(kernel_shape=(2, 2), strides=(2, 2), ceil_mode=1)),
    ((1, 3, 9, 66), dict(kernel_shape=(3, 2), strides=(2, 2), pads=(1, 1, 1, 0))),
    ((1, 2, 5, 3), dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))),
    ((1, 2, 4, 2), dict(kernel_shape=(2, 2), strides=(1, 2), pads=(0, 1, 0, 1))),
    ((1, 3, 10, 35), dict(kernel_shape=(3, 3), strides=(2, 2), auto_pad="SAME_UPPER")),
    # a last window past the row's end, in a block's first and second vector
    ((1, 3, 9, 20), dict(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1)),
    ((2, 3, 8, 50), dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), ceil_mode=1)),
    ((1, 3, 8, 34), dict(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1)),
]
IDS = [f"{xs}-{a['kernel_shape']}-{i}" for i, (xs, a) in enumerate(CASES)]


def _input(shape, seed=0, special=True):
    x = (np.random.default_rng(seed).standard_normal(shape) * 3).astype(np.float32)
    if special:
        h, w = shape[2:]
        for c in (15, 16, 31, 32, 33, 63, 64, w - 1):  # on either side of a block's edge
            if c < w:
                x[0, 0, (c * 7) % h, c] = np.nan
        x[-1, -1, 0, 0] = np.nan
        x[0, -1, h - 1, w - 1] = np.inf
        if h > 2:  # inf above -inf: their sum is NaN with no NaN in the window
            x[-1, 0, 1, w // 2] = np.inf
            x[-1, 0, 2, w // 2] = -np.inf
        x[-1, 1 % shape[1], :, ::3] = 0.0  # ties of zeros
        x[-1, 1 % shape[1], ::2, ::3] = -0.0
    return x


def _kernel_call(x, attrs):
    a = dict(attrs)
    plan = pool._plan(x.shape, x.dtype, pool._tuple(a["kernel_shape"]),
                      pool._tuple(a.get("strides")), pool._tuple(a.get("pads")),
                      pool._tuple(a.get("dilations")), a.get("auto_pad", "NOTSET"),
                      int(a.get("ceil_mode", 0)), 0)
    (h, w, oh, ow), (_sw, pl), _d, hy, _wq, _taps = plan
    kernel = pool_strided.max_pool_kernel(*a["kernel_shape"])
    return kernel, (h, w, oh, ow, pl, hy[0], hy[1], hy[2]), (x.shape[0], x.shape[1], oh, ow)


@pytest.mark.parametrize("xs, attrs", CASES, ids=IDS)
def test_rows_equal_the_reference_serially_and_in_parallel(xs, attrs):
    kernel, tail, oshape = _kernel_call(np.empty(xs, np.float32), attrs)
    for seed, special in ((0, True), (1, False)):
        x = _input(xs, seed, special)
        want = OPS["MaxPool"].kernel(x, **attrs)
        assert want.shape == oshape
        for variant in (kernel.serial, kernel.parallel):
            out = np.full(oshape, 7.0, np.float32)
            variant(x.reshape(-1), out.reshape(-1), *tail)
            np.testing.assert_array_equal(out, want)  # NaN where the reference has them


TORCH_CASES = [(xs, a) for xs, a in CASES if "auto_pad" not in a
               and a.get("pads", (0, 0, 0, 0))[:2] == a.get("pads", (0, 0, 0, 0))[2:]]


@pytest.mark.parametrize("xs, attrs", TORCH_CASES)
def test_rows_equal_torch(xs, attrs):
    torch = pytest.importorskip("torch")

    x = _input(xs, seed=2, special=False)
    x[0, 0, 0, ::5] = np.inf
    kernel, tail, oshape = _kernel_call(x, attrs)
    out = np.empty(oshape, np.float32)
    kernel.serial(x.reshape(-1), out.reshape(-1), *tail)
    pads = attrs.get("pads", (0, 0, 0, 0))
    want = torch.nn.functional.max_pool2d(
        torch.from_numpy(x), attrs["kernel_shape"], attrs["strides"], pads[:2],
        ceil_mode=bool(attrs.get("ceil_mode", 0))).numpy()
    np.testing.assert_array_equal(out, want)


def _site(xs, attrs, dtype=np.float32):
    generic = partial(pool.max_pool, **attrs)
    want_shape = generic(np.zeros(xs, dtype)).shape
    site = CallSite((xs,), (np.dtype(dtype),), (None,), attrs, (want_shape,), generic)
    return specialize(pool.max_pool, site)


@pytest.mark.parametrize("xs, attrs", CASES[:4] + CASES[11:12], ids=IDS[:4] + IDS[11:12])
def test_planned_and_eager_calls_take_the_rows_where_the_cpu_has_avx512(xs, attrs, serial):
    """On one thread a plane narrower than MIN_WIDTH_OVER_LANES goes by the lanes, where the
    CPU has AVX2 and FMA."""
    x = _input(xs, seed=4)
    want = OPS["MaxPool"].kernel(x, **attrs)
    reached, _ = pool._max_call(*_plan_args(x, attrs))
    assert (reached is pool_strided.max_pool_kernel(*attrs["kernel_shape"])) == \
        pool_strided.host_has_avx512()
    np.testing.assert_array_equal(pool.max_pool(x, **attrs), want)
    call = _site(xs, attrs)
    lanes = xs[3] < pool_strided.MIN_WIDTH_OVER_LANES and xs[1] % 8 == 0 and \
        host_has_fma()
    assert call.__name__ == ("max_lanes_at" if lanes else "pool_at")
    np.testing.assert_array_equal(call(x), want)
    out = np.full_like(want, 7.0)
    assert call(x, out=out) is out
    np.testing.assert_array_equal(out, want)


def _plan_args(x, attrs):
    plan = pool._plan(x.shape, x.dtype, pool._tuple(attrs["kernel_shape"]),
                      pool._tuple(attrs.get("strides")), pool._tuple(attrs.get("pads")),
                      pool._tuple(attrs.get("dilations")), attrs.get("auto_pad", "NOTSET"),
                      int(attrs.get("ceil_mode", 0)), 0)
    return plan, attrs["kernel_shape"], attrs.get("strides"), x.dtype


def test_takes_only_float32_column_stride_two_narrow_undilated_windows_on_avx512(monkeypatch):
    monkeypatch.setattr(pool_strided, "host_has_avx512", lambda: True)
    assert pool_strided.takes(np.float32, (3, 3), (2, 2), (1, 1))
    assert pool_strided.takes(np.float32, (2, 2), (1, 2), (1, 1))
    assert pool_strided.takes(np.float32, (5, 3), (3, 2), (1, 1))
    assert not pool_strided.takes(np.float64, (3, 3), (2, 2), (1, 1))
    assert not pool_strided.takes(np.float32, (3, 3), (2, 1), (1, 1))  # column stride 1
    assert not pool_strided.takes(np.float32, (3, 3), (3, 3), (1, 1))
    assert not pool_strided.takes(np.float32, (3, 4), (2, 2), (1, 1))  # four columns wide
    assert not pool_strided.takes(np.float32, (3, 3), (2, 2), (2, 2))  # dilated
    assert not pool_strided.takes(np.float32, (3,), (2,), (1,))  # one spatial axis
    monkeypatch.setattr(pool_strided, "host_has_avx512", lambda: False)
    assert not pool_strided.takes(np.float32, (3, 3), (2, 2), (1, 1))
    x = _input((2, 8, 15, 15))
    attrs = dict(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1)
    reached, _ = pool._max_call(*_plan_args(x, attrs))
    assert reached is not pool_strided.max_pool_kernel(3, 3)


def test_a_second_process_loads_the_kernels_from_numba_s_cache(tmp_path):
    """The kernel is a closure over its window's two integers only: a closure over another
    compiled function is keyed by that function's identity, which no other process shares,
    and the warm first run of a ResNet paid 0.6 s compiling it again."""
    import os
    import subprocess
    import sys

    code = ("import numpy as np; from onemodel.numba import pool, pool_strided as ps\n"
            "x = np.random.default_rng(0).standard_normal((1, 2, 9, 40)).astype(np.float32)\n"
            "for k in ((3, 3), (2, 2)):\n"
            "    plan = pool._plan(x.shape, x.dtype, k, (2, 2), (0, 0, 0, 0), (1, 1), 'NOTSET',"
            " 1, 0)\n"
            "    (h, w, oh, ow), (_s, pl), _d, hy, _wq, _t = plan\n"
            "    out = np.empty((1, 2, oh, ow), np.float32)\n"
            "    ps.max_pool_kernel(*k).serial(x.reshape(-1), out.reshape(-1), h, w, oh, ow, pl,"
            " hy[0], hy[1], hy[2])\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}

    def cached():
        return sorted(p.name for p in tmp_path.rglob("pool_strided*.nbc"))
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    first = cached()
    assert first, "nothing was cached"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert cached() == first  # nothing compiled again
