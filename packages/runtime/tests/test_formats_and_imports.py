"""The serializer registry's errors, and what importing the runtime costs."""

import subprocess
import sys

import pytest
from runtime_graphs import mlp

from onemodel.runtime import FormatNotInstalledError, Session, load, save


def test_missing_formats_name_the_package_to_install(isolated_registry, tmp_path):
    g = mlp(sizes=(3, 2))
    with pytest.raises(FormatNotInstalledError, match="pip install onemodel-native"):
        save(g, tmp_path / "m.onemodel")
    with pytest.raises(FormatNotInstalledError, match="pip install onemodel-onnx"):
        save(g, tmp_path / "m.onnx")
    (tmp_path / "x.onnx").write_bytes(b"\x08\x07")
    with pytest.raises(FormatNotInstalledError, match="pip install onemodel-onnx"):
        Session.load(tmp_path / "x.onnx")
    with pytest.raises(Exception, match="no installed format saves .txt"):
        save(g, tmp_path / "m.txt")


def test_native_plugin_is_found_through_its_entry_point(tmp_path):
    pytest.importorskip("onemodel.native")
    save(mlp(sizes=(3, 2)), tmp_path / "m.onemodel")
    assert load(tmp_path / "m.onemodel").name == "mlp"


def test_importing_the_runtime_imports_neither_numba_nor_onnx():
    code = ("import sys, onemodel.runtime as r; from onemodel.tensors import registry; "
            "registry.list_plugins(); r.Session(__import__('runtime_graphs').mlp(sizes=(3, 2))); "
            "print(sorted(m for m in ('numba', 'onnx', 'onnxruntime', 'torch', "
            "'onemodel.training') if m in sys.modules))")
    from pathlib import Path

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).parent, check=True)
    assert out.stdout.strip() == "[]"
