"""RNN, LSTM, GRU and their cells against PyTorch: forward and backward with PyTorch's weights
copied in by state-dict name (float64), training parity (an LSTM sequence classifier and a GRU
encoder-decoder with teacher forcing), tracing with symbolic batch and sequence axes (Session and
onnxruntime), and PyTorch's own ONNX export of nn.LSTM/nn.GRU imported into OneModel."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel import training as T
from onemodel.tensors import DType, Generator, OneModelError, Tensor
from onemodel.training import losses

torch = pytest.importorskip("torch")
nn = torch.nn
TF = torch.nn.functional



@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """PyTorch's recurrent kernels spin badly when the machine is busy with other work."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


LAYERS = [
    ("RNN_tanh", lambda m: m.RNN(4, 5), {}, (6, 3, 4)),
    ("RNN_relu_2layer_bidir", lambda m: m.RNN(4, 5, 2, nonlinearity="relu", bidirectional=True),
     {}, (6, 3, 4)),
    ("LSTM", lambda m: m.LSTM(4, 5), {}, (6, 3, 4)),
    ("LSTM_2layer_bidir_batch_first",
     lambda m: m.LSTM(4, 5, num_layers=2, bidirectional=True, batch_first=True), {}, (3, 6, 4)),
    ("LSTM_states", lambda m: m.LSTM(4, 3, num_layers=2), {"states": True}, (5, 2, 4)),
    ("LSTM_nobias_unbatched", lambda m: m.LSTM(4, 3, bias=False), {}, (5, 4)),
    ("GRU", lambda m: m.GRU(4, 5), {}, (6, 3, 4)),
    ("GRU_bidir_states_batch_first",
     lambda m: m.GRU(4, 3, num_layers=2, bidirectional=True, batch_first=True),
     {"states": True}, (2, 5, 4)),
    ("GRU_nobias_3layer", lambda m: m.GRU(4, 3, num_layers=3, bias=False), {}, (5, 2, 4)),
]


def _copy(ours, theirs):
    assert list(ours.state_dict()) == list(theirs.state_dict()), "state-dict names differ"
    ours.load_state_dict({k: v.detach().numpy().copy() for k, v in theirs.state_dict().items()})


def _flat(out):
    """Every tensor of a (output, h_n) / (output, (h_n, c_n)) result, in order."""
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return [out]


@pytest.mark.parametrize("name,make,opts,shape", LAYERS, ids=[c[0] for c in LAYERS])
def test_layer_matches_torch(name, make, opts, shape):
    torch.manual_seed(0)
    theirs = make(nn).double()
    ours = make(T).to(DType.F64)
    _copy(ours, theirs)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape)
    t_in, o_in = [torch.tensor(x, requires_grad=True)], [Tensor.from_numpy(x.copy()).requires_grad_()]
    if opts.get("states"):
        d = 2 if theirs.bidirectional else 1
        batch = shape[0] if theirs.batch_first else shape[1]
        states = [rng.standard_normal((theirs.num_layers * d, batch, theirs.hidden_size))
                  for _ in range(2 if isinstance(theirs, nn.LSTM) else 1)]
        ts = [torch.tensor(s, requires_grad=True) for s in states]
        os_ = [Tensor.from_numpy(s.copy()).requires_grad_() for s in states]
        t_out = theirs(t_in[0], tuple(ts) if len(ts) == 2 else ts[0])
        o_out = ours(o_in[0], tuple(os_) if len(os_) == 2 else os_[0])
        t_in += ts
        o_in += os_
    else:
        t_out, o_out = theirs(t_in[0]), ours(o_in[0])
    t_flat, o_flat = _flat(t_out), _flat(o_out)
    assert len(t_flat) == len(o_flat)
    for o, t in zip(o_flat, t_flat):
        assert tuple(o.shape) == tuple(t.shape)
        np.testing.assert_allclose(o.numpy(), t.detach().numpy(), rtol=1e-9, atol=1e-10)
    gs = [rng.standard_normal(t.shape) for t in t_flat]
    torch.autograd.backward(t_flat, [torch.tensor(g) for g in gs])
    total = sum((o * Tensor.from_numpy(g)).sum() for o, g in zip(o_flat, gs))
    total.backward()
    for o, t in zip(o_in, t_in):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-9)
    tparams = dict(theirs.named_parameters())
    for pname, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), tparams[pname].grad.numpy(), rtol=1e-5,
                                   atol=1e-9, err_msg=pname)


