"""PyTorch's ConvTranspose2d (a decoder's upsampling, grouped and not) exported to ONNX by
PyTorch runs through a Session with the numba ConvTranspose, against PyTorch and onnxruntime."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from onemodel.runtime import Session  # noqa: E402


@pytest.mark.parametrize("kwargs", [dict(stride=2, padding=1), dict(stride=2, padding=1,
                                    output_padding=1, groups=2, dilation=1),
                                    dict(stride=1, padding=0)])
def test_an_exported_transposed_convolution_matches_torch_and_onnxruntime(kwargs, tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.ConvTranspose2d(8, 6, 4 if kwargs["stride"] == 2 else 3,
                                                       **kwargs), torch.nn.ReLU()).eval()
    x = torch.randn(2, 8, 9, 7)
    path = tmp_path / "up.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (x,), str(path), dynamo=False, input_names=["x"],
                          output_names=["y"], opset_version=17)
    with torch.no_grad():
        want = net(x).numpy()
    session = Session.load(path, threads=1)
    assert "ConvTranspose" in {s.op for s in session.plan_for({"x": (2, 8, 9, 7)}).steps}
    got = session.run({"x": x.numpy()}, return_numpy=True)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, theirs.run(None, {"x": x.numpy()})[0], rtol=1e-5,
                               atol=1e-5)
