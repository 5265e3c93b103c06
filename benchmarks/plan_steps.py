"""Where a real-suite model's run goes, step by step: each step of its plan timed as the run
calls it (in sequence, its inputs just made by the steps before it, the other steps' data and
weights in between) and repeated alone on the same inputs (its weights and data in cache).
Printed per kind of step (op and kernel): the count and both sums; then the steps whose time in
sequence most exceeds their time alone (weights that arrive from memory, cold inputs).

Steps run one thread, through the same calls and buffers the plan's own run uses.

    python benchmarks/plan_steps.py [MODEL] [--runs 30] [--top 15]

MODEL: a name from benchmarks/realmodels.py (default tv_efficientnet_b0; mobilenet_v2, ...).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "ONEMODEL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import collections  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from realmodels import quiet_stdout, suites  # noqa: E402


def _run_steps(plan, arrays, views, seq=None, alone=None, repeats=50):
    """One pass over the plan's steps as its run makes them; with ``seq``, each step's time
    appended to seq[k]; with ``alone``, each step also repeated on its inputs (alone[k])."""
    clock = time.perf_counter
    vals = plan._slots(arrays)
    for k, st in enumerate(plan.steps):
        ins = st.gather(vals)
        if st.single_input:
            ins = (ins,)
        kw = {} if st.buf < 0 else {"out": views[st.buf]}
        t0 = clock()
        out = st.call(*ins, **kw)
        took = clock() - t0
        if seq is not None:
            seq[k].append(took)
        if alone is not None:
            for _ in range(5):
                st.call(*ins, **kw)
            t0 = clock()
            for _ in range(repeats):
                st.call(*ins, **kw)
            alone[k] = (clock() - t0) / repeats
        if st.multi:
            for slot, value in zip(st.outs, out):
                vals[slot] = value
        else:
            vals[st.outs[0]] = out
        for slot in st.release:
            vals[slot] = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="tv_efficientnet_b0")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    from onemodel.runtime import Session

    models, missing = suites()
    if args.model not in models:
        print(f"unknown model {args.model!r}; " + "; ".join(missing) if missing else
              f"unknown model {args.model!r}; models: {', '.join(sorted(models))}")
        return 2
    spec, exported = models[args.model]
    with quiet_stdout():
        path = exported(args.model, "torchscript")
    feeds = {k: np.asarray(v) for k, v in spec.feeds(0, "torchscript").items()}
    session = Session.load(path, threads=1)
    for _ in range(10):
        session.run(feeds)
    t0 = time.perf_counter()
    for _ in range(args.runs):
        session.run(feeds)
    whole = (time.perf_counter() - t0) / args.runs
    plan = session.plan_for({k: v.shape for k, v in feeds.items()})
    arrays = [feeds[name] for name, _ in plan.inputs]
    pool = plan.buffer_pool
    bufs = pool.checkout()[0] if pool is not None else None
    views = bufs.views if bufs is not None else ()
    try:
        for _ in range(3):
            _run_steps(plan, arrays, views)
        seq = collections.defaultdict(list)
        for _ in range(args.runs):
            _run_steps(plan, arrays, views, seq=seq)
        alone: dict[int, float] = {}
        _run_steps(plan, arrays, views, alone=alone)
    finally:
        if bufs is not None:
            pool.checkin(bufs)
    rows = []
    for k, st in enumerate(plan.steps):
        kernel = getattr(st.call, "__name__", type(st.call).__name__)
        rows.append((statistics.median(seq[k]) * 1e6, alone[k] * 1e6, st.op, kernel,
                     st.node or ""))
    print(f"{args.model}: a run {whole * 1e6:.0f} us; {len(rows)} steps, "
          f"{sum(r[0] for r in rows):.0f} us in sequence, {sum(r[1] for r in rows):.0f} us "
          "repeated alone")
    kinds: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for in_seq, by_itself, op, kernel, _ in rows:
        kind = kinds[(op, kernel)]
        kind[0] += 1
        kind[1] += in_seq
        kind[2] += by_itself
    print(f"  {'op':24s} {'kernel':26s} {'steps':>5s} {'in sequence':>12s} {'alone':>9s}")
    for (op, kernel), (count, in_seq, by_itself) in sorted(kinds.items(),
                                                          key=lambda kv: -kv[1][1]):
        print(f"  {op:24s} {kernel:26s} {count:5d} {in_seq:10.1f} us {by_itself:7.1f} us")
    print(f"the {args.top} steps slowest in sequence against alone:")
    for in_seq, by_itself, op, kernel, node in sorted(rows, key=lambda r: r[1] - r[0])[
            :args.top]:
        print(f"  {in_seq:7.1f} us  alone {by_itself:7.1f} us  {op} {kernel} {node}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