CELLS = [
    ("RNNCell", lambda m: m.RNNCell(4, 5), 1),
    ("RNNCell_relu_nobias", lambda m: m.RNNCell(4, 5, bias=False, nonlinearity="relu"), 1),
    ("LSTMCell", lambda m: m.LSTMCell(4, 5), 2),
    ("GRUCell", lambda m: m.GRUCell(4, 5), 1),
]


@pytest.mark.parametrize("name,make,n_states", CELLS, ids=[c[0] for c in CELLS])
@pytest.mark.parametrize("with_state", [False, True])
def test_cell_matches_torch(name, make, n_states, with_state):
    torch.manual_seed(0)
    theirs = make(nn).double()
    ours = make(T).to(DType.F64)
    _copy(ours, theirs)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4))
    t_in, o_in = [torch.tensor(x, requires_grad=True)], [Tensor.from_numpy(x.copy()).requires_grad_()]
    # two steps: the second feeds the first's state back
    t_state = o_state = None
    if with_state:
        states = [rng.standard_normal((3, 5)) for _ in range(n_states)]
        ts = [torch.tensor(s, requires_grad=True) for s in states]
        os_ = [Tensor.from_numpy(s.copy()).requires_grad_() for s in states]
        t_in += ts
        o_in += os_
        t_state = tuple(ts) if n_states == 2 else ts[0]
        o_state = tuple(os_) if n_states == 2 else os_[0]
    t_state = theirs(t_in[0], t_state)
    o_state = ours(o_in[0], o_state)
    t_state = theirs(t_in[0] * 0.5, t_state)
    o_state = ours(o_in[0] * 0.5, o_state)
    t_flat, o_flat = _flat(t_state), _flat(o_state)
    for o, t in zip(o_flat, t_flat):
        np.testing.assert_allclose(o.numpy(), t.detach().numpy(), rtol=1e-9, atol=1e-10)
    gs = [rng.standard_normal(t.shape) for t in t_flat]
    torch.autograd.backward(t_flat, [torch.tensor(g) for g in gs])
    sum((o * Tensor.from_numpy(g)).sum() for o, g in zip(o_flat, gs)).backward()
    for o, t in zip(o_in, t_in):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-9)
    tparams = dict(theirs.named_parameters())
    for pname, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), tparams[pname].grad.numpy(), rtol=1e-5,
                                   atol=1e-9, err_msg=pname)
    # unbatched input
    x1 = rng.standard_normal(4)
    np.testing.assert_allclose(_flat(ours(Tensor.from_numpy(x1)))[0].numpy(),
                               _flat(theirs(torch.tensor(x1)))[0].detach().numpy(), rtol=1e-9)


def test_init_and_errors():
    lstm = T.LSTM(3, 16, num_layers=2, bidirectional=True, generator=Generator(0))
    bound = 1 / np.sqrt(16)
    names = list(lstm.state_dict())
    assert names == list(nn.LSTM(3, 16, num_layers=2, bidirectional=True).state_dict())
    for name, p in lstm.named_parameters():
        v = p.numpy()
        assert np.abs(v).max() <= bound and v.std() > bound / 3, name
    same = T.LSTM(3, 16, num_layers=2, bidirectional=True, generator=Generator(0))
    np.testing.assert_array_equal(same.weight_hh_l1_reverse.numpy(),
                                  lstm.weight_hh_l1_reverse.numpy())
    with pytest.raises(OneModelError, match="input_size=3"):
        lstm(Tensor.randn(5, 2, 4))
    with pytest.raises(OneModelError, match="h0 has shape"):
        lstm(Tensor.randn(5, 2, 3), (Tensor.randn(2, 2, 16), Tensor.randn(2, 2, 16)))
    with pytest.raises(OneModelError, match="nonlinearity"):
        T.RNN(3, 4, nonlinearity="gelu")
    with pytest.raises(OneModelError, match="proj_size"):
        T.LSTM(3, 4, proj_size=2)


