"""Eager iteration and len() follow numpy: rows along axis 0, differentiable like indexing."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.tensors import OneModelError, Tensor


def test_iteration_yields_the_rows_as_numpy_does():
    a = np.arange(24, dtype=np.float32).reshape(4, 3, 2)
    t = Tensor.from_numpy(a)
    rows = list(t)
    assert len(rows) == len(t) == len(a) == 4
    for got, want in zip(rows, a):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got.numpy(), want)
    _, second = Tensor.from_numpy(a[:2])
    np.testing.assert_array_equal(second.numpy(), a[1])
    assert [float(x) for x in Tensor.from_numpy(np.array([1.5, 2.5], np.float32))] == [1.5, 2.5]


def test_iteration_of_an_empty_axis_and_of_a_0d_tensor():
    assert list(Tensor.zeros(0, 3)) == []
    with pytest.raises(OneModelError, match="iteration over a 0-d tensor"):
        iter(Tensor.from_numpy(np.array(1.0, np.float32)))
    with pytest.raises(OneModelError, match="len\\(\\) of a 0-d tensor"):
        len(Tensor.from_numpy(np.array(1.0, np.float32)))


def test_rows_carry_gradients_like_indexing():
    torch = pytest.importorskip("torch")
    a = np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32)
    x = Tensor.from_numpy(a.copy()).requires_grad_()
    loss = sum((row * (i + 1)).sum() for i, row in enumerate(x))
    loss.backward()
    tx = torch.tensor(a, requires_grad=True)
    sum((row * (i + 1)).sum() for i, row in enumerate(tx)).backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())
