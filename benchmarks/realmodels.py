"""Latency of the real-model suite (issue 12: transformers and torchvision architectures with
random weights, exported to ONNX by PyTorch, integration-tests/realmodels): OneModel's session
against onnxruntime's on the same file and the same inputs (the first feed set of each model's
spec), one inference per run. Both sessions are warmed up, then timed in pairs (one of each, the
order alternating); per model the medians of each and the median of the paired ratios are
printed, then the geometric mean of the ratios. A model that fails to export, load or run is
listed with the first line of its error, and the others go on.

Exported files come from the suite's cache (exported on first use, which takes a while).

    python benchmarks/realmodels.py [--models bert,tv_resnet18] [--exporter torchscript|dynamo]
                                    [--threads 1] [--runs 5] [--include-slow]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

SUITE = Path(__file__).resolve().parent.parent / "integration-tests" / "realmodels"


def paired(ours: Callable[[], object], theirs: Callable[[], object], runs: int
           ) -> tuple[float, float, float]:
    """(our median ms, their median ms, median of the per-pair ratios), after one warm-up run
    of each; the order inside a pair alternates so neither side always runs on a warmer cache."""
    ours()
    theirs()
    o_times, t_times = [], []
    for k in range(runs):
        for fn, times in ((ours, o_times), (theirs, t_times))[::1 if k % 2 == 0 else -1]:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    ratios = [o / t for o, t in zip(o_times, t_times)]
    return (statistics.median(o_times) * 1e3, statistics.median(t_times) * 1e3,
            statistics.median(ratios))


@contextlib.contextmanager
def quiet_stdout():
    """Standard output (the file descriptor, which C++ code writes to) sent to /dev/null."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:160]


def suites() -> tuple[dict[str, tuple[object, object]], list[str]]:
    """name -> (spec, exported(name, exporter) function) over both suites, and the reasons a
    suite is missing. The transformers suite is imported first: it hides a torchvision that
    cannot load while transformers records what is installed (as the tests' order does)."""
    if str(SUITE) not in sys.path:
        sys.path.insert(0, str(SUITE))
    models: dict[str, tuple[object, object]] = {}
    missing = []
    try:
        import builders

        models.update({n: (s, builders.exported) for n, s in builders.specs().items()})
    except Exception as exc:  # report and go on with the other suite
        missing.append(f"transformers suite: {first_line(exc)}")
    try:
        import torchvision_models as tvm

        tvm.load_torchvision()
        models.update({n: (s, tvm.exported) for n, s in tvm.specs().items()})
    except Exception as exc:
        missing.append(f"torchvision suite: {first_line(exc)}")
    return models, missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="",
                        help="comma-separated model names (default: every model not marked slow)")
    parser.add_argument("--exporter", choices=("torchscript", "dynamo"), default="torchscript")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--include-slow", action="store_true",
                        help="with no --models: the slow models too")
    args = parser.parse_args(argv)
    # torch (imported by the suites) loads libgomp before the numba plugin can ask its OpenMP
    # workers to sleep between kernels; spinning, they took the CPU from our serial kernels on
    # a loaded machine (ResNet 0.5 ms became 45 ms). Set here first, as the training benchmark does.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    import numpy as np
    import onnxruntime as ort

    from onemodel.runtime import Session

    models, missing = suites()
    for line in missing:
        print(f"not available: {line}", flush=True)
    if args.models:
        names = [n.strip() for n in args.models.split(",") if n.strip()]
        unknown = [n for n in names if n not in models]
        if unknown:
            print(f"unknown models: {', '.join(unknown)}; known: {', '.join(models)}",
                  file=sys.stderr)
            return 2
    else:
        names = [n for n, (spec, _) in models.items() if args.include_slow or not spec.slow]

    print(f"exporter {args.exporter}, {args.threads} thread(s), median of {args.runs} paired runs")
    print(f"{'model':28s} {'ORT ms':>9s} {'OneModel ms':>12s} {'ratio':>7s} {'max diff':>9s}  input")
    ratios, failed = [], []
    for name in names:
        spec, exported = models[name]
        try:
            # the TorchScript exporter prints its whole graph when it fails: keep the table readable
            with quiet_stdout():
                path = exported(name, args.exporter)
        except Exception as exc:
            failed.append((name, f"export: {first_line(exc)}"))
            print(f"{name:28s} not run: export failed", flush=True)
            continue
        feeds = spec.feeds(0, args.exporter)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
        opts.log_severity_level = 3
        # as in onnx_zoo.py: ORT's idle workers would spin on the cores our runs use
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            theirs = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            want = theirs.run(None, feeds)[0]
        except Exception as exc:
            failed.append((name, f"onnxruntime: {first_line(exc)}"))
            print(f"{name:28s} not run: onnxruntime failed", flush=True)
            continue
        try:
            ours = Session.load(path, threads=args.threads)
            got = ours.run(feeds, return_numpy=True)[ours.graph.outputs[0].name]
        except Exception as exc:  # one model must not hide the others
            failed.append((name, first_line(exc)))
            print(f"{name:28s} not run: OneModel failed", flush=True)
            continue
        # the largest difference relative to the output's scale: a fast wrong answer is no win
        diff = float(np.max(np.abs(np.asarray(got, np.float64) - want))
                     / max(float(np.max(np.abs(want))), 1e-12)) if want.size else 0.0
        o, t, r = paired(lambda s=ours, f=feeds: s.run(f),
                         lambda s=theirs, f=feeds: s.run(None, f), args.runs)
        ratios.append(r)
        shape = "x".join(map(str, next(iter(feeds.values())).shape))
        print(f"{name:28s} {t:9.2f} {o:12.2f} {r:6.2f}x {diff:9.1e}  {shape}", flush=True)
    if ratios:
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"{'geometric mean':28s} {'':9s} {'':12s} {geo:6.2f}x   ({len(ratios)} models)")
    for name, why in failed:
        print(f"failed: {name}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
