"""Each distribution builds a wheel holding only its own subpackage, and onemodel-tensors works
installed alone in a clean virtual environment with only numpy, pluggy and ml_dtypes."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUBPACKAGES = {
    "packages/tensors": "tensors",
    "packages/training": "training",
    "packages/runtime": "runtime",
    "packages/tracing": "tracing",
    "plugins/native": "native",
    "plugins/onnx": "onnx",
    "plugins/numba": "numba",
    "plugins/cupy": "cupy",
    "packages/distributed": "distributed",
}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheels")
    folders = [str(ROOT / f) for f in [*SUBPACKAGES, "packages/onemodel"]]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out),
                    *folders], check=True)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("folder", list(SUBPACKAGES))
def test_wheel_holds_only_its_subpackage(wheels, folder):
    name = SUBPACKAGES[folder]
    (wheel,) = wheels.glob(f"onemodel_{name}-*.whl")
    files = [f for f in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in f]
    assert files and all(f.startswith(f"onemodel/{name}/") for f in files), files
    assert "onemodel/__init__.py" not in files


@pytest.mark.slow
def test_meta_package_has_no_code(wheels):
    (wheel,) = wheels.glob("onemodel-*.whl")
    assert [f for f in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in f] == []


@pytest.mark.slow
def test_tensors_wheel_alone_in_a_clean_venv(wheels, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = str(env_dir / "bin" / "python")
    (wheel,) = wheels.glob("onemodel_tensors-*.whl")
    subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
                   check=True)
    listed = subprocess.run([py, "-m", "pip", "list", "--format=freeze"], capture_output=True,
                            text=True, check=True).stdout
    names = {line.split("==")[0].lower() for line in listed.split()}
    assert names - {"pip", "setuptools", "wheel"} == {"numpy", "pluggy", "ml_dtypes",
                                                     "onemodel-tensors"}
    code = (
        "import sys\n"
        "from onemodel.tensors import Tensor, functional as F, registry\n"
        "x = Tensor.randn(2, 3, 8, 8).requires_grad_()\n"
        "F.conv2d(x, Tensor.randn(4, 3, 3, 3), padding=1).relu().sum().backward()\n"
        "assert x.grad.shape == (2, 3, 8, 8)\n"
        "assert [p.name for p in registry.list_plugins()] == ['onemodel-tensors.reference']\n"
        "print(sorted(m for m in ('numba', 'onnx', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
