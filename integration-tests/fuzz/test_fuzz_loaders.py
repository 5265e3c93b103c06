"""Fuzzing the three loaders: every mutated .onemodel, .onnx and checkpoint file either loads
or raises a OneModelError, within an address-space limit and a per-case time limit.

Each batch runs ``fuzz_loaders.py`` in a child process (seeded, so a failure names a case that
reproduces), because the memory limit (RLIMIT_AS) must not constrain the test runner itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("fuzz_loaders.py")
CASES = 2000  # per batch: about 3-7 s of CPU each
MEMORY_MB = 1024  # address space of the child, imports (numpy, onnx) included
CASE_SECONDS = 5.0  # one load; the slowest seen is well under 0.2 s


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("fmt", ["native", "onnx", "checkpoint"])
def test_mutated_files_load_cleanly_or_raise_onemodel_errors(fmt, seed):
    if fmt == "onnx":
        pytest.importorskip("onnx")
        pytest.importorskip("onemodel.onnx")
    if fmt == "native":
        pytest.importorskip("onemodel.native")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--format", fmt, "--seed", str(seed), "--cases",
         str(CASES), "--memory-mb", str(MEMORY_MB), "--case-seconds", str(CASE_SECONDS)],
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(json.dumps({k: v for k, v in result.items() if k != "failures"}))
    assert result["failed"] == 0, json.dumps(result["failures"], indent=1)
    assert result["cases"] == CASES == result["clean"] + result["error"]
    assert result["error"] > 0 and result["max_rss_mb"] < MEMORY_MB
