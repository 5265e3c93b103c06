"""The layers and methods added for PyTorch users, traced with symbolic axes, saved in both
formats, and run by the Session (both files) and onnxruntime at several sizes, matching eager."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.tensors import Generator, Tensor
from onemodel.training import (
    AdaptiveAvgPool1d,
    AvgPool1d,
    Conv1d,
    Conv2d,
    ConvTranspose1d,
    LayerNorm,
    Linear,
    MaxPool1d,
    Module,
    ReLU,
    Sequential,
    TransformerEncoder,
    TransformerEncoderLayer,
)

ort = pytest.importorskip("onnxruntime")


def _check(model, example, axes, sizes, tmp_path):
    from onemodel.runtime import Session

    model.eval()
    traced = model.trace(Tensor(example), *axes)
    traced.save(tmp_path / "m.onemodel")
    traced.save_onnx(tmp_path / "m.onnx")
    sessions = [Session.load(tmp_path / "m.onemodel"), Session.load(tmp_path / "m.onnx")]
    ort_sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    for shape in sizes:
        x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
        want = model(Tensor.from_numpy(x)).numpy()
        for s in sessions:
            got = s.run({"input": x})
            got = np.asarray(got["output"] if isinstance(got, dict) else got[0])
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(ort_sess.run(None, {"input": x})[0], want, rtol=1e-4,
                                   atol=1e-5)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_conv1d_pool1d_stack(mode, tmp_path):
    g = Generator(0)
    model = Sequential(
        Conv1d(3, 4, 3, padding=2, padding_mode=mode, generator=g), ReLU(), MaxPool1d(2),
        ConvTranspose1d(4, 4, 3, stride=2, padding=1, output_padding=1, generator=g),
        AvgPool1d(3, stride=1, padding=1, count_include_pad=False),
        Conv1d(4, 2, 3, padding="same", padding_mode=mode, generator=g), AdaptiveAvgPool1d(1))
    _check(model, np.zeros((2, 3, 12), np.float32), ("batch", None, "length"),
           [(1, 3, 12), (3, 3, 9), (2, 3, 20)], tmp_path)


def test_conv2d_padding_mode(tmp_path):
    model = Sequential(Conv2d(2, 3, 3, padding=(1, 2), padding_mode="circular",
                              generator=Generator(1)), ReLU(),
                       Conv2d(3, 2, 3, padding=1, padding_mode="reflect", generator=Generator(2)))
    _check(model, np.zeros((2, 2, 6, 7), np.float32), ("batch", None, None, None),
           [(1, 2, 6, 7), (4, 2, 6, 7)], tmp_path)


def test_transformer_encoder(tmp_path):
    layer = TransformerEncoderLayer(16, 4, 24, batch_first=True, norm_first=True,
                                    generator=Generator(3))
    model = Sequential(TransformerEncoder(layer, 2, norm=LayerNorm(16)), Linear(16, 3))
    _check(model, np.zeros((3, 5, 16), np.float32), ("batch", "seq", None),
           [(1, 3, 16), (2, 9, 16)], tmp_path)


class Ranker(Module):
    """topk, sort, argsort + gather, roll and any along a fixed axis of a symbolic batch."""

    def forward(self, x):
        top = x.topk(2, dim=1).values.sum(dim=1)
        low = x.sort(dim=1).values[:, 0]
        ranked = x.gather(1, x.argsort(dim=1, descending=True))[:, 0]
        rolled = x.roll(1, 1)[:, 0]
        flag = (x > 1.0).any(dim=1).cast("F32")
        return top + low + ranked + rolled + flag


def test_tensor_methods(tmp_path):
    _check(Ranker(), np.zeros((3, 6), np.float32), ("batch", None),
           [(1, 6), (5, 6)], tmp_path)
