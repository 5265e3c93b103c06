"""PyTorch names in training: nn.functional activations, activation and loss modules, and the
Module methods a PyTorch user calls first; each against torch forward and backward, and the
layers traced with a symbolic batch axis and run in the Session matching eager."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.tensors import DType, OneModelError, ShapeError, Tensor
from onemodel.tensors import functional as F
from onemodel.tracing import TraceError
from onemodel.training import (
    ELU,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    Hardsigmoid,
    Hardswish,
    L1Loss,
    LeakyReLU,
    Linear,
    LogSoftmax,
    Mish,
    Module,
    MSELoss,
    NLLLoss,
    PReLU,
    Sequential,
    SiLU,
    SmoothL1Loss,
    Softplus,
)

torch = pytest.importorskip("torch")
TF = torch.nn.functional


def f32(*shape, seed=0, scale=2.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def grads_match(ours, theirs, a, *, rtol=1e-5, atol=1e-6):
    """Forward equal to torch's, and the input gradient of a random projection."""
    x, tx = Tensor(a.copy(), requires_grad=True), torch.tensor(a.copy(), requires_grad=True)
    y, ty = ours(x), theirs(tx)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=rtol, atol=atol)
    w = f32(*ty.shape, seed=7)
    (y * Tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("name, ours, theirs", [
    ("leaky_relu", lambda x: F.leaky_relu(x), lambda t: TF.leaky_relu(t)),
    ("leaky_relu_0.2", lambda x: F.leaky_relu(x, 0.2), lambda t: TF.leaky_relu(t, 0.2)),
    ("silu", F.silu, TF.silu),
    ("elu", lambda x: F.elu(x, alpha=0.7), lambda t: TF.elu(t, alpha=0.7)),
    ("mish", F.mish, TF.mish),
    ("hardswish", F.hardswish, TF.hardswish),
    ("hardsigmoid", F.hardsigmoid, TF.hardsigmoid),
    ("softplus", F.softplus, TF.softplus),
    ("softplus_beta", lambda x: F.softplus(x, beta=2.0, threshold=3.0),
     lambda t: TF.softplus(t, beta=2.0, threshold=3.0)),
    ("normalize", F.normalize, TF.normalize),
    ("normalize_p1_dim", lambda x: F.normalize(x, p=1.0, dim=-1),
     lambda t: TF.normalize(t, p=1.0, dim=-1)),
    ("log_softmax_axis", lambda x: F.log_softmax(x, axis=1), lambda t: TF.log_softmax(t, dim=1)),
])
def test_functional_matches_torch(name, ours, theirs):
    grads_match(ours, theirs, f32(4, 3, 5))


def test_softplus_does_not_overflow_far_past_the_threshold():
    grads_match(F.softplus, TF.softplus, np.array([-200.0, -30.0, 0.0, 30.0, 200.0], np.float32))
    grads_match(F.elu, TF.elu, np.array([-200.0, -1.0, 0.0, 1.0, 200.0], np.float32))


def test_normalize_clamps_a_zero_norm_to_eps():
    a = np.zeros((2, 3), np.float32)
    np.testing.assert_array_equal(F.normalize(Tensor(a)).numpy(), TF.normalize(torch.tensor(a)))


MODULES = [
    (lambda: LeakyReLU(0.1), lambda: torch.nn.LeakyReLU(0.1)),
    (SiLU, torch.nn.SiLU),
    (lambda: ELU(0.5), lambda: torch.nn.ELU(0.5)),
    (Mish, torch.nn.Mish),
    (Hardswish, torch.nn.Hardswish),
    (Hardsigmoid, torch.nn.Hardsigmoid),
    (lambda: Softplus(beta=1.5, threshold=4.0), lambda: torch.nn.Softplus(1.5, 4.0)),
    (PReLU, torch.nn.PReLU),
    (lambda: PReLU(3, init=0.1), lambda: torch.nn.PReLU(3, init=0.1)),
    (lambda: LogSoftmax(dim=1), lambda: torch.nn.LogSoftmax(dim=1)),
]


@pytest.mark.parametrize("make, make_torch", MODULES)
def test_activation_module_matches_torch_and_traces_with_a_symbolic_batch(make, make_torch):
    ours, theirs = make(), make_torch()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    grads_match(ours, theirs, f32(4, 3, 5))
    for (_, p), tp in zip(ours.named_parameters(), theirs.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-5, atol=1e-6)
    traced = ours.eval().trace(Tensor(f32(2, 3, 5)), "batch", None, None)
    for n in (1, 6):
        a = f32(n, 3, 5, seed=n)
        np.testing.assert_allclose(traced.run({"input": a})["output"].numpy(),
                                   ours(Tensor(a)).numpy(), rtol=1e-6, atol=1e-6)


def test_prelu_refuses_a_channel_count_that_does_not_fit():
    with pytest.raises(ShapeError, match="3 slopes need 3 channels"):
        PReLU(3)(Tensor(f32(2, 4)))


# loss modules ------------------------------------------------------------------------------------

def _loss_inputs():
    logits = f32(6, 4, seed=1)
    labels = np.array([0, 3, 1, -100, 2, 3], np.int64)
    return logits, labels


@pytest.mark.parametrize("make, make_torch, target", [
    (MSELoss, torch.nn.MSELoss, "float"),
    (lambda: L1Loss("sum"), lambda: torch.nn.L1Loss(reduction="sum"), "float"),
    (lambda: SmoothL1Loss(beta=0.5), lambda: torch.nn.SmoothL1Loss(beta=0.5), "float"),
    (lambda: BCEWithLogitsLoss(pos_weight=Tensor(np.float32([1, 2, 0.5, 3]))),
     lambda: torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor([1, 2, 0.5, 3])), "prob"),
    (lambda: CrossEntropyLoss(label_smoothing=0.1),
     lambda: torch.nn.CrossEntropyLoss(label_smoothing=0.1), "label"),
    (lambda: CrossEntropyLoss(weight=Tensor(np.float32([1, 2, 3, 4])), reduction="sum"),
     lambda: torch.nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2, 3, 4]), reduction="sum"),
     "label"),
    (lambda: NLLLoss(reduction="none"), lambda: torch.nn.NLLLoss(reduction="none"), "label"),
])
def test_loss_module_matches_torch(make, make_torch, target):
    logits, labels = _loss_inputs()
    if target == "label":
        y = labels
    elif target == "prob":
        y = (f32(6, 4, seed=3) > 0).astype(np.float32)
    else:
        y = f32(6, 4, seed=4)
    ours, theirs = make(), make_torch()
    grads_match(lambda x: ours(x, Tensor(y)), lambda t: theirs(t, torch.tensor(y)), logits)


