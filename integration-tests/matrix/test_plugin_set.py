"""What a user gets from the core packages plus exactly one set of plugins.

``scripts/matrix.py`` installs the wheels of one combination into a fresh virtual environment and
runs these tests there with ``ONEMODEL_EXPECT_PLUGINS`` naming the plugins it installed. The
first test asserts that exactly those loaded, so a skip can never hide a missing plugin; the
others check what each plugin adds, and what its absence says."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

EXPECTED = os.environ.get("ONEMODEL_EXPECT_PLUGINS")
pytestmark = pytest.mark.skipif(
    EXPECTED is None, reason="run by scripts/matrix.py, which installs one plugin combination")
PLUGINS = set(filter(None, (EXPECTED or "").split(",")))


def _model():
    """A traced CNN with a symbolic batch axis, and an input for it."""
    from onemodel.tensors import Generator, Tensor
    from onemodel.training import Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential

    model = Sequential(Conv2d(3, 4, 3, padding=1, generator=Generator(0)), ReLU(), MaxPool2d(2),
                       Flatten(), Linear(4 * 4 * 4, 5, generator=Generator(1)))
    example = Tensor.randn(2, 3, 8, 8, generator=Generator(2))
    x = np.random.default_rng(3).standard_normal((3, 3, 8, 8)).astype(np.float32)
    return model, model.trace(example, "batch", None, None, None), x


def test_exactly_the_expected_plugins_loaded():
    import onemodel.runtime  # noqa: F401 - adds the runtime's built-in plugin
    from onemodel.tensors import registry

    loaded = {p.name for p in registry.list_plugins() if not p.name.startswith("onemodel-")}
    assert loaded == PLUGINS


def test_traced_model_runs_in_memory_and_matches_eager():
    from onemodel.tensors import Tensor

    model, traced, x = _model()
    model.eval()
    np.testing.assert_allclose(traced.run({"input": x})["output"].numpy(),
                               model(Tensor.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("suffix, plugin, package", [(".onemodel", "native", "onemodel-native"),
                                                     (".onnx", "onnx", "onemodel-onnx")])
def test_saving_needs_its_serializer(tmp_path, suffix, plugin, package):
    from onemodel.runtime import FormatNotInstalledError, Session, save

    _, traced, x = _model()
    path = tmp_path / f"model{suffix}"
    if plugin not in PLUGINS:
        with pytest.raises(FormatNotInstalledError, match=f"pip install {package}"):
            save(traced.graph, path)
        assert not path.exists()
        return
    save(traced.graph, path)
    got = Session.load(path).run({"input": x})["output"].numpy()
    np.testing.assert_allclose(got, traced.run({"input": x})["output"].numpy(), rtol=1e-6)


def test_validate_command_only_with_onnx():
    from pathlib import Path

    onemodel = Path(sys.executable).parent / "onemodel"
    listed = subprocess.run([str(onemodel), "--help"], capture_output=True, text=True,
                            check=True).stdout
    assert ("validate" in listed) == ("onnx" in PLUGINS)
    assert "inspect" in listed


def test_runtime_import_stays_light():
    code = ("import sys, onemodel.runtime\n"
            "print(sorted(m for m in ('numba', 'onnx', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif("numba" not in PLUGINS, reason="compares with and without onemodel-numba")
def test_numba_gives_the_results_of_the_reference_kernels(tmp_path):
    """Without the plugin (denied by name), results equal those with it."""
    code = ("import sys, numpy as np\n"
            "sys.path.insert(0, sys.argv[1])\n"
            "from test_plugin_set import _model\n"
            "_, traced, x = _model()\n"
            "np.save(sys.argv[2], traced.run({'input': x})['output'].numpy())\n")
    here = os.path.dirname(__file__)
    outs = []
    for deny in ("", "numba"):
        env = {**os.environ, "ONEMODEL_DISABLE_PLUGINS": deny}
        path = tmp_path / f"out-{deny or 'with'}.npy"
        subprocess.run([sys.executable, "-c", code, here, str(path)], env=env, check=True)
        outs.append(np.load(path))
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)


@pytest.mark.skipif("example-kernels" not in PLUGINS, reason="the template plugin's kernel")
def test_template_kernel_is_chosen():
    from onemodel.tensors import registry

    kernel = registry.choose_kernel("Relu", "cpu", [np.ones(3, np.float32)])
    assert kernel.__module__ == "example_kernels"
