"""More PyTorch names on Tensor: gather, topk, sort, argsort, roll, any/all with dim/keepdim,
DLPack both ways with numpy and torch (zero-copy), F.pad's reflect/replicate/circular modes;
forward and backward against torch, traced with a symbolic batch axis."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.tensors import OneModelError, ShapeError, Tensor, from_dlpack
from onemodel.tensors import functional as F

torch = pytest.importorskip("torch")


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def grads_match(ours, theirs, a, *, rtol=1e-5, atol=1e-6, out=lambda r: r):
    x, tx = Tensor(a.copy(), requires_grad=True), torch.tensor(a.copy(), requires_grad=True)
    y, ty = out(ours(x)), out(theirs(tx))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=rtol, atol=atol)
    w = f32(*ty.shape, seed=7)
    (y * Tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=rtol, atol=atol)


def traces(fn, a, *axes):
    """fn traced with the named axes symbolic agrees with eager at other sizes."""
    from onemodel.tracing import Tracer

    traced = Tracer(fn).trace({"input": Tensor(a)}, axes={"input": axes}, output_names=["output"])
    for n in (1, 4):
        b = f32(n, *a.shape[1:], seed=n)
        np.testing.assert_allclose(traced.run({"input": b})["output"].numpy(),
                                   fn(Tensor(b)).numpy(), rtol=1e-6, atol=1e-6)


IDX = np.random.default_rng(1).integers(0, 5, (3, 4, 2))


@pytest.mark.parametrize("dim,index", [
    (1, IDX),                         # the gathered axis longer, the others equal
    (2, IDX[:, :, :1] % 2),           # index shorter along the gathered axis
    (0, IDX[:2, :3, :] % 3),          # index shorter on the other axes (PyTorch allows it)
    (-1, IDX % 2),
])
def test_gather(dim, index):
    a = f32(3, 5, 2)
    grads_match(lambda x: x.gather(dim, Tensor(index)),
                lambda t: t.gather(dim, torch.tensor(index)), a)
    # keyword form, repeated indices add their gradients
    grads_match(lambda x: x.gather(dim=dim, index=index), lambda t: t.gather(dim, torch.tensor(index)), a)


def test_gather_refusals():
    x = Tensor(f32(3, 4))
    with pytest.raises(ShapeError, match="rank"):
        x.gather(0, np.zeros(3, np.int64))
    with pytest.raises(OneModelError, match="integers"):
        x.gather(0, np.zeros((3, 4), np.float32))
    with pytest.raises(ShapeError, match="out of range"):
        x.gather(2, np.zeros((3, 4), np.int64))


@pytest.mark.parametrize("kw", [dict(k=3), dict(k=2, dim=0), dict(k=4, dim=1, largest=False),
                                dict(k=1, dim=-1)])
def test_topk(kw):
    a = f32(4, 6)
    grads_match(lambda x: x.topk(**kw), lambda t: t.topk(**kw), a, out=lambda r: r.values)
    r, tr = Tensor(a).topk(**kw), torch.tensor(a).topk(**kw)
    np.testing.assert_array_equal(r.indices.numpy(), tr.indices.numpy())
    values, indices = r  # unpacks like torch's
    np.testing.assert_array_equal(indices.numpy(), tr[1].numpy())
    np.testing.assert_array_equal(values.numpy(), tr[0].numpy())
    with pytest.raises(ShapeError, match="k=7"):
        Tensor(a).topk(7)


@pytest.mark.parametrize("kw", [dict(), dict(dim=0), dict(dim=1, descending=True),
                                dict(descending=True, stable=True)])
def test_sort_and_argsort(kw):
    a = f32(5, 6)
    grads_match(lambda x: x.sort(**kw).values, lambda t: t.sort(**kw).values, a)
    np.testing.assert_array_equal(Tensor(a).sort(**kw).indices.numpy(),
                                  torch.tensor(a).sort(**kw).indices.numpy())
    np.testing.assert_array_equal(Tensor(a).argsort(**kw).numpy(),
                                  torch.tensor(a).argsort(**kw).numpy())
    # ties: equal elements keep their order, as torch's stable sort
    ties = np.array([[3.0, 1.0, 3.0, 1.0, 2.0, 3.0]], np.float32)
    tk = dict(kw, dim=-1)
    np.testing.assert_array_equal(Tensor(ties).sort(**tk).indices.numpy(),
                                  torch.tensor(ties).sort(stable=True, dim=-1,
                                                          descending=tk.get("descending", False))
                                  .indices.numpy())


@pytest.mark.parametrize("shifts,dims", [(2, 1), (-1, 0), (7, 1), ((1, -2), (0, 1)), (3, None),
                                         (0, 1)])
def test_roll(shifts, dims):
    a = f32(3, 5)
    grads_match(lambda x: x.roll(shifts, dims), lambda t: t.roll(shifts, dims), a)


@pytest.mark.parametrize("kw", [dict(), dict(dim=1), dict(dim=0, keepdim=True),
                                dict(axis=(0, 2)), dict(dim=-1, keepdim=True)])
def test_any_all(kw):
    a = (np.random.default_rng(2).random((3, 4, 2)) < 0.3)
    a[0] = True
    a[1] = False
    for op in ("any", "all"):
        tkw = {("dim" if k == "axis" else k): v for k, v in kw.items()}
        ours = getattr(Tensor(a), op)(**kw).numpy()
        theirs = (getattr(torch.tensor(a), op)(**tkw) if "dim" not in tkw or
                  isinstance(tkw["dim"], int) else
                  torch.tensor(getattr(np, op)(a, axis=tkw["dim"])))
        np.testing.assert_array_equal(ours, np.asarray(theirs))
        assert ours.dtype == np.bool_
    floats = np.array([[0.0, np.nan], [0.0, 0.0]], np.float32)  # NaN counts as true
    np.testing.assert_array_equal(Tensor(floats).any(dim=1).numpy(),
                                  torch.tensor(floats).any(dim=1).numpy())
    np.testing.assert_array_equal(Tensor(floats).all(dim=0).numpy(),
                                  torch.tensor(floats).all(dim=0).numpy())
    empty = np.zeros((0, 3), np.float32)
    assert not Tensor(empty).any().item() and Tensor(empty).all().item()


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular", "constant"])
@pytest.mark.parametrize("pad,shape", [((2, 1), (2, 3, 6)), ((1, 2, 2, 0), (2, 3, 5, 6))])
def test_pad_modes(mode, pad, shape):
    a = f32(*shape)
    grads_match(lambda x: F.pad(x, pad, mode=mode),
                lambda t: torch.nn.functional.pad(t, pad, mode=mode), a)
    traces(lambda x: F.pad(x, pad, mode=mode), a, "batch", *([None] * (len(shape) - 1)))


def test_new_methods_trace_with_a_symbolic_batch():
    def fn2(x):
        v = x.topk(2, dim=1).values.sum(dim=1) + x.sort(dim=1).values[:, 0]
        r = x.roll(1, 1)[:, 0]
        g = x.gather(1, x.argsort(dim=1)).sum(dim=1)
        return v + r + g + x.any(dim=1).cast("F32")

    traces(fn2, f32(3, 4), "batch", None)


def test_dlpack_zero_copy_with_numpy_and_torch():
    a = f32(3, 4)
    x = Tensor.from_numpy(a)
    # ours -> torch and numpy: the same memory
    t = torch.from_dlpack(x)
    n = np.from_dlpack(x)
    t[0, 0] = 42.0
    assert x.numpy()[0, 0] == 42.0 and n[0, 0] == 42.0
    assert x.__dlpack_device__() == t.__dlpack_device__()
    # torch and numpy -> ours: the same memory, dtypes kept
    for src, dtype in ((torch.arange(6, dtype=torch.int64).reshape(2, 3), "I64"),
                       (torch.ones(2, 2, dtype=torch.float64), "F64"),
                       (torch.tensor([True, False]), "BOOL")):
        y = from_dlpack(src)
        assert y.dtype.name == dtype and list(y.shape) == list(src.shape)
        np.testing.assert_array_equal(y.numpy(), src.numpy())
    src = torch.zeros(3)
    y = Tensor.from_dlpack(src)
    src[1] = 5.0
    assert y.numpy()[1] == 5.0
    arr = np.zeros(4, np.float32)
    z = from_dlpack(arr)
    arr[2] = 3.0
    assert z.numpy()[2] == 3.0
    # a strided torch view comes through with its strides
    view = torch.arange(12.0).reshape(3, 4)[:, ::2]
    np.testing.assert_array_equal(from_dlpack(view).numpy(), view.numpy())
    # refusals name the way out
    with pytest.raises(OneModelError, match="detach"):
        from_dlpack(torch.zeros(2, requires_grad=True))
    with pytest.raises(OneModelError, match="__dlpack__"):
        from_dlpack([1, 2])
    # a gradient flows through the imported tensor like any other
    g = from_dlpack(torch.ones(3).detach()).requires_grad_()
    (g * 2).sum().backward()
    np.testing.assert_array_equal(g.grad.numpy(), [2.0, 2.0, 2.0])
