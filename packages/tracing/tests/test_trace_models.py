"""Trace an MLP, a CNN with BatchNorm and Dropout, and a transformer encoder at batch 4; save
them (.onemodel and .onnx); run them in a separate process that does not import training at
batch 1, 2, 3, 5, 17 and 64; compare with eager forward in eval mode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from models import cnn, encoder, mlp

from onemodel.tensors import Tensor

BATCHES = (1, 2, 3, 5, 17, 64)
CASES = {
    "mlp": (mlp, (12,), ("batch", None)),
    "cnn": (cnn, (3, 8, 8), ("batch", None, None, None)),
    "encoder": (encoder, (6, 16), ("batch", None, None)),
}


@pytest.mark.parametrize("fmt", ["onemodel", "onnx"])
@pytest.mark.parametrize("name", list(CASES))
def test_traced_model_runs_anywhere_like_eager(name, fmt, tmp_path):
    make, tail, axes = CASES[name]
    model = make()
    traced = model.trace(Tensor.randn(4, *tail), *axes)
    assert model.training, "trace must restore the previous (training) mode"
    path = tmp_path / f"{name}.{fmt}"
    traced.save(path) if fmt == "onemodel" else traced.save_onnx(path)

    rng = np.random.default_rng(0)
    feeds, want = {}, {}
    model.eval()
    for b in BATCHES:
        x = rng.standard_normal((b, *tail)).astype(np.float32)
        feeds[f"b{b}/input"] = x
        want[f"b{b}/output"] = model(Tensor.from_numpy(x)).numpy()
    np.savez(tmp_path / "feeds.npz", **feeds)
    script = Path(__file__).with_name("run_saved.py")
    proc = subprocess.run([sys.executable, str(script), str(path), str(tmp_path / "feeds.npz"),
                           str(tmp_path / "out.npz")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    got = dict(np.load(tmp_path / "out.npz"))
    for key, value in want.items():
        assert got[key].shape == value.shape
        np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-5, err_msg=key)


@pytest.mark.parametrize("name", list(CASES))
def test_onnx_export_runs_in_onnxruntime_at_any_batch(name, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    make, tail, axes = CASES[name]
    model = make()
    traced = model.trace(Tensor.randn(4, *tail), *axes)
    traced.save_onnx(tmp_path / f"{name}.onnx")
    onnx.checker.check_model(onnx.load(str(tmp_path / f"{name}.onnx")), full_check=True)
    session = ort.InferenceSession(str(tmp_path / f"{name}.onnx"),
                                   providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == ["batch", *tail]
    model.eval()
    for b in (1, 3, 17):
        x = np.random.default_rng(b).standard_normal((b, *tail)).astype(np.float32)
        np.testing.assert_allclose(session.run(None, {"input": x})[0],
                                   model(Tensor.from_numpy(x)).numpy(), rtol=1e-4, atol=1e-5)


def test_check_reports_eager_against_graph():
    traced = encoder().trace(Tensor.randn(4, 6, 16), "batch", None, None)
    report = traced.check(sizes={"batch": [1, 3, 17]})
    assert report.ok and set(report.differences) == {"batch=1", "batch=3", "batch=17"}
    assert "largest difference" in str(report)


def test_report_shows_symbolic_shapes():
    text = mlp().trace(Tensor.randn(4, 12), "batch", None).report()
    assert "input  input: F32[batch, 12]" in text
    assert "output output: F32[batch, 5]" in text
    assert "Dropout" not in text  # eval mode: dropout is the identity and records nothing
