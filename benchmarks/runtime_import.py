"""Import time of onemodel.runtime against onnxruntime: fresh interpreters, medians of several
runs, with the bare interpreter's start-up subtracted. Bytecode caching is on (a first, untimed
import writes the .pyc files), as it is for users.

    python benchmarks/runtime_import.py [--runs 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def startup_ms(code: str, runs: int) -> float:
    subprocess.run([sys.executable, "-c", code], check=True, env=ENV)  # writes the .pyc files
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, env=ENV)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    bare = startup_ms("pass", args.runs)
    numpy_ms = startup_ms("import numpy", args.runs) - bare
    ours = startup_ms("import onemodel.runtime", args.runs) - bare
    print(f"python start-up        {bare:7.1f} ms (subtracted below)")
    print(f"import numpy           {numpy_ms:7.1f} ms")
    print(f"import onemodel.runtime {ours:6.1f} ms")
    try:
        theirs = startup_ms("import onnxruntime", args.runs) - bare
        print(f"import onnxruntime     {theirs:7.1f} ms")
        print(f"ratio onemodel.runtime / onnxruntime: {ours / theirs:.2f}x")
    except subprocess.CalledProcessError:
        print("onnxruntime is not installed")


if __name__ == "__main__":
    main()
