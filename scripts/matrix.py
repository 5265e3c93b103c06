#!/usr/bin/env python3
"""The plugin matrix: the core packages plus exactly one chosen set of plugins, each installed
from built wheels (no editable installs) into a fresh virtual environment, where the
integration tests that apply run and assert which plugins are present.

    python3 scripts/matrix.py               # every combination
    python3 scripts/matrix.py none template # some of them (.ci/run runs a curated subset)

Combinations: none, native, onnx, numba, template, all (all: the standard plugins, and the
spec's recipe runs there too). Run it with any Python 3.11; it needs pip and network access to
the package index for numpy, pluggy, click and the plugins' own dependencies.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ["packages/tensors", "packages/training", "packages/runtime", "packages/tracing"]
PLUGINS = {"native": "plugins/native", "onnx": "plugins/onnx", "numba": "plugins/numba",
           "template": "plugins/_template"}
# combination -> the plugins (entry-point names) it installs
COMBINATIONS = {
    "none": [],
    "native": ["native"],
    "onnx": ["onnx"],
    "numba": ["numba"],
    "template": ["template"],
    "all": ["native", "onnx", "numba"],
}
ENTRY_POINT = {"native": "native", "onnx": "onnx", "numba": "numba", "template": "example-kernels"}


def build_wheels(folders: list[str], out: Path) -> dict[str, Path]:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--disable-pip-version-check", "-w", str(out),
                    *(str(ROOT / f) for f in folders)], check=True)
    wheels = {}
    for folder in folders:
        name = _project_name(ROOT / folder / "pyproject.toml").replace("-", "_")
        (wheels[folder],) = out.glob(f"{name}-*.whl")
    return wheels


def _project_name(pyproject: Path) -> str:
    import tomllib

    return tomllib.loads(pyproject.read_text())["project"]["name"]


def run_combination(name: str, wheels: dict[str, Path], work: Path) -> bool:
    plugins = COMBINATIONS[name]
    env_dir = work / f"venv-{name}"
    venv.create(env_dir, with_pip=True)
    py = str(env_dir / "bin" / "python")
    files = [str(wheels[f]) for f in CORE + [PLUGINS[p] for p in plugins]]
    subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", *files,
                    "pytest>=8"], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEMODEL_")}
    env["ONEMODEL_EXPECT_PLUGINS"] = ",".join(sorted(ENTRY_POINT[p] for p in plugins))
    env["NUMBA_CACHE_DIR"] = str(work / "numba-cache")
    # run from a folder outside the repository so nothing imports the source tree by accident
    cwd = work / f"run-{name}"
    cwd.mkdir()
    tests = str(ROOT / "integration-tests" / "matrix")
    code = subprocess.run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
                           str(cwd), "--import-mode=importlib", tests], cwd=cwd, env=env).returncode
    ok = code == 0  # 5 (no test ran) is a failure too
    if ok and name == "all":
        ok = subprocess.run([py, str(ROOT / "examples" / "recipe.py")], cwd=cwd,
                            env=env).returncode == 0
    return ok


def main(argv: list[str]) -> int:
    chosen = argv or list(COMBINATIONS)
    unknown = [c for c in chosen if c not in COMBINATIONS]
    if unknown:
        print(f"unknown combination {unknown[0]!r}; choose from {', '.join(COMBINATIONS)}",
              file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="onemodel-matrix-"))
    try:
        needed = CORE + sorted({PLUGINS[p] for c in chosen for p in COMBINATIONS[c]})
        wheels = build_wheels(needed, work / "wheels")
        results = {}
        for name in chosen:
            t0 = time.perf_counter()
            print(f"== plugin matrix: {name} ({', '.join(COMBINATIONS[name]) or 'core only'})",
                  flush=True)
            results[name] = run_combination(name, wheels, work)
            print(f"== {name}: {'passed' if results[name] else 'FAILED'} "
                  f"in {time.perf_counter() - t0:.0f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    failed = [n for n, ok in results.items() if not ok]
    print(f"matrix: {len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
