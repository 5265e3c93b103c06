"""Latency of the nine model-zoo networks shipped inside the onnx package, with seeded random
weights: OneModel's session against onnxruntime's on the same input, one thread each. Runs are
paired (one of each, alternating) and the ratio of the medians is printed per network, with the
geometric mean.

    python benchmarks/onnx_zoo.py [--runs 5]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration-tests" / "onnx"))
import zoo  # noqa: E402

from onemodel.onnx.importer import from_model  # noqa: E402
from onemodel.runtime import Session  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3  # these files carry unused initializers ORT warns about
    print(f"{'network':14s} {'onemodel ms':>12s} {'ort ms':>9s} {'ratio':>6s}")
    ratios = []
    for name in zoo.available():
        model = zoo.randomized(zoo.load(name), seed=1)
        key, x = zoo.data_input(model)
        x = np.random.default_rng(2).standard_normal(x.shape).astype(np.float32)
        ours = Session(from_model(model))
        theirs = ort.InferenceSession(model.SerializeToString(), opts,
                                      providers=["CPUExecutionProvider"])
        ours.run({key: x})
        theirs.run(None, {key: x})
        o_times, t_times = [], []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            ours.run({key: x})
            o_times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            theirs.run(None, {key: x})
            t_times.append(time.perf_counter() - t0)
        o, t = statistics.median(o_times) * 1e3, statistics.median(t_times) * 1e3
        ratios.append(o / t)
        print(f"{name:14s} {o:12.1f} {t:9.1f} {o / t:5.2f}x", flush=True)
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"{'geometric mean':14s} {'':12s} {'':9s} {geo:5.2f}x")


if __name__ == "__main__":
    main()
