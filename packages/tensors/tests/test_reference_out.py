"""Reference kernels that write ``out=`` (``defop(..., writes_out=True)``): Concat, MatMul and
Gemm. Each, given an ``out`` of the output's shape and dtype, must fill all of it with exactly
what it returns without ``out`` (the existing kernel; PyTorch checks the float products too) and
return ``out`` itself. A session plan hands these kernels buffers it reuses from run to run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from onemodel.tensors import DType, Tensor
from onemodel.tensors.errors import OneModelError
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.base import defop

WRITERS = ("Concat", "MatMul", "Gemm")
INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
FLOATS = [np.float16, np.float32, np.float64]


def _rand(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":  # the full range: integer products wrap, the same either way
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)  # ml_dtypes


def _strided(rng, shape, dtype):
    """A non-contiguous array of ``shape``: every other element of a larger one, transposed
    when 2-D or more."""
    if len(shape) < 2:
        return _rand(rng, tuple(2 * s for s in shape), dtype)[::2]
    big = _rand(rng, shape[:-2] + (shape[-1], 2 * shape[-2]), dtype)
    view = np.swapaxes(big[..., ::2], -1, -2)
    assert view.shape == shape and (view.size < 2 or not view.flags.c_contiguous)
    return view


def _garbage(shape, dtype):
    """An out= buffer full of a value no kernel result here has (NaN / the dtype's max)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.full(shape, np.nan, dtype)
    if dtype.kind in "iu":
        return np.full(shape, np.iinfo(dtype).max, dtype)
    return np.ones(shape, dtype)


def _bits(a):
    return np.array(a).reshape(-1).view(np.uint8)


def _same_with_and_without_out(op, arrays, attrs, garbage=True):
    kernel = OPS[op].kernel
    before = [a.copy() for a in arrays]
    want = np.asarray(kernel(*arrays, **attrs))
    out = _garbage(want.shape, want.dtype) if garbage else np.zeros(want.shape, want.dtype)
    got = kernel(*arrays, **attrs, out=out)
    assert got is out
    assert out.dtype == want.dtype and out.shape == want.shape
    # bit for bit: the same numbers, NaNs included, and no element left unwritten
    assert np.array_equal(_bits(out), _bits(want)), op
    for a, b in zip(arrays, before):
        assert np.array_equal(_bits(a), _bits(b))  # inputs untouched
    return want


# declaration ------------------------------------------------------------------------------------

def test_writers_declare_out_and_out_is_not_an_attribute(isolated_registry):
    for op in WRITERS:
        assert OPS[op].writes_out and "out" not in OPS[op].attrs
        recs = isolated_registry.get_registry().candidates(op, "cpu", None)
        assert [r.writes_out for r in recs] == [True]
    assert not OPS["Add"].writes_out and not OPS["Split"].writes_out


def test_defop_refuses_a_writes_out_it_cannot_honour():
    def positional(x, out=None):
        return x

    def multi(x, *, out=None):
        return x, x

    with pytest.raises(OneModelError, match="keyword-only out=None"):
        defop("_NoSuchOpA", shape=lambda s: s[0], writes_out=True)(positional)
    with pytest.raises(OneModelError, match="single-output"):
        defop("_NoSuchOpB", shape=lambda s: s, outputs=("Y", "Z"), writes_out=True)(multi)
    assert "_NoSuchOpA" not in OPS and "_NoSuchOpB" not in OPS


# Concat -------------------------------------------------------------------------------------------

CONCAT_DTYPES = [np.float32, np.float64, np.float16, np.int8, np.int64, np.uint16, np.bool_,
                 DType.BF16.numpy, DType.F8E4M3FN.numpy, DType.I4.numpy]


@pytest.mark.parametrize("dtype", CONCAT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_concat_with_and_without_out(dtype):
    rng = np.random.default_rng(1)
    cases = [
        ([(3, 5), (2, 5), (7, 5)], 0),
        ([(3, 5, 2), (3, 1, 2), (3, 0, 2), (3, 4, 2)], 1),
        ([(2, 3, 5), (2, 3, 1)], -1),
        ([(7,)], 0),
        ([(1, 1, 1), (1, 1, 1)], 2),
    ]
    for shapes, axis in cases:
        for strided in (False, True):
            make = _strided if strided else _rand
            arrays = [make(rng, s, dtype) for s in shapes]
            want = _same_with_and_without_out("Concat", arrays, {"axis": axis})
            ref = np.concatenate([a.astype(np.float64) if a.dtype.kind == "V" else a
                                  for a in arrays], axis=axis)
            np.testing.assert_array_equal(want.astype(ref.dtype), ref)


# MatMul -------------------------------------------------------------------------------------------

MATMUL_SHAPES = [
    ((3, 5), (5, 7)),
    ((1, 9), (9, 1)),
    ((2, 1, 3, 4), (5, 4, 6)),  # batch dims broadcast
    ((4, 3, 0), (4, 0, 2)),  # empty inner dimension: zeros
    ((6,), (6,)),  # rank 1 both: a 0-d result
    ((5,), (2, 5, 3)),
    ((2, 3, 5), (5,)),
    ((17, 33), (33, 65)),  # big enough for BLAS's blocked paths
]


@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=lambda d: np.dtype(d).name)
def test_matmul_with_and_without_out(dtype):
    rng = np.random.default_rng(2)
    for sa, sb in MATMUL_SHAPES:
        for make_a, make_b in ((_rand, _rand), (_strided, _rand), (_rand, _strided),
                               (_strided, _strided)):
            a, b = make_a(rng, sa, dtype), make_b(rng, sb, dtype)
            want = _same_with_and_without_out("MatMul", [a, b], {})
            if np.dtype(dtype) in (np.float32, np.float64):
                np.testing.assert_allclose(
                    want, torch.matmul(torch.from_numpy(a.copy()), torch.from_numpy(b.copy())),
                    rtol=1e-5, atol=1e-5)


def test_matmul_of_dtypes_numpy_has_no_loop_for_copies_into_out():
    """bool and the ml_dtypes types: computed as without out=, then written to ``out``."""
    rng = np.random.default_rng(3)
    for dtype in (np.bool_, DType.BF16.numpy):
        a, b = _strided(rng, (4, 3), dtype), _rand(rng, (3, 5), dtype)
        _same_with_and_without_out("MatMul", [a, b], {})


# Gemm ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_gemm_with_and_without_out(dtype):
    rng = np.random.default_rng(4)
    m, k, n = 5, 7, 3
    c_shapes = [None, (), (n,), (1, n), (m, 1), (m, n)]
    for ta in (0, 1):
        for tb in (0, 1):
            for cs in c_shapes:
                for alpha, beta in ((1.0, 1.0), (0.5, -2.0)):
                    for make in (_rand, _strided):
                        a = make(rng, (k, m) if ta else (m, k), dtype)
                        b = make(rng, (n, k) if tb else (k, n), dtype)
                        arrays = [a, b] + ([] if cs is None else [_rand(rng, cs, dtype)])
                        attrs = dict(alpha=alpha, beta=beta, transA=ta, transB=tb)
                        want = _same_with_and_without_out("Gemm", arrays, attrs)
                        if np.dtype(dtype) == np.float64:
                            t = [torch.from_numpy(x.copy()) for x in arrays]
                            ref = alpha * ((t[0].T if ta else t[0]) @ (t[1].T if tb else t[1]))
                            if cs is not None:
                                ref = ref + beta * t[2]
                            np.testing.assert_allclose(want, ref.numpy(), rtol=1e-12, atol=1e-12)


def test_gemm_empty_inner_dimension_fills_out():
    a, b = np.ones((4, 0), np.float32), np.ones((0, 3), np.float32)
    c = np.arange(3, dtype=np.float32)
    want = _same_with_and_without_out("Gemm", [a, b, c], {"beta": 2.0})
    np.testing.assert_array_equal(want, np.broadcast_to(2 * c, (4, 3)))


# eager dispatch never passes out= -----------------------------------------------------------------

def test_eager_calls_run_as_before():
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 2))
    b = b.astype(np.float32)
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-6)
    from onemodel.tensors.tensor import concat

    np.testing.assert_array_equal(concat([Tensor(a), Tensor(a)], axis=1).numpy(),
                                  np.concatenate([a, a], axis=1))


