"""The example plugin's kernel is chosen for the dtypes it claims, computes what PyTorch does,
and leaves other calls to the reference kernel."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from onemodel.tensors import DType, Tensor, registry

SRC = Path(__file__).resolve().parent.parent / "src"


@pytest.fixture
def example_plugin(isolated_registry, monkeypatch):
    """The plugin registered as its entry point would be (it is not installed in the dev venv)."""
    if importlib.util.find_spec("example_kernels") is None:
        monkeypatch.syspath_prepend(str(SRC))
    import example_kernels

    registry.register_plugin(example_kernels, "example-kernels")
    yield example_kernels
    sys.modules.pop("example_kernels", None)


def test_chosen_for_claimed_dtypes_only(example_plugin):
    x32 = np.array([-1.5, 0.0, 2.0], np.float32)
    assert registry.choose_kernel("Relu", "cpu", [x32]) is example_plugin.relu
    assert registry.choose_kernel("Relu", "cpu", [x32.astype(np.float64)]) is example_plugin.relu
    assert registry.choose_kernel("Relu", "cpu", [np.array([-1, 2], np.int64)]) \
        is not example_plugin.relu
    assert registry.choose_kernel("Relu", "cpu", [np.zeros((0, 3), np.float32)]) \
        is not example_plugin.relu  # its supports check refuses empty arrays


@pytest.mark.parametrize("dtype", [DType.F32, DType.F64])
def test_matches_pytorch_eager_and_in_a_session(example_plugin, dtype, monkeypatch):
    torch = pytest.importorskip("torch")
    from onemodel.runtime import GraphBuilder, Session

    calls = []
    real = example_plugin.relu
    monkeypatch.setattr(example_plugin, "relu", lambda x: calls.append(x.shape) or real(x))

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 7, 5)).astype(dtype.numpy)[:, ::2]  # not contiguous
    x[0, 0, 0] = np.nan
    want = torch.relu(torch.from_numpy(np.ascontiguousarray(x))).numpy()
    np.testing.assert_array_equal(Tensor.from_numpy(x).relu().numpy(), want)
    b = GraphBuilder()
    inp = b.input("x", dtype, ("n", 4, 5))
    b.output(b.op("Relu", inp), "y")
    got = Session(b.build()).run({"x": np.ascontiguousarray(x)})["y"].numpy()
    np.testing.assert_array_equal(got, want)
    assert calls == [(3, 4, 5), (3, 4, 5)]  # eager dispatch and the session's plan both chose it


def test_listed_with_its_version_and_hook(example_plugin):
    info = {p.name: p for p in registry.list_plugins()}["example-kernels"]
    assert info.version == "0.1.0" and info.hooks == ["onemodel_register_kernels"]
