"""Per zoo network: the MaxPool/AveragePool calls of one session run, each timed with the
reference kernel and with the numba kernel on the same input (CPU time of the calling thread,
medians of 9 paired calls), next to onnxruntime's own time for that pool node (its profiler's
kernel time with one intra-op thread, median over 9 runs). The evidence for registering the
numba pooling kernels, and how far they are from onnxruntime's.

    ONEMODEL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
        python plugins/numba/benchmarks/pool_zoo.py [--calls] [network ...]

``--calls`` prints one line per pooling call (op, input shape, kernel and strides, the times).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "integration-tests" / "onnx"))
import zoo

from onemodel.numba import pool
from onemodel.onnx.importer import from_model
from onemodel.runtime import Session
from onemodel.tensors.ops import OPS

NUMBA = {"MaxPool": pool.max_pool, "AveragePool": pool.average_pool}


def record(calls: list, op: str):
    """A stand-in for the numba kernel that notes each call's input and attributes (``out=``,
    the planner's buffer, is passed on but not noted)."""
    def kernel(X, out=None, **attrs):
        calls.append((op, np.array(X), attrs))
        return NUMBA[op](X, out=out, **attrs)
    return kernel


def timed(fn, X, attrs) -> float:
    t = time.thread_time()
    fn(X, **attrs)
    return time.thread_time() - t


def ort_pool_times(model, feeds, runs: int = 9) -> dict:
    """onnxruntime's kernel time (ms) per pool node, median over ``runs`` runs, keyed by
    (op, input shape) with a list per key in graph order. Its profile file is deleted."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
    opts.log_severity_level = 3
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(tempfile.gettempdir(), "pool_zoo_ort")
    session = ort.InferenceSession(model.SerializeToString(), opts,
                                   providers=["CPUExecutionProvider"])
    session.run(None, feeds)
    session.run(None, feeds)
    path = session.end_profiling()  # the warm-up runs' events: dropped with this file
    os.remove(path)
    session = ort.InferenceSession(model.SerializeToString(), opts,
                                   providers=["CPUExecutionProvider"])
    session.run(None, feeds)
    for _ in range(runs):
        session.run(None, feeds)
    path = session.end_profiling()
    with open(path, encoding="utf-8") as f:
        events = json.load(f)
    os.remove(path)
    per_node: dict = defaultdict(list)
    key_of = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        op = e["args"].get("op_name")
        if op not in NUMBA:
            continue
        shape = tuple(next(iter(e["args"]["input_type_shape"][0].values())))
        per_node[e["name"]].append(e["dur"] / 1e3)
        key_of[e["name"]] = (op, shape)
    times: dict = defaultdict(list)
    for node, durs in per_node.items():  # the first (warm-up) run's event dropped
        times[key_of[node]].append(statistics.median(durs[1:] or durs))
    return times


def main() -> None:
    args = sys.argv[1:]
    per_call = "--calls" in args
    names = [a for a in args if a != "--calls"] or zoo.available()
    calls: list = []
    pool.max_pool, pool.average_pool = record(calls, "MaxPool"), record(calls, "AveragePool")
    for name in names:
        calls.clear()
        model = zoo.randomized(zoo.load(name), seed=1)
        key, x = zoo.data_input(model)
        feeds = {key: np.random.default_rng(2).standard_normal(x.shape).astype(np.float32)}
        session = Session(from_model(model), threads=1)
        session.run(feeds)
        ort_times = ort_pool_times(model, feeds)
        seen: dict = defaultdict(int)
        ref_ms = numba_ms = ort_ms = 0.0
        for op, X, attrs in calls:
            ref, fast = OPS[op].kernel, NUMBA[op]
            ref(X, **attrs)
            fast(X, **attrs)
            pairs = [(timed(ref, X, attrs), timed(fast, X, attrs)) for _ in range(9)]
            r = statistics.median(p[0] for p in pairs) * 1e3
            f = statistics.median(p[1] for p in pairs) * 1e3
            theirs = ort_times.get((op, X.shape), [])
            o = theirs[seen[(op, X.shape)]] if seen[(op, X.shape)] < len(theirs) else float("nan")
            seen[(op, X.shape)] += 1
            ref_ms, numba_ms, ort_ms = ref_ms + r, numba_ms + f, ort_ms + o
            if per_call:
                geometry = " ".join(f"{k}={v}" for k, v in sorted(attrs.items()))
                print(f"    {op:11s} {X.shape!s:20s} ours {f:6.3f} ms  ort {o:6.3f} ms "
                      f"({f / o:4.1f}x)  reference {r:6.3f} ms  {geometry}")
        ratio = ref_ms / numba_ms if numba_ms else float("nan")
        print(f"{name:14s} {len(calls):2d} pooling calls: reference {ref_ms:6.2f} ms, "
              f"numba {numba_ms:6.2f} ms ({ratio:.2f}x faster), onnxruntime {ort_ms:6.2f} ms "
              f"(numba / onnxruntime {numba_ms / ort_ms if ort_ms else float('nan'):.2f})",
              flush=True)


if __name__ == "__main__":
    main()
