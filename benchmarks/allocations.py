"""Memory allocated per steady-state run (issue 11): with planned output buffers (kernels that
write ``out=`` reuse the plan's buffers from run to run) and without them
(``Session(planned_buffers=False)``, what ``ONEMODEL_PLANNED_BUFFERS=0`` selects).

For each model and each way, after two warm-up runs, over ``--runs`` runs:

- allocs, alloc MB, >=1MiB: numpy's data allocations (tracemalloc, domain
  ``np.lib.tracemalloc_domain``) that each step's kernel made and still holds when it returns
  (its outputs, mostly), summed over a run's steps: their number, bytes, and how many are
  large. Scratch a kernel frees before returning is not in them, but is in the peak. Each
  step's call is wrapped to take the snapshots (the plan's own steps; the steps of plans after
  a data-dependent size are not wrapped);
- peak MB: the run's peak of traced memory above what was held before it; the planned buffers
  exist before the run, so ``buffers MB`` lists them (every set the plan keeps);
- CPU ms: median CPU time (``time.process_time``, every thread) of a run, measured without the
  wrappers and without tracemalloc, the two ways alternating.

Models: the ONNX zoo's ResNet-50 (seeded random weights, benchmarks/onnx_zoo.py's loader) and
models of the real-model suite (integration-tests/realmodels, exported on first use).

    ONEMODEL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/allocations.py \
        [--models zoo:resnet50,tv_resnet18] [--runs 5]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20
DOMAIN = np.lib.tracemalloc_domain


def load_model(name: str):
    """(graph, feeds) of ``zoo:<network>`` or of a real-model suite model."""
    if name.startswith("zoo:"):
        sys.path.insert(0, str(ROOT / "integration-tests" / "onnx"))
        import zoo

        from onemodel.onnx.importer import from_model

        model = zoo.randomized(zoo.load(name[4:]), seed=1)
        key, x = zoo.data_input(model)
        x = np.random.default_rng(2).standard_normal(x.shape).astype(np.float32)
        return from_model(model), {key: x}
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import realmodels

    from onemodel.runtime.serializers import load

    models, missing = realmodels.suites()
    if name not in models:
        raise SystemExit(f"unknown model {name!r}; known: {', '.join(models)} "
                         f"{'; ' + '; '.join(missing) if missing else ''}")
    spec, exported = models[name]
    with realmodels.quiet_stdout():
        path = exported(name, "torchscript")
    return load(path), spec.feeds(0, "torchscript")


class Counter:
    """Wraps a plan's step calls to count, per run, the numpy data blocks (tracemalloc domain
    ``np.lib.tracemalloc_domain``) that the steps' kernels allocate and still hold when they
    return: their number, bytes, and how many are large (>= 1 MiB)."""

    def __init__(self, plan):
        self.reset()
        for step in plan.steps:
            step.call = self._wrap(step.call)

    def reset(self):
        self.count = self.bytes = self.large = 0

    def _wrap(self, call):
        def counted(*args, **kwargs):
            before = _numpy_blocks()
            got = call(*args, **kwargs)
            for (size, _), n in (_numpy_blocks() - before).items():
                self.count += n
                self.bytes += n * size
                self.large += n * (size >= MIB)
            return got

        return counted


def _numpy_blocks() -> collections.Counter:
    """(size, traceback) -> number of numpy data blocks tracemalloc traces now. Only what was
    allocated since tracing started is traced, so the snapshot stays small."""
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, DOMAIN)])
    return collections.Counter((t.size, t.traceback) for t in snap.traces)


def measure(graph, feeds, buffers: bool, runs: int) -> dict:
    from onemodel.runtime import Session

    s = Session(graph, threads=1, planned_buffers=buffers)
    for _ in range(2):
        s.run(feeds)
    (plan,) = list(s._plans.values())
    pool = plan.buffer_pool
    counter = Counter(plan)
    rows = []
    tracemalloc.start()
    try:
        for _ in range(runs):
            counter.reset()
            start = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            s.run(feeds)
            peak = tracemalloc.get_traced_memory()[1] - start
            rows.append((counter.count, counter.bytes, counter.large, peak))
    finally:
        tracemalloc.stop()
    med = [statistics.median(col) for col in zip(*rows)]
    return {"count": med[0], "bytes": med[1], "large": med[2], "peak": med[3],
            "buffers": pool.kept * pool.set_nbytes if pool is not None else 0,
            "buffered": sum(st.buf >= 0 for st in plan.steps), "steps": len(plan.steps)}


def latency(graph, feeds, runs: int) -> tuple[float, float]:
    """Median CPU ms of a run with and without planned buffers, the two alternating."""
    from onemodel.runtime import Session

    sessions = [Session(graph, threads=1, planned_buffers=b) for b in (True, False)]
    for s in sessions:
        for _ in range(2):
            s.run(feeds)
    times: list[list[float]] = [[], []]
    for k in range(runs):
        for i in ((0, 1) if k % 2 == 0 else (1, 0)):
            t0 = time.process_time()
            sessions[i].run(feeds)
            times[i].append(time.process_time() - t0)
    return statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="zoo:resnet50,tv_resnet18")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as benchmarks/realmodels.py
    print(f"per steady-state run, median of {args.runs}; buffers: planned buffers on / off")
    print(f"{'model':16s} {'buffers':>7s} {'steps':>9s} {'allocs':>7s} {'alloc MB':>8s} "
          f"{'>=1MiB':>6s} {'peak MB':>8s} {'buffers MB':>10s} {'CPU ms':>8s}")
    for name in [n.strip() for n in args.models.split(",") if n.strip()]:
        graph, feeds = load_model(name)
        on_ms, off_ms = latency(graph, feeds, max(args.runs, 5))
        for buffers, ms in ((False, off_ms), (True, on_ms)):
            r = measure(graph, feeds, buffers, args.runs)
            steps = f"{r['buffered']}/{r['steps']}"
            print(f"{name:16s} {'on' if buffers else 'off':>7s} {steps:>9s} {r['count']:7.0f} "
                  f"{r['bytes'] / MIB:8.2f} {r['large']:6.0f} {r['peak'] / MIB:8.2f} "
                  f"{r['buffers'] / MIB:10.2f} {ms:8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
