"""PyTorch's names on Tensor: size()/numel(), dim=/keepdim= beside axis=/keepdims=, and the
methods a PyTorch user reaches for first, each checked forward and backward against torch."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.tensors import DType, OneModelError, ShapeError, Tensor, cat, functional, split, stack

torch = pytest.importorskip("torch")


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def both(a: np.ndarray):
    """The same data as a OneModel leaf and a torch leaf, both requiring grad."""
    return Tensor(a.copy(), requires_grad=True), torch.tensor(a.copy(), requires_grad=True)


def check(ours, theirs, a=None, *, seed=1, rtol=1e-5, atol=1e-5):
    """Forward equal to torch's; backward of a random projection equal to torch's grad."""
    a = f32(3, 4, 5) if a is None else a
    x, tx = both(a)
    y, ty = ours(x), theirs(tx)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=rtol, atol=atol)
    w = f32(*ty.shape, seed=seed)
    (y * Tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=rtol, atol=atol)


# size / numel ------------------------------------------------------------------------------------

def test_size_is_the_shape_and_numel_counts_elements():
    x = Tensor(f32(2, 3, 4))
    assert x.size() == (2, 3, 4) and x.size(1) == 3 and x.size(-1) == 4
    assert x.numel() == 24 and Tensor(np.float32(1)).numel() == 1
    with pytest.raises(ShapeError, match="axis out of range"):
        x.size(3)


def test_size_and_numel_stay_symbolic_while_tracing():
    from onemodel.tracing import Tracer

    def f(x):
        return x.reshape(x.size(0), x.numel() // x.size(0)) * 2

    traced = Tracer(f).trace({"x": Tensor(f32(4, 3, 2))}, axes={"x": ("batch", None, None)})
    for n in (1, 5):
        a = f32(n, 3, 2, seed=n)
        np.testing.assert_allclose(traced.run({"x": a})["output"].numpy(), a.reshape(n, 6) * 2)


# dim / keepdim --------------------------------------------------------------------------------

def test_dim_and_keepdim_are_accepted_everywhere_axis_and_keepdims_are():
    a = f32(3, 4, 5)
    x, t = Tensor(a), torch.tensor(a)
    for name in ("sum", "mean", "amax", "amin"):
        ours = {"amax": "max", "amin": "min"}.get(name, name)
        got = getattr(x, ours)(dim=1, keepdim=True).numpy()
        np.testing.assert_allclose(got, getattr(t, name)(dim=1, keepdim=True).numpy(), rtol=1e-6)
    np.testing.assert_allclose(x.var(dim=2).numpy(), t.var(dim=2).numpy(), rtol=1e-5)
    np.testing.assert_array_equal(x.argmax(dim=0).numpy(), t.argmax(dim=0).numpy())
    np.testing.assert_array_equal(cat([x, x], dim=1).numpy(), torch.cat([t, t], dim=1).numpy())
    np.testing.assert_array_equal(stack([x, x], dim=2).numpy(), torch.stack([t, t], dim=2).numpy())
    for ours, theirs in zip(x.chunk(2, dim=1), t.chunk(2, dim=1)):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    for ours, theirs in zip(split(x, 2, dim=2), torch.split(t, 2, dim=2)):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    np.testing.assert_allclose(x.softmax(dim=1).numpy(), t.softmax(dim=1).numpy(), rtol=1e-5)
    np.testing.assert_allclose(functional.softmax(x, axis=0).numpy(), t.softmax(0).numpy(),
                               rtol=1e-5)
    assert x.squeeze(dim=None).shape == (3, 4, 5) and x.unsqueeze(dim=0).shape == (1, 3, 4, 5)


def test_both_spellings_at_once_are_refused():
    with pytest.raises(OneModelError, match="both dim= and axis="):
        Tensor(f32(2, 2)).sum(axis=0, dim=0)


# methods -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, ours, theirs", [
    ("view", lambda x: x.view(3, 20), lambda t: t.view(3, 20)),
    ("contiguous", lambda x: x.transpose(0, 1).contiguous(),
     lambda t: t.transpose(0, 1).contiguous()),
    ("masked_fill", lambda x: x.masked_fill(x > 0.3, -2.0), lambda t: t.masked_fill(t > 0.3, -2.0)),
    ("repeat", lambda x: x.repeat(2, 1, 3), lambda t: t.repeat(2, 1, 3)),
    ("repeat_new_axes", lambda x: x.repeat(2, 1, 1, 2), lambda t: t.repeat(2, 1, 1, 2)),
    ("flip", lambda x: x.flip(0, 2), lambda t: t.flip(0, 2)),
    ("flip_dims", lambda x: x.flip(dims=(1,)), lambda t: t.flip(dims=(1,))),
    ("clamp", lambda x: x.clamp(-0.5, 0.7), lambda t: t.clamp(-0.5, 0.7)),
    ("clamp_min", lambda x: x.clamp(min=0.1), lambda t: t.clamp(min=0.1)),
    ("maximum", lambda x: x.maximum(x.flip(1) * 0.5), lambda t: t.maximum(t.flip(1) * 0.5)),
    ("minimum", lambda x: x.minimum(x.flip(2) + 0.1), lambda t: t.minimum(t.flip(2) + 0.1)),
    ("tril", lambda x: x.tril(), lambda t: t.tril()),
    ("tril_k", lambda x: x.tril(-1), lambda t: t.tril(-1)),
    ("triu_k", lambda x: x.triu(diagonal=2), lambda t: t.triu(diagonal=2)),
    ("cumsum_last", lambda x: x.cumsum(dim=-1), lambda t: t.cumsum(dim=-1)),
    ("cumsum_mid", lambda x: x.cumsum(1), lambda t: t.cumsum(1)),
    ("norm", lambda x: x.norm(), lambda t: t.norm()),
    ("norm_dim", lambda x: x.norm(dim=1, keepdim=True), lambda t: t.norm(dim=1, keepdim=True)),
    ("norm_1", lambda x: x.norm(p=1, dim=2), lambda t: t.norm(p=1, dim=2)),
    ("norm_3", lambda x: x.norm(p=3, dim=0), lambda t: t.norm(p=3, dim=0)),
    ("norm_inf", lambda x: x.norm(p=float("inf"), dim=2), lambda t: t.norm(p=float("inf"), dim=2)),
    ("unbind", lambda x: stack(x.unbind(1), 0), lambda t: torch.stack(t.unbind(1), 0)),
    ("to_double", lambda x: x.to(DType.F64) * 3, lambda t: t.to(torch.float64) * 3),
    ("double", lambda x: x.double().float(), lambda t: t.double().float()),
    ("to_cpu", lambda x: x.to("cpu") * 2, lambda t: t.to("cpu") * 2),
])
def test_method_matches_torch_forward_and_backward(name, ours, theirs):
    check(ours, theirs)


def test_maximum_and_minimum_split_the_gradient_at_ties_as_torch_does():
    a = np.array([1.0, 2.0, 3.0], np.float32)
    b = np.array([1.0, 5.0, 0.0], np.float32)
    for name in ("maximum", "minimum"):
        x, tx = both(a)
        y, ty = both(b)
        getattr(x, name)(y).sum().backward()
        getattr(torch, name)(tx, ty).sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), tx.grad.numpy())
        np.testing.assert_array_equal(y.grad.numpy(), ty.grad.numpy())
    np.testing.assert_array_equal(Tensor(a).maximum(2).numpy(), np.maximum(a, 2))


def test_the_norm_of_a_zero_vector_has_a_zero_gradient_as_in_torch():
    a = np.array([[0.0, 0.0], [3.0, 4.0]], np.float32)
    check(lambda x: x.norm(dim=1), lambda t: t.norm(dim=1), a)
    check(lambda x: functional.normalize(x), lambda t: torch.nn.functional.normalize(t), a)


def test_conversions_give_torchs_dtypes():
    x = Tensor(np.array([-1.5, 0.0, 2.7], np.float32))
    t = torch.tensor([-1.5, 0.0, 2.7])
    pairs = [("long", DType.I64), ("int", DType.I32), ("bool", DType.BOOL), ("half", DType.F16),
             ("double", DType.F64), ("float", DType.F32)]
    for name, dt in pairs:
        got = getattr(x, name)()
        assert got.dtype is dt
        np.testing.assert_array_equal(got.numpy(), getattr(t, name)().numpy())
    assert x.to("cpu", DType.I64).dtype is DType.I64 and x.to(x.long()).dtype is DType.I64
    assert x.to("cpu") is x and x.contiguous() is x


def test_bad_arguments_say_what_to_do():
    x = Tensor(f32(2, 3))
    with pytest.raises(OneModelError, match="device 'cuda'"):  # no CUDA backend usable here
        x.to("cuda")
    with pytest.raises(OneModelError, match="mask must be BOOL"):
        x.masked_fill(Tensor(np.ones((2, 3), np.int64)), 0.0)
    with pytest.raises(ShapeError, match="one per axis"):
        x.repeat(2)
    with pytest.raises(ShapeError, match="at least 2 axes"):
        Tensor(f32(3)).tril()
    with pytest.raises(OneModelError, match="p must be"):
        x.norm(p=-1)


def test_new_methods_trace_with_a_symbolic_batch_axis():
    from onemodel.tracing import Tracer

    def f(x):
        y = x.masked_fill(x > 0.5, 0.0).clamp(-1, 1).maximum(x * 0.5).flip(2)
        return y.tril().cumsum(dim=2).repeat(1, 2, 1) + x.norm(dim=1, keepdim=True)

    traced = Tracer(f).trace({"x": Tensor(f32(2, 4, 4))}, axes={"x": ("batch", None, None)})
    for n in (1, 3):
        a = f32(n, 4, 4, seed=n)
        np.testing.assert_allclose(traced.run({"x": a})["output"].numpy(), f(Tensor(a)).numpy(),
                                   rtol=1e-5, atol=1e-5)
