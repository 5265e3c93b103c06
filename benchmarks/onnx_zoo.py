"""Latency of the nine model-zoo networks shipped inside the onnx package, with seeded random
weights: OneModel's session against onnxruntime's on the same input, at 1 and at 2 threads
(``Session(..., threads=n)`` against ORT's ``intra_op_num_threads``, its spinning off). Runs are
paired (one of each, alternating); per network the median of each and the median of the paired ratios are
printed, then the geometric mean of the ratios per thread count.

    python benchmarks/onnx_zoo.py [--runs 7] [--threads 1 2] [network ...]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration-tests" / "onnx"))
import zoo

from onemodel.onnx.importer import from_model
from onemodel.runtime import Session


def paired(ours, theirs, runs: int) -> tuple[float, float, float]:
    """(our median ms, their median ms, median of the per-pair ratios)."""
    ours()
    theirs()
    o_times, t_times = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        ours()
        o_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        theirs()
        t_times.append(time.perf_counter() - t0)
    ratios = [o / t for o, t in zip(o_times, t_times)]
    return statistics.median(o_times) * 1e3, statistics.median(t_times) * 1e3, \
        statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("networks", nargs="*")
    args = parser.parse_args()
    import onnxruntime as ort

    names = args.networks or zoo.available()
    ratios: dict[int, list[float]] = {n: [] for n in args.threads}
    head = "".join(f" {'ours ms':>9s} {'ort ms':>8s} {'ratio':>6s}" for _ in args.threads)
    print(f"{'network':14s}" + head)
    print(f"{'':14s}" + "".join(f" {f'--- {n} thread(s) ---':>25s}" for n in args.threads))
    for name in names:
        model = zoo.randomized(zoo.load(name), seed=1)
        key, x = zoo.data_input(model)
        x = np.random.default_rng(2).standard_normal(x.shape).astype(np.float32)
        try:
            graph = from_model(model)
        except Exception as exc:  # report and go on: one network must not hide the others
            print(f"{name:14s} not run: {type(exc).__name__}: {exc}", flush=True)
            continue
        cells = []
        for n in args.threads:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads, opts.inter_op_num_threads = n, 1
            opts.log_severity_level = 3  # these files carry unused initializers ORT warns about
            # ORT's idle workers spin by default; interleaved with our runs on the same cores
            # they would take the CPU from our threads (and numba's from ORT's, which wait
            # passively), so neither side spins
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
            theirs = ort.InferenceSession(model.SerializeToString(), opts,
                                          providers=["CPUExecutionProvider"])
            ours = Session(graph, threads=n)
            feeds = {key: x}
            o, t, r = paired(lambda s=ours, f=feeds: s.run(f),
                             lambda s=theirs, f=feeds: s.run(None, f), args.runs)
            ratios[n].append(r)
            cells.append(f" {o:9.1f} {t:8.1f} {r:5.2f}x")
        print(f"{name:14s}" + "".join(cells), flush=True)
    geo = [math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")
           for v in ratios.values()]
    print(f"{'geometric mean':14s}" + "".join(f" {'':9s} {'':8s} {g:5.2f}x" for g in geo))


if __name__ == "__main__":
    main()
