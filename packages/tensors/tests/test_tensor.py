"""The Tensor API as users call it: creation, reading data, operators, indexing, in-place methods
and the errors they get for bad input."""

import numpy as np
import pytest

from onemodel.tensors import (
    AutogradError,
    DType,
    DTypeError,
    Generator,
    OneModelError,
    ShapeError,
    Tensor,
    concat,
    no_grad,
    split,
    stack,
)


def test_creation_and_reading():
    z = Tensor.zeros(DType.F32, 4, 1)
    assert z.shape == (4, 1) and z.dtype is DType.F32 and z.to_array() == [0.0] * 4
    assert Tensor.ones(2, 3).dtype is DType.F32
    assert Tensor.zeros((2, 3), dtype=DType.I64).dtype is DType.I64
    t = Tensor.from_data([0, 1, 2, 3], 4, 1, dtype=DType.F32)
    assert t.shape == (4, 1) and t.to_array() == [0.0, 1.0, 2.0, 3.0]
    assert Tensor.full((2,), 7, dtype=DType.I32).tolist() == [7, 7]
    assert Tensor.arange(5).dtype is DType.I64
    assert Tensor.arange(0, 1, 0.25).to_array() == [0, 0.25, 0.5, 0.75]
    assert Tensor.from_data([[1, 2], [3, 4]]).shape == (2, 2)
    assert Tensor.from_data([5.5], dtype=DType.F64).item() == 5.5
    assert np.asarray(t).shape == (4, 1)


def test_from_data_with_wrong_count_says_so():
    with pytest.raises(ShapeError, match="3 values do not fill shape \\[2, 2\\]"):
        Tensor.from_data([1, 2, 3], 2, 2)


def test_from_numpy_shares_memory():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = Tensor.from_numpy(a)
    a[0, 0] = 42
    assert t.numpy()[0, 0] == 42 and t.numpy() is a
    with pytest.raises(DTypeError, match="complex128"):
        Tensor.from_numpy(np.zeros(2, np.complex128))


def test_generator_is_deterministic():
    a = Tensor.randn(3, 4, generator=Generator(42))
    b = Tensor.randn(3, 4, generator=Generator(42))
    c = Tensor.rand(3, 4, generator=Generator(7))
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert a.dtype is DType.F32 and c.numpy().min() >= 0 and c.numpy().max() < 1


def test_repr_is_readable():
    r = repr(Tensor.from_data([1.5, 2], 2).requires_grad_())
    assert r == "Tensor([1.5, 2. ], dtype=F32, shape=[2], requires_grad=True)"


def test_operators_follow_pytorch_promotion():
    f = Tensor.from_data([1, 2], dtype=DType.F32)
    i = Tensor.from_data([1, 2], dtype=DType.I64)
    assert (f + 1).dtype is DType.F32
    assert (i * 2).dtype is DType.I64
    assert (i * 0.5).dtype is DType.F32
    assert (f + i).dtype is DType.F64  # numpy's promotion of mixed tensors
    assert (f + f.cast(DType.F64)).dtype is DType.F64
    assert (2 - f).to_array() == [1, 0]
    assert (np.float32(3) * f).to_array() == [3, 6]
    assert (f ** 2).to_array() == [1, 4]
    assert (-f).to_array() == [-1, -2]


def test_comparisons_give_bool_tensors_and_truth_values():
    a = Tensor.from_data([1, 2, 3])
    assert (a > 1).dtype is DType.BOOL and (a > 1).tolist() == [False, True, True]
    assert (a == 2).tolist() == [False, True, False]
    assert (a != 2).tolist() == [True, False, True]
    assert bool(Tensor.from_data([1.0]))
    with pytest.raises(OneModelError, match="ambiguous"):
        bool(a > 1)
    assert {a: 1}[a] == 1  # tensors stay hashable


def test_reductions_with_axis_and_keepdims():
    a = Tensor.from_numpy(np.arange(6, dtype=np.float64).reshape(2, 3))
    assert a.sum().item() == 15
    assert a.sum(axis=0).tolist() == [3, 5, 7]
    assert a.mean(axis=1, keepdims=True).shape == (2, 1)
    assert a.max(axis=1).tolist() == [2, 5]
    assert a.min().item() == 0
    assert a.argmax(axis=1).tolist() == [2, 2]
    assert a.argmax().item() == 5
    np.testing.assert_allclose(a.var(axis=1).numpy(), np.var(a.numpy(), axis=1, ddof=1))