def test_dropout_between_layers_only_in_training():
    torch.manual_seed(0)
    theirs = nn.GRU(4, 5, num_layers=2, dropout=0.5).double().eval()
    ours = T.GRU(4, 5, num_layers=2, dropout=0.5, generator=Generator(0)).to(DType.F64)
    _copy(ours, theirs)
    x = np.random.default_rng(0).standard_normal((6, 3, 4))
    ours.train()
    a = ours(Tensor.from_numpy(x))[0].numpy()
    b = ours(Tensor.from_numpy(x))[0].numpy()
    assert not np.allclose(a, b), "dropout between layers draws a new mask in training"
    ours.eval()
    np.testing.assert_allclose(ours(Tensor.from_numpy(x))[0].numpy(),
                               theirs(torch.tensor(x))[0].detach().numpy(), rtol=1e-9)


# training parity ---------------------------------------------------------------------------

class _Classifier:
    """Embedding -> LSTM (2 layers, bidirectional, batch first) -> last step -> Linear."""

    @staticmethod
    def build(m):
        class Net(m.Module):
            def __init__(self):
                super().__init__()
                self.emb = m.Embedding(12, 6)
                self.rnn = m.LSTM(6, 8, num_layers=2, bidirectional=True, batch_first=True)
                self.head = m.Linear(16, 3)

            def forward(self, tokens):
                out, _ = self.rnn(self.emb(tokens))
                return self.head(out[:, -1])

        return Net()


class _Seq2Seq:
    """GRU encoder -> its final state starts a GRU decoder fed the shifted targets (teacher
    forcing) -> Linear over the vocabulary."""

    @staticmethod
    def build(m):
        class Net(m.Module):
            def __init__(self):
                super().__init__()
                self.emb = m.Embedding(10, 6)
                self.encoder = m.GRU(6, 8, batch_first=True)
                self.decoder = m.GRU(6, 8, batch_first=True)
                self.out = m.Linear(8, 10)

            def forward(self, src, tgt_in):
                _, h = self.encoder(self.emb(src))
                y, _ = self.decoder(self.emb(tgt_in), h)
                return self.out(y)

        return Net()


def _train(ours, theirs, batches, loss_o, loss_t, steps, lr):
    o_opt = T.Adam(ours.parameters(), lr)
    t_opt = torch.optim.Adam(theirs.parameters(), lr)
    o_losses, t_losses = [], []
    for step in range(steps):
        arrays = batches(step)
        with T.ActivationScope():
            o_opt.zero_grad()
            lo = loss_o(ours, *[Tensor.from_numpy(a) for a in arrays])
            lo.backward()
            o_opt.step()
            o_losses.append(lo.item())
        t_opt.zero_grad()
        lt = loss_t(theirs, *[torch.from_numpy(a) for a in arrays])
        lt.backward()
        t_opt.step()
        t_losses.append(lt.item())
    np.testing.assert_allclose(o_losses, t_losses, rtol=1e-4)
    sd = theirs.state_dict()
    for name, value in ours.state_dict().items():
        np.testing.assert_allclose(value.numpy(), sd[name].detach().numpy(), rtol=1e-3, atol=1e-4,
                                   err_msg=name)
    assert o_losses[-1] < o_losses[0]


def test_lstm_sequence_classifier_trains_like_torch():
    torch.manual_seed(0)
    theirs = _Classifier.build(nn)
    ours = _Classifier.build(T)
    _copy(ours, theirs)

    def batches(step):
        r = np.random.default_rng(100 + step)
        tokens = r.integers(0, 12, (8, 7)).astype(np.int64)
        return tokens, (tokens[:, -1] % 3).astype(np.int64)  # the last token decides

    def loss_o(model, tokens, y):
        return losses.cross_entropy(model(tokens), y)

    def loss_t(model, tokens, y):
        return TF.cross_entropy(model(tokens), y)

    _train(ours, theirs, batches, loss_o, loss_t, 8, 1e-2)


