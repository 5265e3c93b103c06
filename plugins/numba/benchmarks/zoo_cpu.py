"""The model-zoo ratio against onnxruntime measured in CPU time instead of wall time, for a
machine that other jobs load: per network, one thread each (onnxruntime with one intra-op
thread runs its kernels on the calling thread), runs paired and interleaved, each timed with
``time.thread_time`` (the calling thread's CPU time, which preemption does not inflate), the
median of the paired ratios printed with the median times. Cache and memory-bandwidth
contention from other jobs still slows both sides.

    ONEMODEL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
        python plugins/numba/benchmarks/zoo_cpu.py [--runs 9] [network ...]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "integration-tests" / "onnx"))
import zoo

from onemodel.onnx.importer import from_model
from onemodel.runtime import Session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("networks", nargs="*")
    args = parser.parse_args()
    import onnxruntime as ort

    ratios = []
    print(f"{'network':14s} {'ours cpu ms':>11s} {'ort cpu ms':>10s} {'ratio':>6s}")
    for name in args.networks or zoo.available():
        model = zoo.randomized(zoo.load(name), seed=1)
        key, x = zoo.data_input(model)
        feeds = {key: np.random.default_rng(2).standard_normal(x.shape).astype(np.float32)}
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
        opts.log_severity_level = 3
        theirs = ort.InferenceSession(model.SerializeToString(), opts,
                                      providers=["CPUExecutionProvider"])
        ours = Session(from_model(model), threads=1)
        ours.run(feeds)
        theirs.run(None, feeds)
        o, t = [], []
        for _ in range(args.runs):
            t0 = time.thread_time()
            ours.run(feeds)
            t1 = time.thread_time()
            theirs.run(None, feeds)
            t2 = time.thread_time()
            o.append(t1 - t0)
            t.append(t2 - t1)
        r = statistics.median(a / b for a, b in zip(o, t))
        ratios.append(r)
        print(f"{name:14s} {statistics.median(o) * 1e3:11.1f} {statistics.median(t) * 1e3:10.1f} "
              f"{r:5.2f}x", flush=True)
    if ratios:
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"{'geometric mean':14s} {'':11s} {'':10s} {geo:5.2f}x")


if __name__ == "__main__":
    main()