def test_loss_modules_refuse_a_bad_reduction_and_tracing():
    with pytest.raises(OneModelError, match="reduction must be"):
        MSELoss("avg")

    class WithLoss(Module):
        def __init__(self):
            super().__init__()
            self.loss = MSELoss()

        def forward(self, x):
            return self.loss(x, x * 0)

    with pytest.raises(TraceError, match="losses have no place in an inference graph"):
        WithLoss().trace(Tensor(f32(2, 3)), "batch", None)


# Module methods ----------------------------------------------------------------------------------

def _pair():
    ours = Sequential(Linear(3, 4), LeakyReLU(), Linear(4, 2))
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LeakyReLU(), torch.nn.Linear(4, 2))
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    return ours, theirs


def test_module_to_cpu_and_dtype_and_refusals():
    ours, theirs = _pair()
    assert ours.to("cpu") is ours and ours.to(device="cpu") is ours
    ours.to("cpu", DType.F64)
    theirs.to("cpu", torch.float64)
    assert all(p.dtype is DType.F64 for p in ours.parameters())
    a = f32(5, 3).astype(np.float64)
    np.testing.assert_allclose(ours(Tensor(a)).numpy(), theirs(torch.tensor(a)).detach().numpy(),
                               rtol=1e-12)
    assert ours.half().to(dtype=DType.F32) is ours
    assert all(p.dtype is DType.F32 for p in ours.parameters())
    with pytest.raises(OneModelError, match="device 'cuda'"):  # no CUDA backend usable here
        ours.to("cuda")
    with pytest.raises(OneModelError, match="must be floating"):
        ours.to(DType.I64)


def test_requires_grad_apply_named_buffers_and_zero_grad_follow_torch():
    ours, theirs = _pair()
    ours.requires_grad_(False)
    theirs.requires_grad_(False)
    assert [p.requires_grad for p in ours.parameters()] == \
        [p.requires_grad for p in theirs.parameters()] == [False] * 4
    ours[0].requires_grad_()
    seen, seen_torch = [], []
    ours.apply(lambda m: seen.append(type(m).__name__))
    theirs.apply(lambda m: seen_torch.append(type(m).__name__))
    assert seen == seen_torch  # children before their parent
    bn = torch.nn.BatchNorm1d(3)
    from onemodel.training import BatchNorm1d

    assert [n for n, _ in BatchNorm1d(3).named_buffers()] == [n for n, _ in bn.named_buffers()]
    ours(Tensor(f32(2, 3))).sum().backward()
    grads = [p.grad for p in ours.parameters()]
    assert grads[0] is not None and grads[2] is None
    ours.zero_grad(set_to_none=False)
    assert np.all(ours[0].weight.grad.numpy() == 0) and ours[2].weight.grad is None
    ours.zero_grad()
    assert ours[0].weight.grad is None


def test_a_model_moved_with_torch_names_traces_and_matches_eager():
    ours, _ = _pair()
    model = Sequential(ours, SiLU(), PReLU(2)).to("cpu").requires_grad_(False).eval()
    traced = model.trace(Tensor(f32(3, 3)), "batch", None)
    for n in (1, 7):
        a = f32(n, 3, seed=n)
        np.testing.assert_allclose(traced.run({"input": a})["output"].numpy(),
                                   model(Tensor(a)).numpy(), rtol=1e-5, atol=1e-6)