def test_shape_methods():
    a = Tensor.from_numpy(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    assert a.reshape(6, -1).shape == (6, 4)
    assert a.transpose(0, 2).shape == (4, 3, 2)
    assert a.permute(1, 2, 0).shape == (3, 4, 2)
    assert a.flatten(1).shape == (2, 12)
    assert a.unsqueeze(0).squeeze().shape == (2, 3, 4)
    assert a[:, :1].expand(2, 5, 4).shape == (2, 5, 4)
    assert concat([a, a], axis=1).shape == (2, 6, 4)
    assert stack([a, a]).shape == (2, 2, 3, 4)
    parts = split(a, 2, axis=2)
    assert [p.shape for p in parts] == [(2, 3, 2), (2, 3, 2)]
    assert [p.shape for p in split(a, [1, 3], axis=2)] == [(2, 3, 1), (2, 3, 3)]


@pytest.mark.parametrize(
    "index",
    [0, -1, (1, 2), (slice(None), 1), (Ellipsis, 2), (None, 0), (slice(None, None, -1),),
     (0, None, slice(1, 3)), ([1, 0, 1],), (slice(None), [2, 0]), (np.array([True, False]),),
     (1, slice(None), [3, 0]), (slice(None), None, 1, None)],
)
def test_indexing_matches_numpy(index):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(Tensor.from_numpy(a)[index].numpy(), a[index])


def test_indexing_errors_are_clear():
    a = Tensor.zeros(2, 3)
    with pytest.raises(ShapeError, match="index 5 is out of range for axis 1 of size 3"):
        a[0, 5]
    with pytest.raises(ShapeError, match="too many indices"):
        a[0, 0, 0]
    with pytest.raises(OneModelError, match="one integer-array index"):
        a[[0, 1], [0, 1]]


def test_setitem_and_inplace_methods():
    a = Tensor.zeros(2, 3)
    a[0, 1:] = 5
    a[1] = Tensor.from_data([1, 2, 3])
    assert a.tolist() == [[0, 5, 5], [1, 2, 3]]
    a.add_(1).mul_(2)
    assert a.tolist() == [[2, 12, 12], [4, 6, 8]]
    a.sub_(Tensor.ones(3), alpha=2)
    a += 1
    a /= 2
    assert a.tolist() == [[0.5, 5.5, 5.5], [1.5, 2.5, 3.5]]
    a.zero_()
    assert a.sum().item() == 0


def test_inplace_on_a_parameter_needs_no_grad():
    w = Tensor.ones(3).requires_grad_()
    with pytest.raises(AutogradError, match="no_grad"):
        w.add_(1)
    with no_grad():
        w.sub_(Tensor.ones(3) * 0.5)
    assert w.tolist() == [0.5, 0.5, 0.5]


def test_shape_errors_name_op_shapes_and_dtypes():
    with pytest.raises(ShapeError, match=r"Add.*F32\[2, 3\].*F32\[4\]"):
        Tensor.zeros(2, 3) + Tensor.zeros(4)
    with pytest.raises(ShapeError, match=r"MatMul.*inner dimensions 3 and 4"):
        Tensor.zeros(2, 3) @ Tensor.zeros(4, 5)
    with pytest.raises(ShapeError, match=r"Reshape.*cannot reshape \[2, 3\]"):
        Tensor.zeros(2, 3).reshape(4, -1)


def test_dtype_errors_name_the_op():
    from onemodel.tensors.dispatch import dispatch

    with pytest.raises(DTypeError, match=r"Add: inputs must share one dtype, got F32, I64"):
        dispatch("Add", (Tensor.zeros(2), Tensor.zeros(2, dtype=DType.I64)))
    with pytest.raises(DTypeError, match=r"Exp: dtype I64 is not supported"):
        Tensor.zeros(2, dtype=DType.I64).exp()


def test_dropout_is_seeded_scaled_and_off_in_eval():
    from onemodel.tensors import functional as F

    x = Tensor.ones(1000)
    a = F.dropout(x, 0.25, training=True, generator=Generator(3))
    b = F.dropout(x, 0.25, training=True, generator=Generator(3))
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    kept = a.numpy()[a.numpy() != 0]
    np.testing.assert_allclose(kept, 1 / 0.75)
    assert 0.65 < kept.size / 1000 < 0.85
    assert F.dropout(x, 0.25, training=False) is x


def test_one_hot_matches_numpy():
    from onemodel.tensors import functional as F

    idx = Tensor.from_data([2, 0, 1], dtype=DType.I64)
    np.testing.assert_array_equal(F.one_hot(idx, 4).numpy(), np.eye(4, dtype=np.int64)[[2, 0, 1]])
    assert F.one_hot(idx).shape == (3, 3)
