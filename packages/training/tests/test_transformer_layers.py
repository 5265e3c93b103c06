"""TransformerEncoder, TransformerDecoderLayer and TransformerDecoder against torch.nn (post- and
pre-norm, batch_first or not, causal and padding masks): forward, input and parameter gradients;
traced with symbolic batch and sequence axes and run in the Session."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.tensors import OneModelError, Tensor
from onemodel.tracing import Tracer
from onemodel.training import (
    LayerNorm,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

torch = pytest.importorskip("torch")
tnn = torch.nn
D, H, FF = 16, 4, 24


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _masks(n, length, source, seed):
    """A bool causal mask (L, L) (True: may not attend), a bool memory mask (L, S) and bool key
    padding masks."""
    causal = np.triu(np.ones((length, length), bool), 1)
    rng = np.random.default_rng(seed)
    mem_mask = rng.random((length, source)) < 0.3
    mem_mask[:, 0] = False  # every query keeps a key
    tgt_pad = np.zeros((n, length), bool)
    tgt_pad[0, -2:] = True
    src_pad = np.zeros((n, source), bool)
    src_pad[-1, -1] = True
    return causal, mem_mask, tgt_pad, src_pad


def _compare(outs, grads_ours, grads_theirs, keep=None):
    o, t = outs
    if keep is not None:
        o, t = o[keep], t[keep]
    np.testing.assert_allclose(o, t, rtol=1e-4, atol=1e-5)
    for name, g, tg in zip(*grads_ours, grads_theirs):
        np.testing.assert_allclose(g, tg, rtol=1e-4, atol=2e-5, err_msg=name)


def _seq(a, batch_first):
    return a if batch_first else np.ascontiguousarray(a.transpose(1, 0, 2))


@pytest.mark.parametrize("norm_first,batch_first", [(False, True), (True, False)])
def test_encoder_matches_torch(norm_first, batch_first):
    kw = dict(dim_feedforward=FF, dropout=0.0, batch_first=batch_first, norm_first=norm_first)
    ours = TransformerEncoder(TransformerEncoderLayer(D, H, **kw), 2, norm=LayerNorm(D))
    theirs = tnn.TransformerEncoder(tnn.TransformerEncoderLayer(D, H, **kw), 2,
                                    norm=tnn.LayerNorm(D), enable_nested_tensor=False)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for p in theirs.parameters():  # distinct weights per layer, so a mix-up would show
        torch.nn.init.normal_(p.data, std=0.3)
    ours.load_state_dict(theirs.state_dict())
    n, length = 3, 6
    causal, _, pad, _ = _masks(n, length, length, 1)
    a = _seq(f32(n, length, D), batch_first)
    x, tx = Tensor(a.copy(), requires_grad=True), torch.tensor(a.copy(), requires_grad=True)
    y = ours(x, mask=Tensor(causal), src_key_padding_mask=Tensor(pad), is_causal=True)
    ty = theirs(tx, mask=torch.tensor(causal), src_key_padding_mask=torch.tensor(pad),
                is_causal=True)
    w = f32(*ty.shape, seed=9)
    (y * Tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    names = [k for k, _ in ours.named_parameters()]
    _compare((y.numpy(), ty.detach().numpy()),
             (["input", *names], [x.grad.numpy(), *(p.grad.numpy() for p in ours.parameters())]),
             [tx.grad.numpy(), *(p.grad.numpy() for p in theirs.parameters())])


@pytest.mark.parametrize("norm_first,batch_first,activation", [
    (False, True, "relu"), (True, False, "gelu"), (True, True, "relu")])
def test_decoder_matches_torch(norm_first, batch_first, activation):
    kw = dict(dim_feedforward=FF, dropout=0.0, batch_first=batch_first, norm_first=norm_first,
              activation=activation)
    ours = TransformerDecoder(TransformerDecoderLayer(D, H, **kw), 2, norm=LayerNorm(D))
    theirs = tnn.TransformerDecoder(tnn.TransformerDecoderLayer(D, H, **kw), 2,
                                    norm=tnn.LayerNorm(D))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for p in theirs.parameters():
        torch.nn.init.normal_(p.data, std=0.3)
    ours.load_state_dict(theirs.state_dict())
    n, length, source = 2, 5, 7
    causal, mem_mask, tgt_pad, src_pad = _masks(n, length, source, 2)
    # the target's masks as float (added to the scores), the memory's as bool: both kinds
    causal = np.where(causal, -np.inf, 0).astype(np.float32)
    tgt_pad = np.where(tgt_pad, -np.inf, 0).astype(np.float32)
    ta, ma = _seq(f32(n, length, D, seed=1), batch_first), _seq(f32(n, source, D, seed=2),
                                                                batch_first)
    tgt, mem = Tensor(ta.copy(), requires_grad=True), Tensor(ma.copy(), requires_grad=True)
    ttgt = torch.tensor(ta.copy(), requires_grad=True)
    tmem = torch.tensor(ma.copy(), requires_grad=True)
    y = ours(tgt, mem, tgt_mask=Tensor(causal), memory_mask=Tensor(mem_mask),
             tgt_key_padding_mask=Tensor(tgt_pad), memory_key_padding_mask=Tensor(src_pad),
             tgt_is_causal=True)
    ty = theirs(ttgt, tmem, tgt_mask=torch.tensor(causal), memory_mask=torch.tensor(mem_mask),
                tgt_key_padding_mask=torch.tensor(tgt_pad),
                memory_key_padding_mask=torch.tensor(src_pad), tgt_is_causal=True)
    w = f32(*ty.shape, seed=9)
    (y * Tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    names = [k for k, _ in ours.named_parameters()]
    _compare((y.numpy(), ty.detach().numpy()),
             (["tgt", "memory", *names],
              [tgt.grad.numpy(), mem.grad.numpy(), *(p.grad.numpy() for p in ours.parameters())]),
             [ttgt.grad.numpy(), tmem.grad.numpy(), *(p.grad.numpy() for p in theirs.parameters())])


def test_single_decoder_layer_matches_torch_without_masks():
    ours = TransformerDecoderLayer(D, H, FF, dropout=0.0)
    theirs = tnn.TransformerDecoderLayer(D, H, FF, dropout=0.0)
    ours.load_state_dict(theirs.state_dict())
    t, m = f32(4, 2, D, seed=3), f32(6, 2, D, seed=4)
    np.testing.assert_allclose(ours(Tensor(t), Tensor(m)).numpy(),
                               theirs(torch.tensor(t), torch.tensor(m)).detach().numpy(),
                               rtol=1e-4, atol=1e-5)


def test_layers_are_independent_copies():
    enc = TransformerEncoder(TransformerEncoderLayer(D, H, FF), 3)
    w0, w1 = enc.layers[0].linear1.weight, enc.layers[1].linear1.weight
    assert w0 is not w1
    np.testing.assert_array_equal(w0.numpy(), w1.numpy())  # cloned, as torch does
    w0._data[...] = 0
    assert np.any(w1.numpy())
    with pytest.raises(OneModelError, match="num_layers"):
        TransformerDecoder(TransformerDecoderLayer(D, H, FF), 0)
    with pytest.raises(OneModelError, match="activation"):
        TransformerDecoderLayer(D, H, FF, activation="swish")


def test_attention_traces_when_an_example_length_equals_the_head_count():
    """4 heads of width 4 and a target of example length 4: the layer's own reshape sizes stay
    constants instead of being read as the symbolic length."""
    dec = TransformerDecoderLayer(D, H, FF, batch_first=True).eval()

    def decode(tgt, memory):
        return dec(tgt, memory)

    traced = Tracer(decode).trace(
        {"tgt": Tensor(f32(2, 4, D)), "memory": Tensor(f32(2, 6, D, seed=1))},
        axes={"tgt": ("batch", "tgt_len", None), "memory": ("batch", "src_len", None)},
        output_names=["output"])
    t, m = f32(3, 5, D, seed=5), f32(3, 2, D, seed=6)
    np.testing.assert_allclose(traced.run({"tgt": t, "memory": m})["output"].numpy(),
                               decode(Tensor(t), Tensor(m)).numpy(), rtol=1e-4, atol=1e-5)


def test_encoder_and_decoder_trace_with_symbolic_batch_and_sequence():
    enc = TransformerEncoder(TransformerEncoderLayer(D, H, FF, batch_first=True), 2,
                             norm=LayerNorm(D)).eval()
    traced = enc.trace(Tensor(f32(3, 5, D)), "batch", "seq", None)
    for n, length in ((1, 3), (4, 9)):
        a = f32(n, length, D, seed=n)
        np.testing.assert_allclose(traced.run({"input": a})["output"].numpy(),
                                   enc(Tensor(a)).numpy(), rtol=1e-4, atol=1e-5)
    dec = TransformerDecoder(TransformerDecoderLayer(D, H, FF, batch_first=True,
                                                     norm_first=True), 2).eval()

    def decode(tgt, memory):
        return dec(tgt, memory, tgt_is_causal=True)

    traced = Tracer(decode).trace(
        {"tgt": Tensor(f32(3, 5, D)), "memory": Tensor(f32(3, 7, D, seed=1))},
        axes={"tgt": ("batch", "tgt_len", None), "memory": ("batch", "src_len", None)},
        output_names=["output"])
    for n, lt, ls in ((1, 2, 3), (3, 7, 5)):
        t, m = f32(n, lt, D, seed=lt), f32(n, ls, D, seed=ls)
        np.testing.assert_allclose(traced.run({"tgt": t, "memory": m})["output"].numpy(),
                                   decode(Tensor(t), Tensor(m)).numpy(), rtol=1e-4, atol=1e-5)
