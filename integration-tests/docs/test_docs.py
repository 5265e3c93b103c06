"""Every Python block in README.md and docs/ runs, and the docs site builds with --strict.

A block is a complete program, unless the line before its fence says ``<!-- continues -->``:
then it runs after the blocks before it in the same file, as one program. A line
``<!-- run-first: examples/recipe.py -->`` before a fence runs that example first in the same
folder (for blocks that load the files it writes). Each program runs in its own temporary folder.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)
CONTINUES = "<!-- continues -->"
RUN_FIRST = re.compile(r"<!-- run-first: (\S+) -->")


@dataclass
class Program:
    where: str
    code: str
    setup: list[str] = field(default_factory=list)


def programs(path: Path) -> list[Program]:
    text = path.read_text()
    out: list[Program] = []
    for m in FENCE.finditer(text):
        if m.group(1) not in ("python", "py"):
            continue
        before = text[:m.start()].rstrip().splitlines()[-3:]
        line = text.count("\n", 0, m.start()) + 1
        where = f"{path.relative_to(ROOT)}:{line}"
        setup = [s for b in before for s in RUN_FIRST.findall(b)]
        if before and before[-1].strip() == CONTINUES:
            if not out:
                raise AssertionError(f"{where}: '{CONTINUES}' but no block before it")
            prev = out.pop()
            out.append(Program(where, prev.code + "\n" + m.group(2), prev.setup + setup))
        else:
            out.append(Program(where, m.group(2), setup))
    return out


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
ALL = [p for d in DOCS for p in programs(d)]


def test_the_docs_have_python_blocks():
    assert len(ALL) >= 10, [p.where for p in ALL]


@pytest.mark.parametrize("program", ALL, ids=[p.where for p in ALL])
def test_python_block_runs(program: Program, tmp_path):
    for example in program.setup:
        subprocess.run([sys.executable, str(ROOT / example)], cwd=tmp_path, check=True,
                       capture_output=True, timeout=300)
    done = subprocess.run([sys.executable, "-c", program.code], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{program.where} failed:\n{done.stderr[-3000:]}"


@pytest.mark.slow
def test_site_builds_strict(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.fail("mkdocs is not installed beside this python (scripts/dev.py installs it)")
    done = subprocess.run([mkdocs, "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "reference" / "runtime" / "index.html").exists()
