"""Weights across frameworks: a PyTorch-written safetensors file loads into the same model built
with OneModel, and Checkpoint.save_weights writes one PyTorch loads; outputs agree both ways."""

import numpy as np
import pytest

from onemodel.tensors import Tensor
from onemodel.training import (
    LSTM,
    AdaptiveAvgPool2d,
    BatchNorm2d,
    Checkpoint,
    Conv2d,
    Embedding,
    Flatten,
    LayerNorm,
    Linear,
    MaxPool2d,
    Module,
    ReLU,
    Sequential,
    StateDictError,
    TransformerEncoderLayer,
)

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")
tnn = torch.nn


def _cnn_pair():
    ours = Sequential(Conv2d(3, 8, 3, padding=1), BatchNorm2d(8), ReLU(), MaxPool2d(2),
                      Conv2d(8, 16, 3), ReLU(), AdaptiveAvgPool2d(1), Flatten(), Linear(16, 5))
    theirs = tnn.Sequential(tnn.Conv2d(3, 8, 3, padding=1), tnn.BatchNorm2d(8), tnn.ReLU(),
                            tnn.MaxPool2d(2), tnn.Conv2d(8, 16, 3), tnn.ReLU(),
                            tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(16, 5))
    # non-trivial running statistics, so the buffers are checked too
    with torch.no_grad():
        theirs.train()(torch.randn(6, 3, 10, 10) * 2 + 1)
    return ours, theirs, np.random.default_rng(0).standard_normal((2, 3, 10, 10)).astype(np.float32)


class OurTransformer(Module):
    def __init__(self, norm_first):
        super().__init__()
        self.embed = Embedding(20, 16)
        self.layer = TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True,
                                             norm_first=norm_first)
        self.norm = LayerNorm(16)
        self.head = Linear(16, 3)

    def forward(self, ids):
        return self.head(self.norm(self.layer(self.embed(ids))))


class TorchTransformer(tnn.Module):
    def __init__(self, norm_first):
        super().__init__()
        self.embed = tnn.Embedding(20, 16)
        self.layer = tnn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True,
                                                 norm_first=norm_first)
        self.norm = tnn.LayerNorm(16)
        self.head = tnn.Linear(16, 3)

    def forward(self, ids):
        return self.head(self.norm(self.layer(self.embed(ids))))


def _transformer_pair(norm_first):
    ids = np.random.default_rng(1).integers(0, 20, (2, 7))
    return OurTransformer(norm_first), TorchTransformer(norm_first), ids


class OurLSTM(Module):
    def __init__(self):
        super().__init__()
        self.embed = Embedding(20, 8)
        self.lstm = LSTM(8, 12, num_layers=2, batch_first=True, bidirectional=True)
        self.head = Linear(24, 3)

    def forward(self, ids):
        out, _ = self.lstm(self.embed(ids))
        return self.head(out)


class TorchLSTM(tnn.Module):
    def __init__(self):
        super().__init__()
        self.embed = tnn.Embedding(20, 8)
        self.lstm = tnn.LSTM(8, 12, num_layers=2, batch_first=True, bidirectional=True)
        self.head = tnn.Linear(24, 3)

    def forward(self, ids):
        out, _ = self.lstm(self.embed(ids))
        return self.head(out)


def _pairs():
    yield "cnn", _cnn_pair()
    yield "lstm", (OurLSTM(), TorchLSTM(), np.random.default_rng(2).integers(0, 20, (3, 6)))
    yield "transformer-post", _transformer_pair(False)
    yield "transformer-pre", _transformer_pair(True)


PAIRS = dict(_pairs())


def _outputs(ours, theirs, x):
    ours.eval()
    theirs.eval()
    with torch.no_grad():
        t_out = theirs(torch.from_numpy(x)).numpy()
    return ours(Tensor.from_numpy(x)).numpy(), t_out


@pytest.mark.parametrize("name", list(PAIRS))
def test_torch_file_loads_into_onemodel(name, tmp_path):
    ours, theirs, x = PAIRS[name]
    path = tmp_path / "torch.safetensors"
    st.save_file(theirs.state_dict(), str(path))
    missing, unexpected = ours.load_state_dict(path)
    assert missing == [] and unexpected == []
    o, t = _outputs(ours, theirs, x)
    np.testing.assert_allclose(o, t, rtol=1e-4, atol=1e-5)
    # Checkpoint.load_weights and a str path read the same file
    Checkpoint.load_weights(str(path), ours)
    np.testing.assert_allclose(ours(Tensor.from_numpy(x)).numpy(), t, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(PAIRS))
def test_onemodel_file_loads_into_torch(name, tmp_path):
    ours, theirs, x = PAIRS[name]
    # fresh torch weights (and statistics), then ours -> torch
    for p in theirs.parameters():
        torch.nn.init.normal_(p.data, std=0.1)
    path = tmp_path / "ours.safetensors"
    Checkpoint.save_weights(path, ours)
    loaded = st.load_file(str(path))
    assert set(loaded) == set(theirs.state_dict())
    result = theirs.load_state_dict(loaded, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    o, t = _outputs(ours, theirs, x)
    np.testing.assert_allclose(o, t, rtol=1e-4, atol=1e-5)


def test_torch_state_dict_of_tensors_loads_directly():
    ours, theirs, x = _cnn_pair()
    ours.load_state_dict(dict(theirs.named_parameters()) | dict(theirs.named_buffers()))
    o, t = _outputs(ours, theirs, x)
    np.testing.assert_allclose(o, t, rtol=1e-4, atol=1e-5)


def test_a_file_of_another_model_is_refused_by_name(tmp_path):
    _, theirs, _ = _transformer_pair(False)
    path = tmp_path / "t.safetensors"
    st.save_file(theirs.state_dict(), str(path))
    ours, _, _ = _cnn_pair()
    with pytest.raises(StateDictError, match="missing keys: 0.weight"):
        ours.load_state_dict(path)
