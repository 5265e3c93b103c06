"""Eager float32 Gemm by panels packed on the fly (onemodel.numba.products) against float64
numpy and PyTorch: every pair of transposes, row counts around the eight-row tile, column
counts around the 32-column panel, K around its blocks, a bias row, ``out=``, inputs that are
neither C- nor F-contiguous, the ``x @ W.T`` computed as ``(W @ x.T).T`` with its bias per
row, NaN and infinities; a Linear layer's training step against PyTorch; and where the
reference (BLAS) keeps the call. The kernels run on every x86 CPU (LLVM splits their vectors
where AVX-512 is missing), so the tests let the Gemm take them whatever the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from onemodel.numba import _simd, gemm, products


@pytest.fixture(autouse=True)
def packing_everywhere(monkeypatch, serial):
    """One thread, any size, any CPU: every float32 Gemm below goes by the panels."""
    monkeypatch.setattr(gemm, "_PACKING_MIN_MACS", 0)
    monkeypatch.setattr(gemm, "_PACKING_MIN_SIDE", 0)
    monkeypatch.setattr(_simd, "host_has_avx512", lambda: True)


@pytest.fixture
def calls(monkeypatch):
    """The (m, n, k, transposed) of each product16 call."""
    seen = []
    real = products.product16

    def spy(af, sam, sak, bf, sbk, sbn, m, n, k, yf, c, has_bias, transposed):
        seen.append((m, n, k, transposed))
        return real(af, sam, sak, bf, sbk, sbn, m, n, k, yf, c, has_bias, transposed)
    monkeypatch.setattr(products, "product16", spy)
    return seen


def _operands(rng, m, n, k, trans_a, trans_b):
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    return a, b


def _want(a, b, c, trans_a, trans_b):
    """float64 numpy: an oracle independent of float32 summation order."""
    with np.errstate(invalid="ignore"):  # inf - inf where NaN is what is wanted
        y = (a.T if trans_a else a).astype(np.float64) @ \
            (b.T if trans_b else b).astype(np.float64)
    return y if c is None else y + c


def _close(got, want, k):
    # float32 sums of k products of unit normals: errors grow like sqrt(k) ulps of the terms
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6 * max(1.0, np.sqrt(k)) * 4)


SHAPES = [  # (m, n, k): rows around 8, columns around 32, K around its blocks of 256
    (1, 1, 1), (7, 10, 5), (8, 32, 8), (9, 33, 9), (17, 31, 255), (16, 64, 256),
    (25, 70, 257), (64, 16, 600), (3, 100, 784), (40, 8, 17),
]


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("m, n, k", SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in SHAPES])
def test_every_transpose_and_shape_against_float64(m, n, k, trans_a, trans_b, calls):
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a, b = _operands(rng, m, n, k, trans_a, trans_b)
    c = rng.standard_normal(n).astype(np.float32)
    for bias in (None, c):
        got = gemm.gemm(a, b, bias, transA=trans_a, transB=trans_b)
        assert got.shape == (m, n) and got.dtype == np.float32 and got.flags.c_contiguous
        _close(got, _want(a, b, bias, trans_a, trans_b), k)
    assert len(calls) == 2
    # x @ W.T with fewer rows than W has goes as (W @ x.T).T
    assert calls[0][3] == bool(trans_b and not trans_a and m < n)


@pytest.mark.parametrize("m, n, k", [(8, 40, 20), (5, 300, 33), (64, 256, 784)])
def test_transposed_output_takes_its_bias_per_row(m, n, k, calls):
    rng = np.random.default_rng(k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = (rng.standard_normal(n) * 10).astype(np.float32)
    got = gemm.gemm(x, w, b, transB=1)
    assert calls == [(n, m, k, True)]
    _close(got, _want(x, w, b, 0, 1), k)
    want = torch.nn.functional.linear(torch.from_numpy(x), torch.from_numpy(w),
                                      torch.from_numpy(b)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_out_is_filled_and_returned():
    rng = np.random.default_rng(1)
    a, b = _operands(rng, 19, 45, 70, 0, 1)
    out = np.full((19, 45), np.nan, np.float32)
    assert gemm.gemm(a, b, None, transB=1, out=out) is out
    _close(out, _want(a, b, None, 0, 1), 70)


def test_inputs_neither_c_nor_f_contiguous_are_read_right():
    rng = np.random.default_rng(2)
    big = rng.standard_normal((60, 90)).astype(np.float32)
    a = big[:60:2, 1:61:2]  # (30, 30), strided both ways
    b = big[1:31, ::3]  # (30, 30): rows apart
    assert not (a.flags.c_contiguous or a.flags.f_contiguous)
    assert not (b.flags.c_contiguous or b.flags.f_contiguous)
    for ta, tb in [(0, 0), (1, 1), (0, 1), (1, 0)]:
        _close(gemm.gemm(a, b, None, transA=ta, transB=tb), _want(a, b, None, ta, tb), 30)


@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (0, 1), (1, 0)])
def test_nan_and_infinities_reach_their_row_and_column(trans_a, trans_b):
    rng = np.random.default_rng(4)
    m, n, k = 12, 40, 50
    a, b = _operands(rng, m, n, k, trans_a, trans_b)
    av = a.T if trans_a else a  # views: writing them writes a and b
    bv = b.T if trans_b else b
    av[3, 7] = np.nan
    av[10, 0] = np.inf
    bv[49, 33] = -np.inf
    got = gemm.gemm(a, b, None, transA=trans_a, transB=trans_b)
    want = _want(a, b, None, trans_a, trans_b)
    assert np.isnan(got[3]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-4)


def test_a_linear_layers_training_step_matches_torch(calls):
    """Forward (x @ W.T + b), the input's gradient (g @ W) and the weight's (g.T @ x): all
    three products by the panels, against torch.nn.Linear's."""
    from onemodel.tensors import Tensor
    from onemodel.training import Linear

    rng = np.random.default_rng(6)
    theirs = torch.nn.Linear(100, 48)
    ours = Linear(100, 48)
    ours.load_state_dict({k: v.detach().numpy().copy() for k, v in theirs.state_dict().items()})
    x = rng.standard_normal((24, 100)).astype(np.float32)
    up = rng.standard_normal((24, 48)).astype(np.float32)
    tx = torch.from_numpy(x).requires_grad_()
    (theirs(tx) * torch.from_numpy(up)).sum().backward()
    ox = Tensor.from_numpy(x)
    ox.requires_grad = True
    y = ours(ox)
    (y * Tensor.from_numpy(up)).sum().backward()
    assert {(m, n, k) for m, n, k, _ in calls} == {(48, 24, 100), (24, 100, 48), (48, 100, 24)}
    np.testing.assert_allclose(y.numpy(), theirs(tx).detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ox.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours.weight.grad.numpy(), theirs.weight.grad.numpy(),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours.bias.grad.numpy(), theirs.bias.grad.numpy(), rtol=1e-5,
                               atol=1e-5)


