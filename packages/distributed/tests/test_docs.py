"""Every code block of docs/scaling-out.md runs: Python blocks are saved under the file name on
their first line, shell blocks run in order in that folder (with this environment's python and
mpirun first on PATH), and every saved program must be run by some shell block."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "scaling-out.md"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def blocks() -> list[tuple[str, str]]:
    return BLOCK.findall(PAGE.read_text())


def test_page_blocks_are_named_programs_or_shell():
    found = blocks()
    assert {lang for lang, _ in found} == {"python", "bash"}
    for lang, code in found:
        if lang == "python":
            assert re.match(r"# [\w-]+\.py\n", code), code.splitlines()[0]
    assert "FIGURES" not in PAGE.read_text(), "the figures were not filled in"


@pytest.mark.slow
def test_every_block_runs(tmp_path):
    pytest.importorskip("mpi4py")
    pytest.importorskip("ray")
    from onemodel.distributed import launch

    env = launch.mpi_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray on loopback only
    env.pop("RAY_ADDRESS", None)
    env.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))
    programs, ran = [], ""
    for lang, code in blocks():
        if lang == "python":
            name = code.splitlines()[0][2:].strip()
            (tmp_path / name).write_text(code)
            programs.append(name)
            continue
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, f"{code}\n{out.stdout}\n{out.stderr}"
        ran += code + out.stdout
    for name in programs:
        assert f"python {name}" in ran, f"no shell block runs {name}"
    assert "epoch 4: loss" in ran and "loaded a Sequential" in ran
    assert "scored 10000 rows on 2 actors" in ran and "streamed 5000 rows" in ran
