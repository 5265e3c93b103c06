"""PyTorch's GroupNorm and InstanceNorm2d exported to ONNX by PyTorch (GroupNorm as Reshape,
InstanceNormalization, Reshape, Mul and Add at opset 17; GroupNormalization at opset 21) run
through a Session with the numba normalization kernels, against PyTorch and onnxruntime."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from onemodel.runtime import Session  # noqa: E402


class _Net(torch.nn.Module):
    def __init__(self, norm: str):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.norm = (torch.nn.GroupNorm(4, 16) if norm == "group"
                     else torch.nn.InstanceNorm2d(16, affine=True))
        with torch.no_grad():  # not the identity affine
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return torch.relu(self.norm(self.conv(x)))


@pytest.mark.parametrize("norm,opset", [("group", 17), ("group", 21), ("instance", 17)])
def test_exported_norms_match_torch_and_onnxruntime(norm, opset, tmp_path):
    torch.manual_seed(0)
    net = _Net(norm).eval()
    x = torch.randn(2, 3, 12, 10)
    path = tmp_path / f"{norm}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (x,), str(path), dynamo=False, input_names=["x"],
                          output_names=["y"], opset_version=opset)
    with torch.no_grad():
        want = net(x).numpy()
    session = Session.load(path, threads=1)
    ops = {s.op for s in session.plan_for({"x": (2, 3, 12, 10)}).steps}
    assert ops & {"InstanceNormalization", "GroupNormalization"}
    got = session.run({"x": x.numpy()}, return_numpy=True)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    try:
        theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception:  # an onnxruntime without the op at this opset: PyTorch is the oracle
        return
    np.testing.assert_allclose(got, theirs.run(None, {"x": x.numpy()})[0], rtol=1e-5,
                               atol=1e-5)
