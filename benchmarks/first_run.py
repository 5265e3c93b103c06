"""First run of a saved ResNet-50-class graph in a fresh process: load the file, make the
session, run once, against the steady-state run time of the same session. Two processes share a
new, empty numba cache directory: the first compiles every kernel and fills it (cold), the
second finds it full (warm). They share a new bytecode cache the same way (Python's own, which
every installed package has), so the second does not compile the modules' sources either.

    python benchmarks/first_run.py [--network resnet50]
"""

from __future__ import annotations

import os

os.environ.setdefault("ONEMODEL_NUM_THREADS", "1")

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import time, sys
t0 = time.perf_counter()
import numpy as np
from onemodel.runtime import Session
s = Session.load(sys.argv[1])
x = np.random.default_rng(0).standard_normal({shape}).astype(np.float32)
t1 = time.perf_counter()
s.run({{{key!r}: x}})
t2 = time.perf_counter()
steady = []
for _ in range(5):
    a = time.perf_counter(); s.run({{{key!r}: x}}); steady.append(time.perf_counter() - a)
steady.sort()
print(t1 - t0, t2 - t1, steady[2])
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", default="resnet50")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration-tests" / "onnx"))
    import zoo

    model = zoo.randomized(zoo.load(args.network), seed=1)
    key, x = zoo.data_input(model)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{args.network}.onnx")
        Path(path).write_bytes(model.SerializeToString())
        code = CHILD.format(shape=tuple(x.shape), key=key)
        # Python's bytecode cache as an installed package has it (pip compiles it at install):
        # where PYTHONDONTWRITEBYTECODE is set, a process would compile every module's source
        # again (40 ms for this repository's kernel modules), which no user's process does
        env = {**os.environ, "NUMBA_CACHE_DIR": os.path.join(tmp, "numba-cache"),
               "PYTHONPYCACHEPREFIX": os.path.join(tmp, "pycache")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        for label in ("cold numba cache", "warm numba cache"):
            out = subprocess.run([sys.executable, "-c", code, path], capture_output=True,
                                 text=True, check=True, env=env).stdout.split()
            load, first, steady = (float(v) for v in out)
            print(f"{label:34s} import+load+session {load:6.2f} s, first run {first:6.2f} s, "
                  f"steady run {steady:6.3f} s, first - steady {first - steady:6.2f} s",
                  flush=True)


if __name__ == "__main__":
    main()
