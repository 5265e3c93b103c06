"""The numba FusedGemm (BLAS product, then the bias row and activation in one pass) against
PyTorch's linear layer and activations: float32 and float64, transposed operands, no bias,
NaN and infinities, a planned buffer, and a session over an MLP whose linear layers the passes
fuse, run with the plugin and against torch."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from onemodel.numba import gemm
from onemodel.runtime import GraphBuilder, Session
from onemodel.tensors import DType

ACTS = {"Relu": torch.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh,
        "HardSwish": lambda t: t * torch.clamp(t / 6 + 0.5, 0, 1),  # ONNX's formula
        "Silu": torch.nn.functional.silu}
TOL = {np.float32: dict(rtol=1e-5, atol=1e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}


def _torch(x, w, b, act, trans_b):
    """act(x @ W + b) in torch, W given as (K, N) or, with ``trans_b``, as (N, K)."""
    weight = torch.from_numpy(np.array(w if trans_b else w.T, order="C"))
    bias = None if b is None else torch.from_numpy(b)
    return ACTS[act](torch.nn.functional.linear(torch.from_numpy(x), weight, bias)).numpy()


@pytest.fixture(autouse=True)
def skinny_not_panels(no_panels):
    """The skinny product and BLAS are what these tests test; on one thread the packed panels
    (test_panels.py) would take their MatMuls."""


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_torch(dtype, act, trans_b, bias):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 33)).astype(dtype)
    x[0, 3], x[1, 4], x[2, 5] = np.nan, np.inf, -np.inf
    w = rng.standard_normal((17, 33) if trans_b else (33, 17)).astype(dtype)
    b = rng.standard_normal(17).astype(dtype) if bias else None
    want = _torch(x, w, b, act, trans_b)
    got = gemm.fused_gemm(x, w, b, activation=act, transB=trans_b)
    np.testing.assert_allclose(got, want, **TOL[dtype])
    out = np.full(want.shape, np.nan, dtype)
    assert gemm.fused_gemm(x, w, b, activation=act, transB=trans_b, out=out) is out
    np.testing.assert_allclose(out, want, **TOL[dtype])


def test_a_session_over_an_mlp_uses_it_and_matches_torch():
    rng = np.random.default_rng(5)
    sizes = (20, 32, 32, 4)
    weights = [(rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
               for n_in, n_out in itertools.pairwise(sizes)]
    biases = [rng.standard_normal(n_out).astype(np.float32) for n_out in sizes[1:]]
    b = GraphBuilder()
    h = b.input("x", DType.F32, ("batch", sizes[0]))
    for i, (w, bias) in enumerate(zip(weights, biases)):
        w_in, b_in = b.initializer(f"fc{i}.weight", w), b.initializer(f"fc{i}.bias", bias)
        h = b.op("Add", b.op("MatMul", h, w_in), b_in)
        if i < len(weights) - 1:
            h = b.op("Relu", h)
    b.output(h, "y")
    session = Session(b.build())
    for batch in (1, 3):
        x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
        got = session.run({"x": x}, return_numpy=True)["y"]
        t = torch.from_numpy(x)
        for i, (w, bias) in enumerate(zip(weights, biases)):
            t = t @ torch.from_numpy(w) + torch.from_numpy(bias)
            if i < len(weights) - 1:
                t = torch.relu(t)
        np.testing.assert_allclose(got, t.numpy(), rtol=1e-5, atol=1e-5)
        plan = session.plan_for({"x": (batch, sizes[0])})
        fused = [st for st in plan.steps if st.op == "FusedGemm"]
        assert len(fused) == 2 and all(
            getattr(st.call, "__qualname__", "").startswith("_planned_gemm") for st in fused)


@pytest.mark.parametrize("rows", [1, 2, 5, 16, 17])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_few_rows_by_large_constant_weights_match_torch(rows, trans_b):
    """A classifier head (a few rows by 1 MiB or more of constant float32 weights) is planned
    as the skinny product over the weights' (N, K) rows: against torch for 1-16 rows (17 take
    BLAS), with either weight layout; another weight array than the planned one takes BLAS."""
    from onemodel.tensors.ops.specialize import CallSite, specialize

    rng = np.random.default_rng(rows)
    k, n = 576, 520  # 1.2 MB of weights
    x = rng.standard_normal((rows, k)).astype(np.float32)
    if rows > 1:
        x[0, 3] = np.inf  # one row of infinities and NaN, the rest finite
    w = (rng.standard_normal((n, k) if trans_b else (k, n)) / 24).astype(np.float32)
    w.flags.writeable = False  # (K, N) weights are copied only when nothing can change them
    b = rng.standard_normal(n).astype(np.float32)
    attrs = dict(activation="HardSwish", transB=trans_b)
    want = _torch(x, w, b, "HardSwish", trans_b)
    site = CallSite(((rows, k), w.shape, (n,)), (x.dtype,) * 3, (None, w, b), attrs,
                    ((rows, n),), lambda *a, out=None: gemm.fused_gemm(*a, out=out, **attrs))
    call = specialize(gemm.fused_gemm, site)
    assert call is not None
    assert (gemm._rows_by_k(site, dict(attrs), (rows, n)) is not None) == (rows <= 16)
    for out in (None, np.full(want.shape, np.nan, np.float32)):
        got = call(x, w, b, out=out)
        assert out is None or got is out
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    other = w.copy()
    other[0, 0] += 1.0  # a different weight array: its own values, through BLAS
    np.testing.assert_allclose(call(x, other, b), _torch(x, other, b, "HardSwish", trans_b),
                               rtol=1e-4, atol=1e-4)


def test_writable_weights_keep_blas_so_an_update_in_place_shows():
    """(K, N) weights the caller can still write are not copied into the skinny layout: the
    planned call reads them as they are, so changing them in place changes the next result."""
    from onemodel.tensors.ops.specialize import CallSite, specialize

    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 576)).astype(np.float32)
    w = rng.standard_normal((576, 520)).astype(np.float32)
    attrs = dict(activation="Relu")
    site = CallSite(((2, 576), w.shape), (x.dtype,) * 2, (None, w), attrs, ((2, 520),),
                    lambda *a, out=None: gemm.fused_gemm(*a, out=out, **attrs))
    assert gemm._rows_by_k(site, dict(attrs), (2, 520)) is None
    call = specialize(gemm.fused_gemm, site)
    call(x, w)
    w *= 2.0
    np.testing.assert_allclose(call(x, w), _torch(x, w, None, "Relu", 0), rtol=1e-4, atol=1e-4)


def test_a_session_plans_a_linear_head_at_batch_two_as_the_skinny_product():
    """A Linear head in PyTorch's layout (transB=1): the gemm-weight-layout pass stores its
    read-only transpose, which the skinny product reads back as rows; against torch."""
    rng = np.random.default_rng(11)
    w = (rng.standard_normal((600, 512)) / 20).astype(np.float32)  # (N, K): 1.2 MB
    bias = rng.standard_normal(600).astype(np.float32)
    b = GraphBuilder()
    x_in = b.input("x", DType.F32, ("batch", 512))
    y = b.op("Relu", b.op("Gemm", x_in, b.initializer("w", w), b.initializer("b", bias),
                          transB=1))
    b.output(y, "y")
    session = Session(b.build())
    x = rng.standard_normal((2, 512)).astype(np.float32)
    got = session.run({"x": x}, return_numpy=True)["y"]
    np.testing.assert_allclose(got, _torch(x, w, bias, "Relu", 1), rtol=1e-4, atol=1e-4)
    plan = session.plan_for({"x": (2, 512)})
    (step,) = [st for st in plan.steps if st.op == "FusedGemm"]
    assert any(getattr(c.cell_contents, "__qualname__", "") == "_skinny_product.<locals>.skinny"
               for c in step.call.__closure__)


def _file_constant(a):
    """``a`` as a constant loaded from a file: a read-only view of immutable bytes."""
    return np.frombuffer(a.tobytes(), a.dtype).reshape(a.shape)


def _matmul_call(a_shape, w):
    from onemodel.tensors.ops import OPS
    from onemodel.tensors.ops.specialize import CallSite, specialize

    out_shape = tuple(a_shape[:-1]) + (w.shape[1],)
    site = CallSite((a_shape, w.shape), (np.dtype(np.float32), w.dtype), (None, w), {},
                    (out_shape,), lambda A, B, out=None: OPS["MatMul"].kernel(A, B, out=out))
    return specialize(gemm.matmul, site)


def _skinny(call) -> bool:
    """Whether a planned MatMul call runs the skinny product."""
    return any(getattr(c.cell_contents, "__qualname__", "") == "_skinny_product.<locals>.skinny"
               for c in call.__closure__ or ())


@pytest.mark.parametrize("a_shape", [(4, 1024), (8, 1024), (2, 4, 1024), (2, 2, 2, 1024),
                                     (17, 1024), (2, 4, 4, 1024), (3, 1024), (33, 1024),
                                     (1, 1024)])
def test_matmul_of_a_few_rows_by_large_file_weights_matches_torch(a_shape):
    """MatMul of 4-32 rows (A's leading axes together) by 4 MiB or more of a file's float32
    weights is planned as the skinny product over their (N, K) copy; 1-3 rows and 33 keep the
    reference's call. Against torch.matmul with NaN and infinities in one row, with and
    without a planned out; another weight array and float64 take the reference."""
    rng = np.random.default_rng(len(a_shape) * 100 + a_shape[0])
    w = _file_constant((rng.standard_normal((1024, 1100)) / 32).astype(np.float32))  # 4.3 MB
    x = rng.standard_normal(a_shape).astype(np.float32)
    x.reshape(-1, 1024)[0, 5] = np.inf
    rows = int(np.prod(a_shape[:-1]))
    call = _matmul_call(a_shape, w)
    assert _skinny(call) == (4 <= rows <= 32)
    want = torch.matmul(torch.from_numpy(x), torch.from_numpy(w.copy())).numpy()
    with np.errstate(invalid="ignore"):  # inf - inf in the row with the infinity
        for out in (None, np.full(want.shape, np.nan, np.float32)):
            got = call(x, w, out=out)
            assert out is None or got is out
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        other = w.copy()
        other[0, 0] += 1.0
        np.testing.assert_allclose(call(x, other), x @ other, rtol=1e-4, atol=1e-4)
        x64 = x.astype(np.float64)
        got = call(x64, w.astype(np.float64))
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, x64 @ w.astype(np.float64), rtol=1e-10, atol=1e-10)


def test_matmul_keeps_blas_for_writable_or_small_weights():
    """A caller's writable weights (an update in place must show) and weights under 4 MiB keep
    the reference's call."""
    rng = np.random.default_rng(3)
    writable = rng.standard_normal((1024, 1100)).astype(np.float32)
    assert not _skinny(_matmul_call((8, 1024), writable))
    assert not _skinny(_matmul_call((8, 768), _file_constant(
        rng.standard_normal((768, 768)).astype(np.float32))))  # 2.4 MB


def _rows_of(call) -> np.ndarray:
    """The (N, K) weights a planned skinny MatMul call reads."""
    (skinny,) = [c.cell_contents for c in call.__closure__ if callable(c.cell_contents)
                 and getattr(c.cell_contents, "__qualname__", "").endswith("skinny")]
    return dict(zip(skinny.__code__.co_freevars, (c.cell_contents for c in skinny.__closure__)))[
        "w"]


def test_the_weights_copy_is_made_once_and_dropped_with_them():
    """Plans of several shapes share one read-only (N, K) copy of each weight array (not one
    each, which would multiply a model's memory by its shapes), and the copy goes when the
    weights do."""
    import gc

    w = _file_constant(np.arange(1024 * 1100, dtype=np.float32).reshape(1024, 1100))
    calls = [_matmul_call(shape, w) for shape in ((4, 1024), (8, 1024), (2, 8, 1024))]
    rows = [_rows_of(call) for call in calls]
    assert rows[0] is rows[1] is rows[2]
    assert rows[0].shape == (1100, 1024) and not rows[0].flags.writeable
    np.testing.assert_array_equal(rows[0], w.T)
    key = (id(w), "rows")
    del calls, rows, w
    gc.collect()
    assert key not in gemm._COPIES



def test_a_finalizer_inside_the_copy_cache_does_not_deadlock():
    """A garbage-collection pass can start inside ``_transposed``'s locked section (it
    allocates there) and free other cached weights, whose finalizer (``_forget``) then runs in
    the same thread and takes the same lock. With a plain lock that thread hung for good (found
    by review: sessions dropped and reloaded in a loop hung after about 500 reloads); the lock
    is re-entrant. Checked directly: the finalizer run while the thread holds the lock, in a
    thread that must finish."""
    import threading

    w = _file_constant(np.ones((256, 300), np.float32))
    rows = gemm._transposed(w)
    key = (id(w), "rows")

    def finalizer_inside_the_lock():
        with gemm._COPIES_LOCK:
            gemm._forget(key, rows)

    worker = threading.Thread(target=finalizer_inside_the_lock, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "the finalizer blocked on the lock its own thread holds"
    assert key not in gemm._COPIES
    assert gemm._transposed(w) is not rows  # made again: the entry had gone


def test_only_immutable_weights_share_a_copy():
    """A read-only array that owns its data can be made writable again by its owner, so MatMul
    does not take it as constant (a shared copy would go stale for the plans made after a
    change), while a file's immutable weights are."""
    b = np.ones((1024, 1100), np.float32)
    b.flags.writeable = False
    x = np.ones((8, 1024), np.float32)
    first = _matmul_call((8, 1024), b)
    assert not _skinny(first)
    np.testing.assert_array_equal(first(x, b), x @ b)
    b.flags.writeable = True
    b[:] = 2.0
    b.flags.writeable = False
    np.testing.assert_array_equal(_matmul_call((4, 2, 1024), b)(x.reshape(4, 2, 1024), b),
                                  (x @ b).reshape(4, 2, 1100))


def test_planned_shapes_that_disagree_keep_the_reference():
    """A call site whose shapes disagree (A's last axis is not B's rows, or the output is not
    A's rows by B's columns) never reaches the unchecked kernel: the reference's call, which
    says what is wrong."""
    from onemodel.tensors.ops import OPS
    from onemodel.tensors.ops.specialize import CallSite, specialize

    w = _file_constant(np.ones((1024, 1100), np.float32))
    for a_shape, out_shape in [((8, 512), (8, 1100)), ((8, 1024), (8, 100))]:
        site = CallSite((a_shape, w.shape), (np.dtype(np.float32),) * 2, (None, w), {},
                        (out_shape,), lambda A, B, out=None: OPS["MatMul"].kernel(A, B, out=out))
        call = specialize(gemm.matmul, site)
        assert not _skinny(call)
        with pytest.raises(ValueError):
            call(np.ones(a_shape, np.float32), w)
    rows = gemm._transposed(w)
    ref = lambda A, B, C=None, out=None: "reference"
    assert gemm._skinny_product(rows, w, (8, 512), (8, 1100), ref) is ref
    assert gemm._skinny_product(rows, w, (8, 1024), (8, 100), ref) is ref
