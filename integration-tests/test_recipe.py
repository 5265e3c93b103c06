"""The README's main job: the spec's recipe and snippet, run as programs, print what the spec
prints and leave the files it names."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.slow
def test_recipe_and_snippet_programs(tmp_path):
    pytest.importorskip("onemodel.onnx")
    out = subprocess.run([sys.executable, str(EXAMPLES / "recipe.py")], cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(out) == 4, out
    eager = re.fullmatch(r"Eager: ([\d.]+), ([\d.]+), ([\d.]+)", out[0])
    assert eager and out[1] == out[0].replace("Eager", "Graph")
    for got, want in zip(map(float, eager.groups()), (9, 11, 13)):
        assert abs(got - want) < 0.01  # the layer learned y = 2x + 1
    assert out[2] == "Largest difference: 0.000000"
    assert out[3] == "Saved line.onemodel and line.onnx"
    assert {p.name for p in tmp_path.iterdir()} == {"trained.checkpoint", "line.onemodel",
                                                    "line.onnx"}
    (tmp_path / "line.onemodel").unlink()
    for flag, line, file in (([], "Saved line.onemodel", "line.onemodel"),
                             (["--onnx"], "Saved line.onnx", "line.onnx")):
        snippet = subprocess.run([sys.executable, str(EXAMPLES / "snippet.py"), *flag],
                                 cwd=tmp_path, capture_output=True, text=True, check=True)
        assert snippet.stdout.strip() == line and (tmp_path / file).exists()
