"""TracedModel.save picks the format by extension (a .onnx file holds ONNX, not the native
format), names the installed formats for an unknown one, and save_onnx stays."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.runtime import Session
from onemodel.tensors import Generator, OneModelError, Tensor
from onemodel.training import Linear


@pytest.fixture
def traced():
    return Linear(3, 2, Generator(0)).trace(Tensor.randn(4, 3, generator=Generator(1)), "batch",
                                            None)


def test_extension_chooses_the_format(traced, tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onemodel.native")
    traced.save(tmp_path / "m.onnx")
    traced.save(tmp_path / "m.onemodel")
    assert onnx.load(str(tmp_path / "m.onnx")).graph.node  # a real ONNX model
    assert (tmp_path / "m.onemodel").read_bytes().startswith(b"ONEMODEL")
    x = np.ones((5, 3), np.float32)
    a, b = (Session.load(tmp_path / f"m.{ext}").run({"input": x})["output"].numpy()
            for ext in ("onnx", "onemodel"))
    np.testing.assert_array_equal(a, b)
    traced.save(tmp_path / "model.bin", format="native")
    assert (tmp_path / "model.bin").read_bytes().startswith(b"ONEMODEL")


def test_unknown_extension_lists_the_installed_formats(traced, tmp_path):
    pytest.importorskip("onemodel.native")
    with pytest.raises(OneModelError, match=r"no installed format saves \.pt; installed: .*native"):
        traced.save(tmp_path / "m.pt")
    assert not (tmp_path / "m.pt").exists()
