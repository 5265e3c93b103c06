"""Every layer, forward and backward, against PyTorch on random inputs (float64): PyTorch's
weights are copied in through load_state_dict, so state-dict names must match too."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel import training as T
from onemodel.tensors import DType, Generator, Tensor

torch = pytest.importorskip("torch")
nn = torch.nn

CASES = [
    ("Linear", lambda: T.Linear(5, 3), lambda: nn.Linear(5, 3), (4, 5)),
    ("Linear_nobias", lambda: T.Linear(5, 3, bias=False), lambda: nn.Linear(5, 3, bias=False),
     (2, 4, 5)),
    ("Conv1d", lambda: T.Conv1d(3, 4, 3, stride=2, padding=1), lambda: nn.Conv1d(3, 4, 3, 2, 1),
     (2, 3, 9)),
    ("Conv2d", lambda: T.Conv2d(4, 6, 3, padding=1, groups=2),
     lambda: nn.Conv2d(4, 6, 3, padding=1, groups=2), (2, 4, 5, 5)),
    ("Conv2d_dilated", lambda: T.Conv2d(2, 3, (3, 2), stride=(1, 2), dilation=2),
     lambda: nn.Conv2d(2, 3, (3, 2), stride=(1, 2), dilation=2), (1, 2, 8, 7)),
    ("ConvTranspose2d", lambda: T.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1),
     lambda: nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1), (2, 3, 4, 4)),
    ("MaxPool2d", lambda: T.MaxPool2d(2), lambda: nn.MaxPool2d(2), (2, 3, 6, 6)),
    ("AvgPool2d", lambda: T.AvgPool2d(3, 2, 1), lambda: nn.AvgPool2d(3, 2, 1), (2, 3, 7, 7)),
    ("AdaptiveAvgPool2d", lambda: T.AdaptiveAvgPool2d((2, 3)), lambda: nn.AdaptiveAvgPool2d((2, 3)),
     (2, 3, 5, 7)),
    ("BatchNorm1d_train", lambda: T.BatchNorm1d(4), lambda: nn.BatchNorm1d(4), (8, 4)),
    ("BatchNorm1d_3d", lambda: T.BatchNorm1d(4), lambda: nn.BatchNorm1d(4), (8, 4, 3)),
    ("BatchNorm2d_train", lambda: T.BatchNorm2d(3), lambda: nn.BatchNorm2d(3), (4, 3, 5, 5)),
    ("BatchNorm2d_eval", lambda: T.BatchNorm2d(3).eval(), lambda: nn.BatchNorm2d(3).eval(),
     (4, 3, 5, 5)),
    ("LayerNorm", lambda: T.LayerNorm(6), lambda: nn.LayerNorm(6), (2, 3, 6)),
    ("GroupNorm", lambda: T.GroupNorm(2, 4), lambda: nn.GroupNorm(2, 4), (2, 4, 3, 3)),
    ("Dropout_eval", lambda: T.Dropout(0.5).eval(), lambda: nn.Dropout(0.5).eval(), (3, 4)),
    ("ReLU", T.ReLU, nn.ReLU, (3, 4)),
    ("GELU", T.GELU, nn.GELU, (3, 4)),
    ("GELU_tanh", lambda: T.GELU("tanh"), lambda: nn.GELU("tanh"), (3, 4)),
    ("Tanh", T.Tanh, nn.Tanh, (3, 4)),
    ("Sigmoid", T.Sigmoid, nn.Sigmoid, (3, 4)),
    ("Softmax", lambda: T.Softmax(1), lambda: nn.Softmax(1), (3, 4)),
    ("Flatten", T.Flatten, nn.Flatten, (2, 3, 4)),
    ("Identity", T.Identity, nn.Identity, (2, 3)),
    ("Sequential", lambda: T.Sequential(T.Linear(4, 8), T.ReLU(), T.Linear(8, 2)),
     lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), (5, 4)),
    ("MultiheadAttention", lambda: T.MultiheadAttention(8, 2),
     lambda: nn.MultiheadAttention(8, 2), (5, 3, 8)),
    ("MultiheadAttention_batch_first", lambda: T.MultiheadAttention(8, 4, batch_first=True),
     lambda: nn.MultiheadAttention(8, 4, batch_first=True), (3, 5, 8)),
    ("TransformerEncoderLayer",
     lambda: T.TransformerEncoderLayer(8, 2, 16, dropout=0.0),
     lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0), (5, 3, 8)),
    ("TransformerEncoderLayer_norm_first_gelu",
     lambda: T.TransformerEncoderLayer(8, 2, 16, dropout=0.0, norm_first=True, activation="gelu",
                                       batch_first=True),
     lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, norm_first=True,
                                        activation="gelu", batch_first=True), (3, 5, 8)),
]


def _call(module, x, theirs=False):
    if isinstance(module, (T.MultiheadAttention, nn.MultiheadAttention)):
        out, weights = module(x, x, x)
        return out, weights
    return module(x), None


@pytest.mark.parametrize("name,ours_fn,theirs_fn,shape", CASES, ids=[c[0] for c in CASES])
def test_layer_matches_torch(name, ours_fn, theirs_fn, shape):
    torch.manual_seed(0)
    theirs = theirs_fn().double()
    if "train" in name or name == "Sequential":
        theirs.train()
    ours = ours_fn().to(DType.F64)
    ours.train(theirs.training)
    assert list(ours.state_dict()) == list(theirs.state_dict()), "state-dict names differ"
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})

    x = np.random.default_rng(1).standard_normal(shape)
    tx = torch.tensor(x, requires_grad=True)
    ox = Tensor.from_numpy(x.copy()).requires_grad_()
    tout, tw = _call(theirs, tx)
    oout, ow = _call(ours, ox)
    np.testing.assert_allclose(oout.numpy(), tout.detach().numpy(), rtol=1e-9, atol=1e-10)
    if tw is not None:
        np.testing.assert_allclose(ow.numpy(), tw.detach().numpy(), rtol=1e-9, atol=1e-10)
    g = np.random.default_rng(2).standard_normal(tout.shape)
    tout.backward(torch.tensor(g))
    oout.backward(Tensor.from_numpy(g))
    np.testing.assert_allclose(ox.grad.numpy(), tx.grad.numpy(), rtol=1e-8, atol=1e-10)
    tparams = dict(theirs.named_parameters())
    for pname, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), tparams[pname].grad.numpy(), rtol=1e-8,
                                   atol=1e-10, err_msg=pname)
    for bname, b in theirs.named_buffers():
        np.testing.assert_allclose(ours.state_dict()[bname].numpy(), b.numpy(), rtol=1e-7,
                                   err_msg=bname)


def test_embedding_matches_torch():
    theirs = nn.Embedding(10, 4, padding_idx=0).double()
    ours = T.Embedding(10, 4, padding_idx=0).to(DType.F64)
    ours.load_state_dict({"weight": theirs.weight.detach().numpy()})
    idx = np.array([[1, 0, 3], [9, 3, 0]])
    tout = theirs(torch.tensor(idx))
    oout = ours(Tensor.from_numpy(idx))
    np.testing.assert_allclose(oout.numpy(), tout.detach().numpy())
    g = np.random.default_rng(0).standard_normal(tout.shape)
    tout.backward(torch.tensor(g))
    oout.backward(Tensor.from_numpy(g))
    np.testing.assert_allclose(ours.weight.grad.numpy(), theirs.weight.grad.numpy())


def test_attention_masks_match_torch():
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(8, 2, batch_first=True).double()
    ours = T.MultiheadAttention(8, 2, batch_first=True).to(DType.F64)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    x = np.random.default_rng(3).standard_normal((2, 4, 8))
    pad = np.array([[False, False, True, True], [False, False, False, True]])
    causal = np.triu(np.ones((4, 4), bool), 1)
    tout, tw = theirs(*(torch.tensor(x),) * 3, key_padding_mask=torch.tensor(pad),
                      attn_mask=torch.tensor(causal))
    oout, ow = ours(*(Tensor.from_numpy(x),) * 3, key_padding_mask=Tensor.from_numpy(pad),
                    attn_mask=Tensor.from_numpy(causal))
    np.testing.assert_allclose(oout.numpy(), tout.detach().numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ow.numpy(), tw.detach().numpy(), rtol=1e-9, atol=1e-12)


def test_same_generator_seed_gives_same_weights():
    a = T.Conv2d(3, 4, 3, generator=Generator(7))
    b = T.Conv2d(3, 4, 3, generator=Generator(7))
    c = T.Conv2d(3, 4, 3, generator=Generator(8))
    np.testing.assert_array_equal(a.weight.numpy(), b.weight.numpy())
    assert not np.array_equal(a.weight.numpy(), c.weight.numpy())
    bound = 1 / np.sqrt(3 * 9)  # PyTorch's default: kaiming_uniform(a=sqrt(5)) = 1/sqrt(fan_in)
    assert np.abs(a.weight.numpy()).max() <= bound and np.abs(a.bias.numpy()).max() <= bound
