"""The MaxPool/AveragePool kernels compiled per geometry (pool.FIXED: the padded-row kernels
and, for stride 1 with the output of the input's shape, the "same" kernels sweeping groups of
planes): each geometry is checked to reach the kernel it is meant for, then compared with the
reference kernel and with PyTorch on odd sizes, ceil_mode, asymmetric and large pads,
count_include_pad 0/1, NaN and infinities, float32 and float64, with and without out=,
serially and in parallel, and through the plan-time specializer (an input of another shape
takes the generic call). 2x2 stride-2 pools whose windows all lie inside the image take
kernels of their own; on AVX-512 CPUs float32 MaxPools of column stride 2 take the sixteen-lane
rows of ``pool_strided`` (tested in test_pool_strided.py, and here as the geometries reach
them)."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from onemodel.numba import pool, pool_strided
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.specialize import CallSite, specialize

TOL = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-11, atol=1e-11)}
SAME, FIXED, GENERIC, PLANE, TILES = "same", "fixed", "generic", "plane", "tiles"
STRIDED = "strided"

# (input shape, attributes, the kernel the MaxPool and AveragePool calls must reach)
GEOMETRIES = [
    ((2, 3, 13, 11), dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)), FIXED),
    ((2, 3, 11, 13), dict(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1), FIXED),
    ((1, 2, 12, 12), dict(kernel_shape=(3, 3), strides=(2, 2), pads=(0, 0, 1, 1)), FIXED),
    ((1, 3, 9, 10), dict(kernel_shape=(3, 3), strides=(2, 2), auto_pad="SAME_UPPER"), FIXED),
    ((1, 2, 9, 9), dict(kernel_shape=(3, 3), strides=(1, 2), pads=(2, 1, 0, 2), ceil_mode=1),
     FIXED),
    ((2, 2, 8, 9), dict(kernel_shape=(3, 3), strides=(2, 1), pads=(1, 1, 1, 1)), FIXED),
    ((1, 3, 7, 9), dict(kernel_shape=(3, 3)), FIXED),  # stride 1, narrower output
    ((2, 3, 9, 7), dict(kernel_shape=(2, 2), strides=(2, 2), ceil_mode=1), FIXED),
    ((1, 2, 6, 6), dict(kernel_shape=(2, 2), strides=(2, 2), pads=(1, 1, 1, 1)), FIXED),
    ((2, 3, 13, 11), dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1)), SAME),
    ((2, 3, 13, 11), dict(kernel_shape=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1), ceil_mode=1),
     SAME),
    ((1, 2, 5, 7), dict(kernel_shape=(3, 3), pads=(0, 2, 2, 0)), SAME),
    ((1, 2, 7, 5), dict(kernel_shape=(3, 3), pads=(2, 0, 0, 2)), SAME),
    ((1, 2, 6, 6), dict(kernel_shape=(3, 3), pads=(3, 1, 3, 1)), FIXED),  # rows all padding
    ((2, 150, 5, 6), dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1)), SAME),  # groups of planes
    ((1, 3, 1, 1), dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1)), SAME),
    ((3, 2, 4, 1), dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1)), SAME),  # one column
    ((2, 2, 1, 2), dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1)), SAME),  # one row
    ((1, 2, 2, 2), dict(kernel_shape=(3, 3), auto_pad="SAME_LOWER"), SAME),
    ((2, 3, 7, 8), dict(kernel_shape=(2, 2), pads=(0, 0, 1, 1)), SAME),
    ((2, 3, 7, 8), dict(kernel_shape=(2, 2), pads=(1, 1, 0, 0)), SAME),
    # rows as long as the vector loops' body (16 lanes unrolled 4 times), not only remainders
    ((1, 2, 9, 70), dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)), FIXED),
    ((2, 2, 7, 135), dict(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1), FIXED),
    ((1, 2, 6, 130), dict(kernel_shape=(2, 2), strides=(2, 2), pads=(1, 1, 1, 1)), FIXED),
    ((1, 2, 8, 66), dict(kernel_shape=(3, 3), strides=(2, 1), pads=(1, 1, 1, 1)), FIXED),
    ((1, 2, 5, 97), dict(kernel_shape=(3, 3)), FIXED),
    ((2, 2, 5, 70), dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1)), SAME),
    ((2, 100, 9, 10), dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)), FIXED),
    ((1, 4, 9, 11), dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1), dilations=(2, 1)), GENERIC),
    ((1, 4, 9, 11), dict(kernel_shape=(3, 3), strides=(3, 3)), GENERIC),
    # one window over the whole plane: a plane mean for AveragePool
    ((2, 5, 7, 7), dict(kernel_shape=(7, 7)), PLANE),
    ((1, 3, 5, 6), dict(kernel_shape=(5, 6), strides=(9, 9), pads=(0, 0, 2, 1)), PLANE),
    ((1, 3, 5, 6), dict(kernel_shape=(5, 6), pads=(1, 0, 0, 0)), GENERIC),  # two windows
    # 2x2 stride 2 with every window inside the image: four loads per output
    ((2, 3, 8, 6), dict(kernel_shape=(2, 2), strides=(2, 2)), TILES),
    ((2, 3, 9, 7), dict(kernel_shape=(2, 2), strides=(2, 2)), TILES),  # last row/column unread
    ((1, 2, 8, 6), dict(kernel_shape=(2, 2), strides=(2, 2), ceil_mode=1), TILES),
    ((1, 2, 6, 8), dict(kernel_shape=(2, 2), strides=(2, 2), pads=(0, 0, 1, 1)), TILES),
]
IDS = [f"{kind}-{i}" for i, (_, _, kind) in enumerate(GEOMETRIES)]
OPS_UNDER_TEST = [("MaxPool", pool.max_pool, {}),
                  ("AveragePool", pool.average_pool, dict(count_include_pad=0)),
                  ("AveragePool", pool.average_pool, dict(count_include_pad=1))]
OP_IDS = ["max", "avg", "avg-include-pad"]


def _input(shape, dtype, seed=0, special=False):
    x = (np.random.default_rng(seed).standard_normal(shape) * 3).astype(dtype)
    if special:  # NaN inside, on a border column and a border row; infinities; a clean plane
        h, w = shape[2:]
        x[0, 0, h // 2, w // 2] = np.nan
        x[0, 1, h - 1, 0] = np.nan
        x[0, 1, 0, w - 1] = np.inf
        x[-1, -1, 0, 0] = -np.inf
        x[-1, -1, h - 1, w - 1] = np.nan
        if h > 2:  # inf above -inf: their sum is NaN with no NaN in the window
            x[-1, 0, 1, w // 2] = np.inf
            x[-1, 0, 2, w // 2] = -np.inf
    return x


def _reached(op, x, attrs) -> str:
    """Which kernel a generic call of these attributes runs."""
    a = dict(attrs)
    include = a.pop("count_include_pad", 0)
    plan = pool._plan(x.shape, x.dtype, pool._tuple(a["kernel_shape"]),
                      pool._tuple(a.get("strides")), pool._tuple(a.get("pads")),
                      pool._tuple(a.get("dilations")), a.get("auto_pad", "NOTSET"),
                      int(a.get("ceil_mode", 0)), int(include))
    if op == "MaxPool":
        kernel, _ = pool._max_call(plan, a["kernel_shape"], a.get("strides"), x.dtype)
    else:
        kernel, _ = pool._avg_call(plan, a["kernel_shape"], a.get("strides"), x.dtype)
    if kernel is pool._plane_mean:
        return PLANE
    if kernel in (pool._max_pool_2x2, pool._avg_pool_2x2):
        return TILES
    if kernel in (pool._max_pool, pool._avg_pool):
        return GENERIC
    k = pool._tuple(a["kernel_shape"])
    if op == "MaxPool" and kernel is pool_strided.max_pool_kernel(*k):
        return STRIDED
    if kernel in (pool._max_pool_same(*k), pool._avg_pool_same(*k)):
        return SAME
    return FIXED


def _strided_rows(x, attrs) -> bool:
    s = pool._tuple(attrs.get("strides")) or (1, 1)
    return pool_strided.takes(x.dtype, pool._tuple(attrs["kernel_shape"]), s,
                              pool._tuple(attrs.get("dilations")) or (1, 1))


def _check(op, got, want, dtype):
    assert got.shape == want.shape and got.dtype == want.dtype
    if op == "MaxPool":  # a max picks one of its inputs: exactly the reference's
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, **TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("op,kernel,extra", OPS_UNDER_TEST, ids=OP_IDS)
@pytest.mark.parametrize("shape,attrs,kind", GEOMETRIES, ids=IDS)
def test_matches_the_reference(shape, attrs, kind, op, kernel, extra, dtype):
    attrs = {**attrs, **extra}
    x = _input(shape, dtype, special=True)
    if kind == PLANE and op == "MaxPool":
        kind = GENERIC
    elif kind == FIXED and op == "MaxPool" and _strided_rows(x, attrs):
        kind = STRIDED
    assert _reached(op, x, attrs) == kind
    with np.errstate(invalid="ignore", divide="ignore"):
        want = OPS[op].kernel(x, **attrs)
        _check(op, kernel(x, **attrs), want, dtype)
        out = np.full(want.shape, np.nan, dtype)
        assert kernel(x, **attrs, out=out) is out
        _check(op, out, want, dtype)
        _check(op, kernel(_input(shape, dtype), **attrs),
               OPS[op].kernel(_input(shape, dtype), **attrs), dtype)


@pytest.mark.parametrize("op,kernel,extra", OPS_UNDER_TEST, ids=OP_IDS)
@pytest.mark.parametrize("shape,attrs,kind", GEOMETRIES, ids=IDS)
def test_parallel_variant_matches_the_serial_one(shape, attrs, kind, op, kernel, extra,
                                                 parallel_variants):
    """Bit for bit: the parallel variant splits the planes, not the sums."""
    attrs = {**attrs, **extra}
    x = _input(shape, np.float32, seed=1, special=True)
    got = kernel(x, **attrs)
    serial = (pool._max_call if op == "MaxPool" else pool._avg_call)
    plan = pool._plan(x.shape, x.dtype, pool._tuple(attrs["kernel_shape"]),
                      pool._tuple(attrs.get("strides")), pool._tuple(attrs.get("pads")),
                      pool._tuple(attrs.get("dilations")), attrs.get("auto_pad", "NOTSET"),
                      int(attrs.get("ceil_mode", 0)), int(attrs.get("count_include_pad", 0)))
    k, tail = serial(plan, attrs["kernel_shape"], attrs.get("strides"), x.dtype)
    want = np.empty_like(got)
    k.serial(x.reshape(-1), want.reshape(-1), *tail)
    assert got.tobytes() == want.tobytes()


TORCH_CASES = [(shape, attrs) for shape, attrs, kind in GEOMETRIES
               if kind != GENERIC and "auto_pad" not in attrs
               and len(set(attrs.get("pads", (0, 0, 0, 0))[::2])) == 1
               and len(set(attrs.get("pads", (0, 0, 0, 0))[1::2])) == 1
               and all(p <= k // 2 for p, k in zip(attrs.get("pads", (0, 0))[:2],
                                                    attrs["kernel_shape"]))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("op,kernel,extra", OPS_UNDER_TEST, ids=OP_IDS)
@pytest.mark.parametrize("shape,attrs", TORCH_CASES)
def test_matches_torch(shape, attrs, op, kernel, extra, dtype):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    x = _input(shape, dtype, seed=2, special=op == "MaxPool")
    k, s = attrs["kernel_shape"], attrs.get("strides", (1, 1))
    pad = tuple(attrs.get("pads", (0, 0, 0, 0))[:2])
    ceil = bool(attrs.get("ceil_mode", 0))
    t = torch.from_numpy(x)
    if op == "MaxPool":
        want = F.max_pool2d(t, k, s, pad, ceil_mode=ceil).numpy()
    else:
        want = F.avg_pool2d(t, k, s, pad, ceil_mode=ceil,
                            count_include_pad=bool(extra["count_include_pad"])).numpy()
    got = kernel(x, **attrs, **extra)
    if op == "MaxPool":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, **TOL[dtype])


SPECIALIZED = [(shape, attrs) for shape, attrs, kind in GEOMETRIES if kind != GENERIC][::3] + \
    [(shape, attrs) for shape, attrs, kind in GEOMETRIES if kind == PLANE][:1]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("op,kernel,extra", OPS_UNDER_TEST, ids=OP_IDS)
@pytest.mark.parametrize("shape,attrs", SPECIALIZED)
def test_specialized_call_equals_the_generic_one(shape, attrs, op, kernel, extra, dtype):
    """The plan-time specializer runs the same kernel bit for bit, with and without out=; an
    input of another shape or dtype takes the generic call."""
    attrs = {**attrs, **extra}
    x = _input(shape, dtype, seed=3, special=True)
    generic = partial(kernel, **attrs)
    want = generic(x)
    call = specialize(kernel, CallSite((x.shape,), (x.dtype,), (None,), dict(attrs),
                                       (want.shape,), generic))
    assert call is not None
    assert call(x).tobytes() == want.tobytes()
    out = np.full(want.shape, np.nan, dtype)
    assert call(x, out=out) is out and out.tobytes() == want.tobytes()
    strided = np.empty(shape[:-1] + (2 * shape[-1],), dtype)[..., ::2]
    strided[...] = x
    assert call(strided).tobytes() == want.tobytes()
    for grown in (np.concatenate([x, x[:1]]), np.concatenate([x, x[..., :1]], axis=-1)):
        assert call(grown).tobytes() == generic(grown).tobytes()  # other shapes
    other = x.astype(np.float64 if dtype == np.float32 else np.float32)
    assert call(other).tobytes() == generic(other).tobytes()


FIXED_GEOMETRIES = [(shape, attrs) for shape, attrs, kind in GEOMETRIES if kind == FIXED]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("shape,attrs", FIXED_GEOMETRIES)
def test_planned_max_pool_with_its_geometry_compiled_in(shape, attrs, dtype, monkeypatch):
    """A planned MaxPool of a fixed window runs a kernel with the plan's geometry compiled in
    (not the one that reads it from its arguments): against the reference kernel bit for bit,
    NaN and infinities included, serially and in parallel, with and without out=. (Without
    AVX-512, as the float32 calls of column stride 2 take ``pool_strided``'s rows there.)"""
    monkeypatch.setattr(pool_strided, "takes", lambda *args: False)
    x = _input(shape, dtype, seed=5, special=True)
    want = OPS["MaxPool"].kernel(x, **attrs)
    plan = pool._plan(x.shape, x.dtype, pool._tuple(attrs["kernel_shape"]),
                      pool._tuple(attrs.get("strides")), pool._tuple(attrs.get("pads")), None,
                      attrs.get("auto_pad", "NOTSET"), int(attrs.get("ceil_mode", 0)), 0)
    compiled, tail = pool._max_call(plan, attrs["kernel_shape"], attrs.get("strides"), x.dtype,
                                    compiled_geometry=True)
    assert compiled is not pool._max_call(plan, attrs["kernel_shape"], attrs.get("strides"),
                                          x.dtype)[0]
    for variant in (compiled.serial, compiled.parallel):
        out = np.full(want.shape, np.nan, dtype)
        variant(x.reshape(-1), out.reshape(-1), *tail)
        np.testing.assert_array_equal(out, want)
    generic = partial(pool.max_pool, **attrs)
    call = specialize(pool.max_pool, CallSite((x.shape,), (x.dtype,), (None,), dict(attrs),
                                              (want.shape,), generic))
    np.testing.assert_array_equal(call(x), want)
    out = np.full(want.shape, np.nan, dtype)
    assert call(x, out=out) is out
    np.testing.assert_array_equal(out, want)
