"""Symbolic sizes divided with ``//`` trace as Python's floor division, not ONNX's truncating
integer Div: they differ on a negative numerator, as in the ceiling idiom ``-((-n) // k)``."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.runtime import Session
from onemodel.tensors import Tensor
from onemodel.tracing import Tracer


def _crop(x):
    h = x.shape[-1]
    return x[..., h // 4: -((-2 * h) // 4)]  # from floor(h/4) to ceil(h/2)


def test_floor_division_of_a_symbolic_size_matches_python_at_every_size(tmp_path):
    traced = Tracer(_crop).trace({"x": Tensor(np.zeros((2, 8), np.float32))},
                                 axes={"x": (None, "h")})
    session = Session(traced.graph)
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onemodel.onnx")
    path = tmp_path / "crop.onnx"
    traced.save(path)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for h in (8, 9, 10, 11, 13):
        x = np.arange(2 * h, dtype=np.float32).reshape(2, h)
        want = x[..., h // 4: -((-2 * h) // 4)]
        (got,) = session.run({"x": x}, return_numpy=True).values()
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(ref.run(None, {"x": x})[0], want)
