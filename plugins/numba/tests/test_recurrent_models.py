"""PyTorch's LSTM and GRU exported to ONNX (PyTorch's own exporter, random weights) run through
a Session with the numba recurrent kernels, against PyTorch's outputs and onnxruntime's."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from onemodel.runtime import Session  # noqa: E402
from onemodel.tensors import registry  # noqa: E402


class _Net(torch.nn.Module):
    def __init__(self, cell: str, bidirectional: bool):
        super().__init__()
        kind = torch.nn.LSTM if cell == "LSTM" else torch.nn.GRU
        self.rnn = kind(12, 20, num_layers=2, batch_first=True, bidirectional=bidirectional)
        self.head = torch.nn.Linear(40 if bidirectional else 20, 3)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(y)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["forward", "bidirectional"])
@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_an_exported_torch_rnn_matches_torch_and_onnxruntime(cell, bidirectional, tmp_path):
    torch.manual_seed(0)
    net = _Net(cell, bidirectional).eval()
    x = torch.randn(3, 17, 12)
    path = tmp_path / f"{cell}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes on batch_first RNNs
        torch.onnx.export(net, (x,), str(path), dynamo=False, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "batch", 1: "time"}},
                          opset_version=17)
    with torch.no_grad():
        want = net(x).numpy()
    session = Session.load(path, threads=1)
    plan = session.plan_for({"x": (3, 17, 12)})
    assert cell in {s.op for s in plan.steps}
    chosen = registry.choose_kernel_record(cell, "cpu", [x.numpy(), np.zeros((1, 80, 12),
                                                                            np.float32),
                                                         np.zeros((1, 80, 20), np.float32)], {})
    assert chosen.function().__module__ == "onemodel.numba.recurrent"
    for feed in (x.numpy(), torch.randn(5, 9, 12).numpy()):  # and another batch and length
        got = session.run({"x": feed}, return_numpy=True)["y"]
        with torch.no_grad():
            ref = net(torch.from_numpy(feed)).numpy()
        theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
            None, {"x": feed})[0]
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got, theirs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(session.run({"x": x.numpy()}, return_numpy=True)["y"], want,
                               rtol=1e-5, atol=1e-5)
