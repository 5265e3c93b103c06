"""Serving soak: one Session, 8 threads, 10,000 runs with fresh data at mixed batch sizes.

Checks what a busy server needs (a benchmark, not a timed test):

- every threaded result is bit-exact against a single-threaded run of the same input on a
  separate Session;
- the Session builds one plan per distinct input shape, whatever the input values;
- resident memory stays flat after warm-up (RSS sampled every 500 runs, from the first 500
  threaded runs on).

The model is the hand-built conv net of the runtime tests (Conv, BatchNorm, pooling, a symbolic
flatten through Shape, Gemm), which used to make one plan per input value.

    python benchmarks/serving_soak.py [--runs 10000] [--threads 8] [--model conv_net]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # one BLAS thread: results are then deterministic per input

import argparse  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "packages/runtime/tests"))
from runtime_graphs import attention, conv_net, random_feeds  # noqa: E402

from onemodel.runtime import Session  # noqa: E402

MODELS = {"conv_net": conv_net, "attention": attention}
BATCHES = (1, 2, 3, 5, 8, 16)


def rss_mib() -> float:
    """Current resident set size (Linux /proc; the peak from getrusage elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def feeds_for(graph, i: int) -> dict[str, np.ndarray]:
    """Run i's input: fresh values (seed i) at a batch size chosen by i."""
    batch = BATCHES[(i * 7919) % len(BATCHES)]
    return random_feeds(graph, {"batch": batch, "seq": 4 + i % 3}, seed=i)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--model", choices=list(MODELS), default="conv_net")
    args = parser.parse_args()
    graph = MODELS[args.model]()
    shapes = {tuple(a.shape for a in feeds_for(graph, i).values()) for i in range(args.runs)}

    # single-threaded reference, on a Session of its own
    reference = Session(graph)
    t0 = time.perf_counter()
    want = [reference.run(feeds_for(graph, i))["output"].numpy() for i in range(args.runs)]
    single_s = time.perf_counter() - t0
    del reference

    session = Session(graph)
    for i in range(len(BATCHES) * 4):  # warm-up: every shape planned, allocator settled
        session.run(feeds_for(graph, i))
    rss = [rss_mib()]
    mismatches: list[int] = []
    errors: list[BaseException] = []
    counter = iter(range(args.runs))
    lock = threading.Lock()
    done = [0]

    def worker() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            try:
                got = session.run(feeds_for(graph, i))["output"].numpy()
            except BaseException as exc:  # reported below
                errors.append(exc)
                return
            if got.shape != want[i].shape or got.tobytes() != want[i].tobytes():
                mismatches.append(i)
            with lock:
                done[0] += 1
                if done[0] % 500 == 0:
                    rss.append(rss_mib())

    threads = [threading.Thread(target=worker) for _ in range(args.threads)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    threaded_s = time.perf_counter() - t0
    rss.append(rss_mib())
    info = session.cache_info()

    print(f"model {args.model}: {args.runs} runs, {args.threads} threads, batch sizes "
          f"{list(BATCHES)} ({len(shapes)} distinct input shapes), fresh data every run")
    print(f"errors: {len(errors)}" + (f" (first: {errors[0]!r})" if errors else ""))
    print(f"bit-exact against single-threaded: {args.runs - len(mismatches) - len(errors)} of "
          f"{args.runs} ({len(mismatches)} mismatches)")
    print(f"plans built: {info.builds} (distinct shapes: {len(shapes)}); cache hits {info.hits}, "
          f"evictions {info.evictions}, plans held {info.plans}, plan bytes {info.nbytes}")
    warm = rss[1:]  # from the first sample with the threads running (their stacks, arenas)
    print(f"RSS before the threads {rss[0]:.1f} MiB; after {min(500, args.runs)} threaded runs "
          f"{warm[0]:.1f} MiB, at the end {warm[-1]:.1f} MiB (change {warm[-1] - warm[0]:+.1f} "
          f"MiB; min {min(warm):.1f}, max {max(warm):.1f} over {len(warm)} samples)")
    print("RSS samples (MiB): " + " ".join(f"{r:.1f}" for r in rss))
    print(f"wall time: single-threaded reference {single_s:.2f} s, {args.threads} threads {threaded_s:.2f} s")
    ok = not errors and not mismatches and info.builds == len(shapes)
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
