"""MatMul by a file's weights packed into panels of 24 columns on eight lanes, 32 on sixteen
(AVX-512's; right on any x86 CPU, where LLVM splits the vectors when the CPU's are narrower:
both are tested on every CPU) (onemodel.numba.panels) against
PyTorch and a float64 product: rows past the blocks of four and past a row block, columns
past the last full panel, tiles of four, two and one row, one to three-axis A, NaN and
infinities, a planned ``out=``; taken for float32 on one thread from one row and sixteen
columns, any other call to the reference; the packed copy made once per weight array and
dropped with it."""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest
import torch

from onemodel.numba import _jit, gemm, panels
from onemodel.numba._simd import host_has_fma
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.specialize import CallSite, specialize

pytestmark = [pytest.mark.skipif(not host_has_fma(), reason="this CPU has no AVX2/FMA: "
                                "the panels are never chosen"),
              pytest.mark.usefixtures("serial")]  # the kernels run on one thread only


def _file_constant(a: np.ndarray) -> np.ndarray:
    return np.frombuffer(a.tobytes(), a.dtype).reshape(a.shape)


def _matmul_call(a_shape, w):
    out_shape = (*a_shape[:-1], w.shape[1])
    site = CallSite((a_shape, w.shape), (np.dtype(np.float32), w.dtype), (None, w), {},
                    (out_shape,), lambda A, B, out=None: OPS["MatMul"].kernel(A, B, out=out))
    return specialize(gemm.matmul, site)


WIDTHS = pytest.mark.parametrize("width", [panels.WIDTH, panels.WIDE_WIDTH],
                                 ids=["eight", "sixteen"])


@pytest.fixture(params=[False, True], ids=["eight", "sixteen"])
def lanes(request, monkeypatch):
    """The planned calls on either lane width, whatever this CPU would choose."""
    monkeypatch.setattr(panels, "host_has_avx512", lambda: request.param)
    return request.param


def _taken(call) -> bool:
    return call.__name__ == "panels_at"


@pytest.mark.parametrize("m, k, n", [
    (4, 8, 24), (5, 7, 16), (7, 33, 50), (12, 96, 384), (130, 64, 100), (3, 16, 48),
    (1, 5, 30), (64, 1, 17), (2, 40, 30), (6, 20, 48), (2, 576, 1024), (7, 520, 50),
    (64, 784, 256), (1, 256, 10), (8, 64, 8), (15, 300, 40),
])  # 7: four, two and one row; 3: two and one; 2 and 6: the two-row tile; 8 and more:
# product16's eight-row tile (15: eight, four, two and one); K past one or two of
# product16's K_BLOCK: the sums carried between blocks in every tile kind
@pytest.mark.parametrize("with_bias, relu", [(False, False), (True, False), (True, True)])
@WIDTHS
def test_kernel_matches_a_float64_product(m, k, n, with_bias, relu, width):
    """The sums start from the bias row (zeros without one) in every tile, the last
    panel's columns past N included; with ``relu`` the negative sums become 0 in every row
    block and NaN stays."""
    rng = np.random.default_rng(m * 1000 + k + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = (rng.standard_normal(n) * 4).astype(np.float32) if with_bias else None
    if relu:
        a[-1, 0] = np.nan  # the last row: NaN in every column
    y = np.full((m, n), np.nan, np.float32)
    panels.kernel(width)(a, panels.pack(b, width), n, y, panels.pack_row(c, n, width), relu)
    want = a.astype(np.float64) @ b.astype(np.float64) + (0 if c is None else c)
    if relu:
        want = np.where(want < 0, 0, want)
        assert np.isnan(y[-1]).all() and (y[:-1] >= 0).all()
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5 * math.sqrt(k))


@WIDTHS
def test_row_blocks_cover_every_row(width):
    """Rows in three blocks of A (64 rows of 1024 floats make a block), the last one short
    and ending in two rows past the fours."""
    assert panels.BLOCK_BYTES // (4 * 1024) == 64
    rng = np.random.default_rng(1)
    a = rng.standard_normal((150, 1024)).astype(np.float32)
    b = rng.standard_normal((1024, 40)).astype(np.float32)
    y = np.full((150, 40), np.nan, np.float32)
    panels.kernel(width)(a, panels.pack(b, width), 40, y, panels.pack_row(None, 40, width),
                         False)
    np.testing.assert_allclose(y, a.astype(np.float64) @ b, rtol=2e-5, atol=1e-3)


@pytest.mark.parametrize("a_shape", [(4, 96), (2, 3, 96), (2, 2, 3, 96), (37, 96), (1, 96),
                                     (2, 96), (1, 3, 96)])
