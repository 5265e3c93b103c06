"""Where a Session's time goes: every step of a plan timed on its own, summed per op, for the
model-zoo networks (or the networks named). One thread, like onnx_zoo.py.

    python benchmarks/profile_session.py [--runs 3] [--top 6] [network ...]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("ONEMODEL_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration-tests" / "onnx"))
import zoo  # noqa: E402

from onemodel.onnx.importer import from_model  # noqa: E402
from onemodel.runtime import Session  # noqa: E402


def profile(session: Session, feeds: dict, runs: int) -> tuple[float, dict[str, float]]:
    """Median run time (ms) and the median time per op (ms, steps of one op summed)."""
    from onemodel.runtime.planner import make_plan

    shapes = {k: np.asarray(v).shape for k, v in feeds.items()}
    plan = make_plan(session.graph, shapes, [v.name for v in session.graph.outputs])
    per_op: dict[str, list[float]] = defaultdict(list)
    totals = []
    for _ in range(runs):
        vals = plan.template.copy()
        for (name, slot) in plan.inputs:
            vals[slot] = np.asarray(feeds[name])
        acc: dict[str, float] = defaultdict(float)
        start = time.perf_counter()
        for step in plan.steps:
            t0 = time.perf_counter()
            out = step.call(step.gather(vals)) if step.single_input else \
                step.call(*step.gather(vals))
            acc[step.label.rsplit("(", 1)[-1].rstrip(")")] += time.perf_counter() - t0
            if step.multi:
                for slot, v in zip(step.outs, out):
                    vals[slot] = v
            else:
                vals[step.outs[0]] = out
            for slot in step.release:
                vals[slot] = None
        totals.append(time.perf_counter() - start)
        for op, t in acc.items():
            per_op[op].append(t)
    return statistics.median(totals) * 1e3, {op: statistics.median(v) * 1e3
                                             for op, v in per_op.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--top", type=int, default=6)
    parser.add_argument("networks", nargs="*")
    args = parser.parse_args()
    for name in args.networks or zoo.available():
        model = zoo.randomized(zoo.load(name), seed=1)
        key, x = zoo.data_input(model)
        x = np.random.default_rng(2).standard_normal(x.shape).astype(np.float32)
        total, per_op = profile(Session(from_model(model)), {key: x}, args.runs)
        steps = sum(per_op.values())
        top = sorted(per_op.items(), key=lambda kv: -kv[1])[:args.top]
        parts = ", ".join(f"{op} {t / total:.0%}" for op, t in top)
        print(f"{name:13s} {total:8.1f} ms  (overhead {max(total - steps, 0) / total:.0%}) {parts}",
              flush=True)


if __name__ == "__main__":
    main()