def test_the_reference_keeps_what_the_panels_do_not_take(monkeypatch, calls):
    rng = np.random.default_rng(7)
    a, b = _operands(rng, 16, 16, 16, 0, 0)
    want = _want(a, b, None, 0, 0)
    _close(gemm.gemm(a.astype(np.float64), b.astype(np.float64)), want, 16)  # float64
    _close(gemm.gemm(a, b, alpha=2.0) / 2, want, 16)  # scaled
    _close(gemm.gemm(a, b, np.ones((16, 16), np.float32)) - 1, want, 16)  # a 2-D C
    _close(gemm.gemm(a, b, out=np.empty((16, 16), np.float32).T), want, 16)  # out not C order
    assert calls == []
    monkeypatch.setattr(gemm, "_PACKING_MIN_MACS", 16 ** 3 + 1)  # below the size
    _close(gemm.gemm(a, b), want, 16)
    monkeypatch.setattr(gemm, "_PACKING_MIN_MACS", 0)
    monkeypatch.setattr(gemm, "_PACKING_MIN_SIDE", 17)  # too few rows or columns to fill panels
    _close(gemm.gemm(a, b), want, 16)
    monkeypatch.setattr(gemm, "_PACKING_MIN_SIDE", 0)
    aa = a.copy()  # an out= that is an operand: numpy copies first, so must this
    _close(gemm.gemm(aa, b, out=aa), want, 16)
    monkeypatch.setattr(_simd, "host_has_avx512", lambda: False)  # no sixteen lanes
    monkeypatch.setattr(gemm, "_PACKING_MIN_MACS", 0)
    _close(gemm.gemm(a, b), want, 16)
    assert calls == []


def test_more_threads_keep_blas(parallel_variants, calls):
    rng = np.random.default_rng(8)
    a, b = _operands(rng, 64, 64, 64, 0, 1)
    _close(gemm.gemm(a, b, transB=1), _want(a, b, None, 0, 1), 64)
    assert calls == []


def test_an_mlp_trains_as_in_torch_with_the_panels(calls):
    """Five SGD steps with momentum of an MLP (the training benchmark's, narrower) on one
    thread: every product by the panels, the loss one SoftmaxCrossEntropyLoss op; the weights
    after the steps against PyTorch's from the same start."""
    from onemodel import training as T
    from onemodel.tensors import Tensor

    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Linear(200, 64), torch.nn.ReLU(),
                                 torch.nn.Linear(64, 48), torch.nn.ReLU(),
                                 torch.nn.Linear(48, 10))
    ours = T.Sequential(T.Linear(200, 64), T.ReLU(), T.Linear(64, 48), T.ReLU(),
                        T.Linear(48, 10))
    ours.load_state_dict({k: v.detach().numpy().copy() for k, v in theirs.state_dict().items()})
    t_opt = torch.optim.SGD(theirs.parameters(), 0.05, momentum=0.9)
    o_opt = T.SGD(ours.parameters(), 0.05, momentum=0.9)
    rng = np.random.default_rng(10)
    for _ in range(5):
        x = rng.standard_normal((32, 200)).astype(np.float32)
        y = rng.integers(0, 10, 32)
        t_opt.zero_grad()
        torch.nn.functional.cross_entropy(theirs(torch.from_numpy(x)),
                                          torch.from_numpy(y)).backward()
        t_opt.step()
        with T.ActivationScope():
            o_opt.zero_grad()
            T.losses.cross_entropy(ours(Tensor.from_numpy(x)), Tensor.from_numpy(y)).backward()
            o_opt.step()
    assert len(calls) >= 5 * 8  # three forward, three weight and two input gradients a step
    for name, want in theirs.state_dict().items():
        np.testing.assert_allclose(ours.state_dict()[name], want.numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=name)