def test_gru_encoder_decoder_teacher_forcing_trains_like_torch():
    torch.manual_seed(1)
    theirs = _Seq2Seq.build(nn)
    ours = _Seq2Seq.build(T)
    _copy(ours, theirs)

    def batches(step):
        r = np.random.default_rng(200 + step)
        src = r.integers(1, 10, (6, 5)).astype(np.int64)
        tgt = src[:, ::-1].copy()  # learn to reverse
        tgt_in = np.concatenate([np.zeros((6, 1), np.int64), tgt[:, :-1]], axis=1)
        return src, tgt_in, tgt

    def loss_o(model, src, tgt_in, tgt):
        logits = model(src, tgt_in)
        return losses.cross_entropy(logits.reshape(-1, 10), tgt.reshape(-1))

    def loss_t(model, src, tgt_in, tgt):
        return TF.cross_entropy(model(src, tgt_in).reshape(-1, 10), tgt.reshape(-1))

    _train(ours, theirs, batches, loss_o, loss_t, 8, 1e-2)


# tracing, saving and running elsewhere ------------------------------------------------------

class _Tagger(T.Module):
    """A traced LSTM/GRU stack: (batch, seq, features) -> per-step scores."""

    def __init__(self, kind):
        super().__init__()
        g = Generator(3)
        self.rnn = (T.LSTM(4, 6, num_layers=2, bidirectional=True, batch_first=True, generator=g)
                    if kind == "lstm" else
                    T.GRU(4, 6, num_layers=2, bidirectional=True, batch_first=True, generator=g))
        self.head = T.Linear(12, 3, generator=g)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_traced_model_symbolic_batch_and_sequence(kind, tmp_path):
    from onemodel.runtime import Session

    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    model = _Tagger(kind)
    traced = model.trace(Tensor.randn(2, 5, 4), "batch", "seq", None)
    op = "LSTM" if kind == "lstm" else "GRU"
    assert [n.op for n in traced.graph.nodes].count(op) == 2, "one ONNX op per layer"
    traced.save(tmp_path / "m.onemodel")
    traced.save_onnx(tmp_path / "m.onnx")
    proto = onnx.load(str(tmp_path / "m.onnx"))
    assert [d.dim_param for d in proto.graph.input[0].type.tensor_type.shape.dim][:2] == \
        ["batch", "seq"]
    sessions = [Session.load(tmp_path / "m.onemodel"), Session.load(tmp_path / "m.onnx")]
    ort_sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    model.eval()
    for b, t in ((1, 3), (3, 7), (2, 11)):
        x = np.random.default_rng(b * t).standard_normal((b, t, 4)).astype(np.float32)
        want = model(Tensor.from_numpy(x)).numpy()
        for s in sessions:
            got = s.run({"input": x})
            got = np.asarray(got["output"] if isinstance(got, dict) else got[0])
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(ort_sess.run(None, {"input": x})[0], want, rtol=1e-4,
                                   atol=1e-5)


@pytest.mark.filterwarnings("ignore")  # the TorchScript exporter's deprecation and tracer notes
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_torch_exported_onnx_imports(kind, tmp_path):
    from onemodel.runtime import Session

    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    torch.manual_seed(0)
    cls = nn.LSTM if kind == "lstm" else nn.GRU

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = cls(4, 5, num_layers=2, bidirectional=True)

        def forward(self, x):
            return self.rnn(x)[0]

    net = Net().eval()
    path = tmp_path / f"{kind}.onnx"
    with torch.no_grad():
        torch.onnx.export(net, (torch.randn(6, 2, 4),), str(path), dynamo=False,
                          input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "seq", 1: "batch"}, "y": {0: "seq", 1: "batch"}})
    session = Session.load(path)
    ort_sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for t, b in ((3, 1), (8, 4)):
        x = np.random.default_rng(t).standard_normal((t, b, 4)).astype(np.float32)
        want = ort_sess.run(None, {"x": x})[0]
        got = session.run({"x": x})
        got = np.asarray(got["y"] if isinstance(got, dict) else got[0])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        with torch.no_grad():
            np.testing.assert_allclose(got, net(torch.from_numpy(x)).numpy(), rtol=1e-4,
                                       atol=1e-5)