def test_planned_matmul_takes_the_panels_and_matches_torch(a_shape, lanes):
    rng = np.random.default_rng(len(a_shape))
    w = _file_constant(rng.standard_normal((96, 70)).astype(np.float32))
    x = rng.standard_normal(a_shape).astype(np.float32)
    x.reshape(-1, 96)[0, 5] = np.inf
    x.reshape(-1, 96)[-1, 7] = np.nan
    call = _matmul_call(a_shape, w)
    assert _taken(call)
    want = torch.matmul(torch.from_numpy(x), torch.from_numpy(w.copy())).numpy()
    with np.errstate(invalid="ignore"):
        for out in (None, np.full(want.shape, np.nan, np.float32)):
            got = call(x, w, out=out)
            assert out is None or got is out
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
            finite = np.isfinite(want)
            np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-4)
        # a strided A is copied; other weights and an out of another layout take the reference
        wide = np.repeat(x, 2, axis=-1)[..., ::2]
        np.testing.assert_allclose(call(wide, w), got, rtol=0, atol=0, equal_nan=True)
        other = w.copy()
        other[0, 0] += 1
        np.testing.assert_allclose(call(x, other), x @ other, rtol=1e-5, atol=1e-5,
                                   equal_nan=True)
        strided = np.empty(want.shape[:-1] + (2 * want.shape[-1],), np.float32)[..., ::2]
        call(x, w, out=strided)
        np.testing.assert_allclose(strided, got, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_narrow_writable_float64_or_threads_keep_the_reference(monkeypatch):
    rng = np.random.default_rng(5)
    w = _file_constant(rng.standard_normal((64, 48)).astype(np.float32))
    assert all(_taken(_matmul_call((rows, 64), w)) for rows in (1, 2, 3))
    narrow = _file_constant(w[:, :8].copy())  # 8 columns: one panel, mostly padding
    assert _taken(_matmul_call((8, 64), narrow))  # on a few rows, as a classifier head
    assert not _taken(_matmul_call((9, 64), narrow))
    assert not _taken(_matmul_call((2, 64), _file_constant(w[:, :7].copy())))
    assert not _taken(_matmul_call((8, 64), w.copy()))  # writable: an update must show
    w64 = _file_constant(w.astype(np.float64))
    site = CallSite(((8, 64), w64.shape), (np.dtype(np.float64),) * 2, (None, w64), {},
                    ((8, 48),), lambda A, B, out=None: OPS["MatMul"].kernel(A, B, out=out))
    assert specialize(gemm.matmul, site).__name__ != "panels_at"
    monkeypatch.setattr(_jit, "_parallel", True)
    assert not _taken(_matmul_call((8, 64), w))


def test_the_packed_copy_is_made_once_and_dropped_with_the_weights():
    w = _file_constant(np.arange(64 * 48, dtype=np.float32).reshape(64, 48))
    calls = [_matmul_call(shape, w) for shape in ((8, 64), (2, 5, 64))]
    packed = [dict(zip(c.__code__.co_freevars, (v.cell_contents for v in c.__closure__)))["bp"]
              for c in calls]
    assert packed[0] is packed[1] and not packed[0].flags.writeable
    key = (id(w), f"panels, {panels.width()} wide")
    assert key in gemm._COPIES
    del calls, packed, w
    gc.collect()
    assert key not in gemm._COPIES


def _reaches_panels(fn, depth=3) -> bool:
    """Whether a planned call is, or calls through its closures, the panels' call."""
    if getattr(fn, "__name__", "") == "panels_at":
        return True
    return depth > 0 and any(callable(c.cell_contents) and _reaches_panels(c.cell_contents,
                                                                         depth - 1)
                             for c in getattr(fn, "__closure__", None) or ())


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [2, 9])  # a classifier head at batch 2: the two-row tile
def test_planned_fused_gemm_takes_the_panels_and_matches_torch(trans_b, bias, rows):
    rng = np.random.default_rng(10 * trans_b + bias)
    w = rng.standard_normal((64, 40)).astype(np.float32)  # (K, N)
    b_arg = _file_constant(np.ascontiguousarray(w.T) if trans_b else w)
    c = _file_constant(rng.standard_normal(40).astype(np.float32)) if bias else None
    x = rng.standard_normal((rows, 64)).astype(np.float32)
    attrs = {"activation": "Relu", "transB": trans_b}
    inputs = (x, b_arg) if c is None else (x, b_arg, c)
    site = CallSite(tuple(a.shape for a in inputs), tuple(a.dtype for a in inputs),
                    (None, *inputs[1:]), attrs, ((rows, 40),),
                    lambda *a, out=None: OPS["FusedGemm"].kernel(*a, **attrs, out=out))
    call = specialize(gemm.fused_gemm, site)
    assert _reaches_panels(call)
    # the plan's own bias and Relu: one call of the panels, no pass after
    assert call.__qualname__.startswith("_whole_on_panels")
    want = torch.relu(torch.from_numpy(x) @ torch.from_numpy(w) +
                      (torch.from_numpy(c.copy()) if bias else 0)).numpy()
    for out in (None, np.full((rows, 40), np.nan, np.float32)):
        got = call(*inputs, out=out)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    other = b_arg.copy()
    other.flat[0] += 1
    want_other = OPS["FusedGemm"].kernel(x, other, c, **attrs)
    np.testing.assert_allclose(call(x, other, *(() if c is None else (c,))), want_other,
                               rtol=1e-5, atol=1e-5)
    if bias:  # another bias than the plan's: the generic call adds it
        c2 = c + 1
        np.testing.assert_allclose(call(x, b_arg, c2),
                                   OPS["FusedGemm"].kernel(x, b_arg, c2, **attrs),
                                   rtol=1e-5, atol=1e-5)


