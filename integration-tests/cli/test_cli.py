"""The ``onemodel`` console script, run as a user would: in a subprocess, on a model traced here
and on an ONNX file exported by PyTorch, including its failure exits."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onemodel.onnx")
pytest.importorskip("onemodel.native")
pytest.importorskip("onemodel.tracing")

from onemodel.runtime import Session
from onemodel.tensors import Tensor
from onemodel.training import BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential

ONEMODEL = shutil.which("onemodel", path=str(Path(sys.executable).parent))


def cli(*args: str, cwd: Path, ok: bool = True) -> subprocess.CompletedProcess:
    assert ONEMODEL, "the onemodel console script is not installed beside this python"
    done = subprocess.run([ONEMODEL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    if ok:
        assert done.returncode == 0, done.stderr
    return done


def _fails(done: subprocess.CompletedProcess, *words: str) -> None:
    """A failure is one clear line on stderr (no traceback) and a non-zero exit."""
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for w in words:
        assert w in lines[0], lines[0]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    model = Sequential(Conv2d(3, 8, 3, padding=1), BatchNorm2d(8), ReLU(), MaxPool2d(2),
                       Flatten(), Linear(8 * 4 * 4, 10))
    x = Tensor.from_numpy(np.random.default_rng(0).standard_normal((4, 3, 8, 8), np.float32))
    traced = model.trace(x, "batch", None, None, None)
    traced.save(d / "cnn.onemodel")
    traced.save_onnx(d / "cnn.onnx")
    other = Sequential(Conv2d(3, 8, 3, padding=1), ReLU(), MaxPool2d(2), Flatten(),
                       Linear(8 * 4 * 4, 10))
    other.trace(x, "batch", None, None, None).save(d / "other.onemodel")
    _torch_export(d / "torch.onnx")
    return d


def _torch_export(path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.GELU(), torch.nn.Flatten(),
                              torch.nn.Linear(4 * 6 * 6, 5)).eval()
    torch.onnx.export(net, (torch.randn(2, 3, 8, 8),), str(path), input_names=["pixels"],
                      output_names=["logits"], dynamic_axes={"pixels": {0: "n"}, "logits": {0: "n"}},
                      dynamo=False)


@pytest.mark.parametrize("name", ["cnn.onemodel", "torch.onnx"])
def test_inspect(models, name):
    text = cli("inspect", name, cwd=models).stdout
    info = json.loads(cli("inspect", name, "--json", cwd=models).stdout)
    graph_input = info["inputs"][0]
    assert graph_input["dtype"] == "F32" and graph_input["shape"][1:] == [3, 8, 8]
    assert isinstance(graph_input["shape"][0], str)  # the batch axis stays symbolic
    assert info["parameters"] > 0 and info["parameter_bytes"] == 4 * info["parameters"]
    assert "Conv" in info["ops"] and sum(info["ops"].values()) == info["nodes"]
    if name.endswith(".onnx"):
        assert info["format"] == "onnx" and info["opset"] >= 13 and "pytorch" in info["producer"]
    else:
        assert info["format"] == "native" and info["format_version"] == 1
    assert f"{graph_input['name']}: F32[{graph_input['shape'][0]}, 3, 8, 8]" in text


@pytest.mark.parametrize("name", ["cnn.onemodel", "torch.onnx"])
def test_run_writes_what_a_session_computes(models, name, tmp_path):
    """Bit for bit, at the same thread setting: the kernels a plan takes depend on it (on one
    thread the numba plugin's serial-only kernels), and so may the last bits."""
    session = Session.load(models / name, threads=1)
    feed_name = session.inputs[0].name
    x = np.random.default_rng(1).standard_normal((5, 3, 8, 8), np.float32)
    np.save(tmp_path / "x.npy", x)
    out = cli("run", str(models / name), "-i", f"{feed_name}=x.npy", "-o", "y.npz",
              "--threads", "1", cwd=tmp_path).stdout
    assert "[5, " in out and "wrote y.npz" in out
    want = session.run({feed_name: x})
    with np.load(tmp_path / "y.npz") as got:
        assert set(got.files) == set(want)
        for k, v in want.items():
            np.testing.assert_array_equal(got[k], v.numpy())
    shaped = cli("run", str(models / name), "--shape", f"{session.inputs[0].shape[0]}=7",
                 "--optimization-level", "basic", "--profile", "trace.json", cwd=tmp_path).stdout
    assert "[7, " in shaped and "wrote trace.json" in shaped and "Conv" in shaped
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert "Conv" in {e["args"].get("op") for e in events}


def test_convert_both_ways_then_check(models, tmp_path):
    cli("convert", str(models / "cnn.onemodel"), "a.onnx", "--opset", "17", cwd=tmp_path)
    cli("convert", "a.onnx", "b.onemodel", cwd=tmp_path)
    assert json.loads(cli("inspect", "a.onnx", "--json", cwd=tmp_path).stdout)["opset"] == 17
    done = cli("check", str(models / "cnn.onemodel"), "b.onemodel", "--sizes", "batch=1,2,9",
               cwd=tmp_path)
    assert [line.split(":")[0] for line in done.stdout.splitlines()[:3]] == \
        ["batch=1", "batch=2", "batch=9"]
    assert done.stdout.splitlines()[-1].startswith("largest difference: 0 ")
    torch_check = json.loads(cli("check", str(models / "torch.onnx"), str(models / "torch.onnx"),
                                 "--json", cwd=tmp_path).stdout)
    assert torch_check["ok"] and [r["sizes"] for r in torch_check["runs"]] == \
        [{"n": 1}, {"n": 3}, {"n": 8}]


def test_check_fails_when_models_differ(models):
    done = cli("check", "cnn.onemodel", "other.onemodel", cwd=models, ok=False)
    assert done.returncode == 1 and "FAIL" in done.stdout


def test_bench_against_onnxruntime(models):
    report = json.loads(cli("bench", "cnn.onemodel", "--shape", "batch=2", "--runs", "5",
                            "--warmup", "1", "--against", "onnxruntime", "--json",
                            cwd=models).stdout)
    assert report["sizes"] == {"batch": 2} and report["runs"] == 5
    assert report["onemodel"]["p50_ms"] > 0 and report["onnxruntime"]["p50_ms"] > 0
    assert report["ratio"]["median_of_paired"] > 0
    text = cli("bench", "torch.onnx", "--runs", "3", "--warmup", "0", "--against",
               "onnxruntime", cwd=models).stdout
    assert "onemodel/onnxruntime latency ratio:" in text


def test_plugins_lists_the_installed_plugins(models):
    info = json.loads(cli("plugins", "--json", cwd=models).stdout)
    names = {p["name"] for p in info["plugins"]}
    assert {"onnx", "native"} <= names
    assert "onemodel_register_commands" in next(p for p in info["plugins"]
                                                if p["name"] == "onnx")["hooks"]
    assert info["kernels"]["Conv"][0]["device"] == "cpu"


def test_validate_is_contributed_by_the_onnx_plugin(models):
    assert "valid ONNX" in cli("validate", "cnn.onemodel", cwd=models).stdout
    (models / "bad.onnx").write_bytes(b"\x08\x07garbage")
    _fails(cli("validate", "bad.onnx", cwd=models, ok=False))


def test_help_everywhere(models):
    for cmd in ("inspect", "run", "convert", "check", "bench", "plugins", "validate"):
        assert "Usage: onemodel " + cmd in cli(cmd, "--help", cwd=models).stdout


def test_failure_exits_are_one_clear_line(models, tmp_path):
    _fails(cli("inspect", "missing.onnx", cwd=tmp_path, ok=False), "missing.onnx", "no such file")
    _fails(cli("run", str(models / "cnn.onemodel"), "--shape", "seq=3", cwd=tmp_path, ok=False),
           "'seq'", "batch")
    _fails(cli("run", str(models / "cnn.onemodel"), "--shape", "batch", cwd=tmp_path, ok=False),
           "AXIS=SIZE")
    _fails(cli("run", str(models / "cnn.onemodel"), "-i", "input=nope.npy", cwd=tmp_path,
               ok=False), "nope.npy")
    np.save(tmp_path / "wrong.npy", np.zeros((2, 3), np.float32))
    _fails(cli("run", str(models / "cnn.onemodel"), "-i", "input=wrong.npy", cwd=tmp_path,
               ok=False), "input")
    _fails(cli("convert", str(models / "cnn.onemodel"), "x.unknown", cwd=tmp_path, ok=False),
           ".unknown")
    _fails(cli("convert", str(models / "cnn.onnx"), "x.onemodel", "--opset", "13", cwd=tmp_path,
               ok=False), "--opset")
    _fails(cli("bench", str(models / "cnn.onemodel"), "--runs", "0", cwd=tmp_path, ok=False),
           "--runs")
    assert cli("nosuchcommand", cwd=tmp_path, ok=False).returncode == 2
