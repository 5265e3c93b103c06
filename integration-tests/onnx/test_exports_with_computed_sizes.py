"""PyTorch exports (dynamic axes) whose sizes are computed from other sizes (slices, views,
paddings to a multiple) run right at every input size: a graph-level guess about a symbolic
size must never be baked into the graph. Oracle: onnxruntime on the same file and inputs."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from onemodel.runtime import Session  # noqa: E402


class _SliceView(torch.nn.Module):
    def forward(self, x):
        y = x[:, 2:5]
        return y.reshape(-1, y.shape[1] * y.shape[2])


class _PadToMultiple(torch.nn.Module):
    def forward(self, x):
        pad = (4 - x.shape[1] % 4) % 4
        return torch.nn.functional.pad(x, (0, 0, 0, pad)) * 2.0


class _FirstFour(torch.nn.Module):
    def forward(self, x):
        y = x[:, :4]
        return y.reshape(x.shape[0], y.shape[1] * 2, -1)


@pytest.mark.parametrize("net", [_SliceView(), _PadToMultiple(), _FirstFour()],
                         ids=["slice-view", "pad-to-multiple", "first-four"])
def test_computed_sizes_follow_the_input(net, tmp_path):
    path = tmp_path / "net.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.randn(2, 6, 6),), str(path), dynamo=False,
                          input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "B", 1: "T"}}, opset_version=17)
    ours = Session.load(path)
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for b, t in ((2, 6), (3, 4), (1, 9), (2, 5)):
        x = rng.standard_normal((b, t, 6)).astype(np.float32)
        want = theirs.run(None, {"x": x})[0]
        got = ours.run({"x": x}, return_numpy=True)["y"]
        assert got.shape == want.shape, (b, t)
        np.testing.assert_allclose(got, want, rtol=1e-6)