def test_planned_fused_gemm_of_another_activation_takes_the_panels_then_its_pass():
    rng = np.random.default_rng(3)
    w = _file_constant(rng.standard_normal((64, 40)).astype(np.float32))
    c = _file_constant(rng.standard_normal(40).astype(np.float32))
    x = rng.standard_normal((5, 64)).astype(np.float32)
    attrs = {"activation": "Sigmoid"}
    site = CallSite((x.shape, w.shape, c.shape), (x.dtype,) * 3, (None, w, c), attrs,
                    ((5, 40),), lambda *a, out=None: OPS["FusedGemm"].kernel(*a, **attrs, out=out))
    call = specialize(gemm.fused_gemm, site)
    assert _reaches_panels(call) and not call.__qualname__.startswith("_whole_on_panels")
    want = torch.sigmoid(torch.from_numpy(x) @ torch.from_numpy(w.copy()) +
                         torch.from_numpy(c.copy())).numpy()
    np.testing.assert_allclose(call(x, w, c), want, rtol=1e-5, atol=1e-6)


def _linear_session(w, bias, activation=None, **attrs):
    """A Session over the Gemm a PyTorch Linear exports (transB=1), with ``activation``
    after it; the gemm-weight-layout pass stores its read-only transpose."""
    from onemodel.runtime import GraphBuilder, Session
    from onemodel.tensors import DType

    b = GraphBuilder()
    y = b.op("Gemm", b.input("x", DType.F32, ("batch", w.shape[1])), b.initializer("w", w),
             b.initializer("b", bias), transB=1, **attrs)
    b.output(b.op(activation, y) if activation else y, "y")
    return Session(b.build())


@pytest.mark.parametrize("batch", [1, 2, 3, 8])
@pytest.mark.parametrize("activation", [None, "Relu"])
def test_a_linear_head_is_planned_on_the_panels_and_matches_torch(batch, activation):
    """A classifier head (576 -> 1000) at batches 1-8, with and without an activation: the
    plain Gemm and the FusedGemm both planned on the panels over the pass's transpose (BLAS
    packed the weights on every call: 2 x 576 -> 1024 2.4x onnxruntime's time); NaN and
    infinities in a row reach only that row, as in torch."""
    rng = np.random.default_rng(batch)
    w = (rng.standard_normal((1000, 576)) / 24).astype(np.float32)
    bias = rng.standard_normal(1000).astype(np.float32)
    session = _linear_session(w, bias, activation)
    x = rng.standard_normal((batch, 576)).astype(np.float32)
    x[0, 3] = np.nan
    x[-1, 7] = np.inf
    with np.errstate(invalid="ignore"):
        got = session.run({"x": x}, return_numpy=True)["y"]
    want = torch.nn.functional.linear(torch.from_numpy(x), torch.from_numpy(w),
                                      torch.from_numpy(bias))
    want = (torch.relu(want) if activation else want).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-4)
    (step,) = [st for st in session.plan_for({"x": (batch, 576)}).steps
               if st.op in ("Gemm", "FusedGemm")]
    assert _reaches_panels(step.call)


def test_a_scaled_gemm_or_a_full_bias_keeps_the_reference():
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((64, 96)) / 10).astype(np.float32)
    x = rng.standard_normal((2, 96)).astype(np.float32)
    for attrs, bias in ((dict(alpha=0.5), rng.standard_normal(64)),
                        ({}, rng.standard_normal((2, 64)))):
        bias = bias.astype(np.float32)
        session = _linear_session(w, bias, **attrs)
        got = session.run({"x": x}, return_numpy=True)["y"]
        np.testing.assert_allclose(got, attrs.get("alpha", 1.0) * (x @ w.T) + bias,
                                   rtol=1e-5, atol=1e-5)
        (step,) = [st for st in session.plan_for({"x": (2, 96)}).steps if st.op == "Gemm"]
        assert not _reaches_panels(step.call)
