"""Forward pre-hooks and hooks with removable handles, named_buffers, summary() (output shapes
checked against torch's forward hooks on the same model, counts against torch's parameters),
and the CTCLoss and KLDivLoss modules against torch."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.tensors import OneModelError, Tensor
from onemodel.training import (
    BatchNorm1d,
    BatchNorm2d,
    Conv2d,
    CTCLoss,
    Flatten,
    KLDivLoss,
    Linear,
    MaxPool2d,
    Module,
    ReLU,
    Sequential,
)

torch = pytest.importorskip("torch")
tnn = torch.nn


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_forward_hooks_see_modify_and_are_removed_like_torch():
    ours, theirs = Linear(3, 2), tnn.Linear(3, 2)
    ours.load_state_dict(theirs.state_dict())
    log = {"ours": [], "theirs": []}

    def pre(key):
        def hook(m, args):
            log[key].append(("pre", type(m).__name__, len(args)))
            return args[0] * 2  # a single value replaces the one argument
        return hook

    def post(key):
        def hook(m, args, out):
            log[key].append(("post", len(args)))
            return out + 1
        return hook

    handles = [ours.register_forward_pre_hook(pre("ours")), ours.register_forward_hook(post("ours"))]
    t_handles = [theirs.register_forward_pre_hook(pre("theirs")),
                 theirs.register_forward_hook(post("theirs"))]
    a = f32(4, 3)
    y = ours(Tensor(a))
    with torch.no_grad():
        ty = theirs(torch.tensor(a))
    np.testing.assert_allclose(y.numpy(), ty.numpy(), rtol=1e-6, atol=1e-6)
    assert log["ours"] == [("pre", "Linear", 1), ("post", 1)]
    assert [e[0] for e in log["theirs"]] == ["pre", "post"]
    for h in handles:
        h.remove()
    for h in t_handles:
        h.remove()
    np.testing.assert_allclose(ours(Tensor(a)).numpy(), theirs(torch.tensor(a)).detach().numpy(),
                               rtol=1e-6, atol=1e-6)
    assert len(log["ours"]) == 2


def test_hook_order_prepend_kwargs_and_context_manager():
    order = []

    class Add(Module):
        def forward(self, x, scale=1.0):
            return x * scale

    m = Add()
    m.register_forward_hook(lambda mod, args, out: order.append("a"))
    m.register_forward_hook(lambda mod, args, out: order.append("b"), prepend=True)

    def kw_pre(mod, args, kwargs):
        return args, {**kwargs, "scale": 3.0}

    with m.register_forward_pre_hook(kw_pre, with_kwargs=True):
        y = m(Tensor(np.ones(2, np.float32)))
    np.testing.assert_array_equal(y.numpy(), [3.0, 3.0])
    assert order == ["b", "a"]
    np.testing.assert_array_equal(m(Tensor(np.ones(2, np.float32))).numpy(), [1.0, 1.0])
    seen = []
    m.register_forward_hook(lambda mod, args, kwargs, out: seen.append(kwargs), with_kwargs=True)
    m(Tensor(np.ones(2, np.float32)), scale=2.0)
    assert seen == [{"scale": 2.0}]
    with pytest.raises(OneModelError, match="callable"):
        m.register_forward_hook(3)
    m.register_forward_pre_hook(lambda mod, args, kwargs: 5, with_kwargs=True)
    with pytest.raises(OneModelError, match=r"\(args, kwargs\)"):
        m(Tensor(np.ones(2, np.float32)))


def test_hooks_collect_activations_in_a_trace_free_forward_and_backward():
    model = Sequential(Linear(3, 4), ReLU(), Linear(4, 2))
    acts = {}
    for name, mod in model.named_modules():
        if name:
            mod.register_forward_hook(lambda m, a, out, name=name: acts.__setitem__(name, out))
    x = Tensor(f32(5, 3), requires_grad=True)
    model(x).sum().backward()
    assert set(acts) == {"0", "1", "2"} and list(acts["1"].shape) == [5, 4]
    assert x.grad is not None


def test_named_buffers_match_torch():
    ours = Sequential(Conv2d(1, 2, 3), BatchNorm2d(2), Flatten(), BatchNorm1d(8))
    theirs = tnn.Sequential(tnn.Conv2d(1, 2, 3), tnn.BatchNorm2d(2), tnn.Flatten(),
                            tnn.BatchNorm1d(8))
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]
    assert [n for n, _ in ours.named_buffers(prefix="net")] == [
        n for n, _ in theirs.named_buffers(prefix="net")]


class OurNet(Module):
    def __init__(self):
        super().__init__()
        self.features = Sequential(Conv2d(3, 8, 3, padding=1), BatchNorm2d(8), ReLU(),
                                   MaxPool2d(2), Conv2d(8, 4, 3))
        self.flat = Flatten()
        self.head = Linear(4 * 2 * 2, 10)

    def forward(self, x):
        return self.head(self.flat(self.features(x)))


class TorchNet(tnn.Module):
    def __init__(self):
        super().__init__()
        self.features = tnn.Sequential(tnn.Conv2d(3, 8, 3, padding=1), tnn.BatchNorm2d(8),
                                       tnn.ReLU(), tnn.MaxPool2d(2), tnn.Conv2d(8, 4, 3))
        self.flat = tnn.Flatten()
        self.head = tnn.Linear(4 * 2 * 2, 10)

    def forward(self, x):
        return self.head(self.flat(self.features(x)))


def test_summary_shapes_and_counts_match_torch():
    ours, theirs = OurNet(), TorchNet()
    ours.features[0].requires_grad_(False)
    theirs.features[0].requires_grad_(False)
    ours.train()
    s = ours.summary(input_size=(2, 3, 8, 8))
    assert ours.training and all(m.training for m in ours.modules())  # mode restored
    t_shapes = {}
    for name, m in theirs.named_modules():
        m.register_forward_hook(lambda mod, a, out, name=name: t_shapes.__setitem__(name,
                                                                                    list(out.shape)))
    with torch.no_grad():
        theirs.eval()(torch.zeros(2, 3, 8, 8))
    assert [r.name for r in s.rows] == [n for n, _ in theirs.named_modules()]
    for r in s.rows:
        assert r.output_shape == t_shapes[r.name], r.name
        tm = dict(theirs.named_modules())[r.name]
        assert r.params == sum(p.numel() for p in tm.parameters()), r.name
    assert s.total_params == sum(p.numel() for p in theirs.parameters())
    assert s.trainable_params == sum(p.numel() for p in theirs.parameters() if p.requires_grad)
    assert s.non_trainable_params == 3 * 8 * 9 + 8
    text = str(s)
    assert "features.0 (Conv2d)" in text and f"Total params: {s.total_params:,}" in text
    # depth limits the rows; an example tensor works like input_size; no input: counts only
    assert [r.name for r in ours.summary(Tensor(np.zeros((1, 3, 8, 8), np.float32)),
                                         depth=1).rows] == ["", "features", "flat", "head"]
    assert all(r.output_shape is None for r in ours.summary().rows)
    with pytest.raises(OneModelError, match="not both"):
        ours.summary(Tensor(np.zeros((1, 3, 8, 8), np.float32)), input_size=(1, 3, 8, 8))


@pytest.mark.parametrize("reduction", ["mean", "batchmean", "sum", "none"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div_loss_matches_torch(reduction, log_target):
    logits = f32(4, 5)
    p = np.exp(f32(4, 5, seed=1))
    p /= p.sum(1, keepdims=True)
    p[0, 2] = 0.0  # a zero target contributes 0, as in torch
    target = np.log(np.where(p > 0, p, 1e-30)).astype(np.float32) if log_target else p
    x = Tensor(logits.copy(), requires_grad=True)
    tx = torch.tensor(logits.copy(), requires_grad=True)
    y = KLDivLoss(reduction, log_target)(x.log_softmax(1), Tensor(target))
    ty = tnn.KLDivLoss(reduction=reduction, log_target=log_target)(
        torch.log_softmax(tx, 1), torch.tensor(target))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-6)
    w = f32(*ty.shape, seed=2)
    (y * Tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(OneModelError, match="batchmean"):
        KLDivLoss("avg")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ctc_loss_module_matches_torch(reduction):
    t, n, c, s = 12, 3, 5, 4
    logits = f32(t, n, c)
    targets = np.random.default_rng(3).integers(1, c, (n, s))
    in_len, tgt_len = np.array([12, 10, 9]), np.array([4, 2, 3])
    x = Tensor(logits.copy(), requires_grad=True)
    tx = torch.tensor(logits.copy(), requires_grad=True)
    y = CTCLoss(reduction=reduction)(x.log_softmax(2), Tensor(targets), in_len, tgt_len)
    ty = tnn.CTCLoss(reduction=reduction)(torch.log_softmax(tx, 2), torch.tensor(targets),
                                         torch.tensor(in_len), torch.tensor(tgt_len))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    w = f32(*ty.shape, seed=2)
    (y * Tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_cross_entropy_with_label_smoothing_ignore_index_and_weight_matches_torch():
    """losses.cross_entropy (F.cross_entropy's counterpart) over every reduction, with and
    without smoothing, class weights, and the default or a real class as ignore_index."""
    import itertools

    from onemodel.training import losses

    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 5, 3)).astype(np.float32)  # K-dimensional: classes on axis 1
    base = rng.integers(0, 5, (6, 3))
    base[0, 0] = base[2, 1] = -100
    w = (rng.random(5) + 0.5).astype(np.float32)
    for red, ls, use_w, ii in itertools.product(["mean", "sum", "none"], [0.0, 0.2],
                                                [False, True], [-100, 2]):
        t = base if ii == -100 else np.where(base == -100, 0, base)
        xo, xt = Tensor(x.copy(), requires_grad=True), torch.tensor(x.copy(), requires_grad=True)
        y = losses.cross_entropy(xo, Tensor(t), Tensor(w) if use_w else None, ignore_index=ii,
                                 reduction=red, label_smoothing=ls)
        ty = torch.nn.functional.cross_entropy(xt, torch.tensor(t),
                                               torch.tensor(w) if use_w else None,
                                               ignore_index=ii, reduction=red,
                                               label_smoothing=ls)
        g = rng.standard_normal(ty.shape).astype(np.float32)
        (y * Tensor(g)).sum().backward()
        (ty * torch.tensor(g)).sum().backward()
        case = f"{red} smoothing={ls} weight={use_w} ignore={ii}"
        np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=case)
        np.testing.assert_allclose(xo.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=case)