# a session plan reuses the buffers ---------------------------------------------------------------

def _graph(rng):
    from onemodel.runtime import GraphBuilder

    g = GraphBuilder()
    x = g.input("x", DType.F32, (5, 7))
    w1 = g.const(rng.standard_normal((7, 9)).astype(np.float32))
    w2 = g.const(rng.standard_normal((4, 18)).astype(np.float32))
    bias = g.const(rng.standard_normal(4).astype(np.float32))
    w3 = g.const(rng.standard_normal((3, 5)).astype(np.float32))
    m = g.op("MatMul", x, w1)  # (5, 9)
    r = g.op("Relu", m)
    c = g.op("Concat", m, r, axis=1)  # (5, 18)
    h = g.op("Gemm", c, w2, bias, alpha=0.5, transB=1)  # (5, 4)
    t = g.op("Transpose", h, perm=[1, 0])  # a view: (4, 5), not contiguous
    p = g.op("MatMul", t, g.op("Transpose", w3, perm=[1, 0]))  # (4, 3)
    y = g.op("Concat", p, p, axis=0)  # (8, 3): the output
    g.output(y)
    return g.build(), y


def test_a_plan_reuses_buffers_for_the_reference_writers(isolated_registry):
    from onemodel.runtime import Session

    rng = np.random.default_rng(6)
    graph, y = _graph(rng)
    s = Session(graph, optimize=False)
    plain = Session(graph, optimize=False, planned_buffers=False)
    feeds = [rng.standard_normal((5, 7)).astype(np.float32) for _ in range(4)]
    got = s.run({"x": feeds[0]}, return_numpy=True)[y]
    np.testing.assert_array_equal(got, plain.run({"x": feeds[0]}, return_numpy=True)[y])

    (plan,) = list(s._plans.values())
    writers = [st for st in plan.steps if st.op in WRITERS]
    assert len(writers) == 5
    buffered = [st for st in writers if st.buf >= 0]
    assert len(buffered) == 4  # all but the final Concat, whose value escapes as the output

    given: list[tuple[str, int]] = []  # (step, address of its out=) over the later runs

    def recording(step):
        call = step.call

        def wrapped(*args, out=None):
            result = call(*args, out=out)
            assert result is out  # the kernel wrote the buffer itself
            given.append((step.label, out.__array_interface__["data"][0]))
            return result

        return wrapped

    for st in buffered:
        st.call = recording(st)
    for x in feeds[1:]:
        got = s.run({"x": x}, return_numpy=True)[y]
        np.testing.assert_array_equal(got, plain.run({"x": x}, return_numpy=True)[y])
    assert len(given) == 3 * len(buffered)
    per_step = {}
    for label, address in given:
        per_step.setdefault(label, set()).add(address)
    assert all(len(addresses) == 1 for addresses in per_step.values())  # the same each run
    assert plan.buffer_pool.made == 1
    assert all(st.buf < 0 for st in next(iter(plain._plans.values())).steps)
