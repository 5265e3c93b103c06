"""The reference Einsum runs a float contraction of two operands as one batched matrix product
(PyTorch's way; numpy's einsum loops in C without BLAS). Random equations over random sizes
(batch, kept, contracted and summed-only letters in any order, scalars, empty axes) give
``np.einsum``'s values, shapes and dtypes; what the product does not cover keeps np.einsum."""

from __future__ import annotations

import random

import numpy as np
import pytest

from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.gather import _einsum_as_matmul

EINSUM = OPS["Einsum"].kernel


def _cases(count, seed):
    rnd = random.Random(seed)
    for _ in range(count):
        a = "".join(rnd.sample("abcdefg", rnd.randint(0, 4)))
        b = "".join(rnd.sample("abcdefg", rnd.randint(0, 4)))
        pool = sorted(set(a) | set(b))
        out = "".join(rnd.sample(pool, rnd.randint(0, len(pool))))
        size = {c: rnd.randint(0, 1) if rnd.random() < 0.05 else rnd.randint(1, 6)
                for c in "abcdefg"}
        yield f"{a},{b}->{out}", [size[c] for c in a], [size[c] for c in b]


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_random_contractions_equal_np_einsum(dtype, tol):
    rng = np.random.default_rng(1)
    through_matmul = 0
    for eq, a_shape, b_shape in _cases(600, seed=2):
        a = rng.standard_normal(a_shape).astype(dtype)
        b = rng.standard_normal(b_shape).astype(dtype)
        want = np.asarray(np.einsum(eq, a.astype(np.float64), b.astype(np.float64)))
        got = EINSUM(a, b, equation=eq)
        assert got.shape == want.shape and got.dtype == dtype, eq
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10, err_msg=eq)
        through_matmul += _einsum_as_matmul(eq, a.shape, b.shape) is not None
    assert through_matmul > 100  # the product path is the one under test


@pytest.mark.parametrize("eq,shapes", [
    ("bij,bjk->bik", [(8, 32, 32), (8, 32, 32)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 8), (2, 3, 7, 8)]),  # attention scores
    ("ij,jk", [(3, 4), (4, 5)]),  # implicit output: np.einsum
    ("ii,ij->j", [(3, 3), (3, 4)]),  # a diagonal: np.einsum
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),  # an ellipsis: np.einsum
    ("ij,kj->ik", [(1, 4), (3, 4)]),
])
def test_named_equations(eq, shapes):
    rng = np.random.default_rng(3)
    ops = [rng.standard_normal(s) for s in shapes]
    np.testing.assert_allclose(EINSUM(*ops, equation=eq), np.einsum(eq, *ops), rtol=1e-12)


def test_integers_and_three_operands_keep_np_einsum():
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    assert np.array_equal(EINSUM(a, a.T.copy(), equation="ij,jk->ik"), a @ a.T)
    x = np.ones((2, 3))
    assert np.array_equal(EINSUM(x, x.T.copy(), x, equation="ij,jk,kl->il"),
                          np.einsum("ij,jk,kl->il", x, x.T, x))


def test_an_empty_operand_sums_no_terms():
    """inf beside an empty axis: np.einsum sums no terms (0); summing B's own axis first and
    then multiplying would give inf * 0 = NaN, so empty operands keep np.einsum."""
    got = EINSUM(np.array([np.inf]), np.zeros((0, 1)), equation="w,mw->")
    assert got.shape == () and got == 0.0
