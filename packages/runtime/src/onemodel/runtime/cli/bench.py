"""``onemodel bench MODEL``: latency percentiles and throughput, optionally paired against
onnxruntime on the same inputs."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import click
import numpy as np

from onemodel.tensors import OneModelError

from .. import serializers
from .feeds import check_known, graph_symbols, parse_sizes, random_feeds
from .sessions import open_session


@click.command("bench")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--shape", "-s", "shapes", multiple=True, metavar="AXIS=SIZE",
              help="Size of a symbolic axis (default 1).")
@click.option("--runs", type=click.IntRange(1), default=100, show_default=True)
@click.option("--warmup", type=click.IntRange(0), default=10, show_default=True)
@click.option("--threads", type=int, default=None, help="Threads for both engines.")
@click.option("--against", type=click.Choice(["onnxruntime"]), default=None,
              help="Time this engine too, interleaved run by run, and print the ratio.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_command(model: str, shapes: tuple[str, ...], runs: int, warmup: int,
                  threads: int | None, against: str | None, seed: int, as_json: bool) -> None:
    """Time MODEL on random inputs; percentiles in milliseconds and runs per second."""
    session = open_session(model, threads)
    sizes = {k: v[0] for k, v in parse_sizes(shapes).items()}
    check_known(session.graph, sizes)
    bindings = {s: sizes.get(s, 1) for s in graph_symbols(session.graph)}
    feeds = random_feeds(session.graph.inputs, bindings, np.random.default_rng(seed))
    engines = {"onemodel": lambda: session.run(feeds)}
    if against == "onnxruntime":
        engines["onnxruntime"] = _onnxruntime(model, feeds, threads)
    for _ in range(warmup):
        for fn in engines.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in engines}
    with click.progressbar(range(runs), label="timing", file=sys.stderr) as bar:
        for _ in bar:
            for name, fn in engines.items():  # interleaved: both see the same machine state
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    report = {"model": model, "sizes": bindings, "runs": runs,
              **{name: _stats(t) for name, t in times.items()}}
    if against:
        paired = np.array(times["onemodel"]) / np.array(times[against])
        report["ratio"] = {"against": against, "median_of_paired": float(np.median(paired)),
                           "of_medians": report["onemodel"]["p50_ms"] / report[against]["p50_ms"]}
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for name in engines:
        s = report[name]
        click.echo(f"{name}: p50 {s['p50_ms']:.3f} ms, p90 {s['p90_ms']:.3f} ms, "
                   f"p99 {s['p99_ms']:.3f} ms, {s['runs_per_s']:.1f} runs/s")
    if against:
        click.echo(f"onemodel/{against} latency ratio: {report['ratio']['median_of_paired']:.2f} "
                   f"(median of {runs} paired runs)")


def _stats(seconds: list[float]) -> dict[str, float]:
    ms = np.array(seconds) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p90_ms": float(np.percentile(ms, 90)),
            "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean()),
            "runs_per_s": float(1e3 / ms.mean())}


def _onnxruntime(model: str, feeds: dict, threads: int | None):
    try:
        import onnxruntime as ort
    except ImportError:
        raise OneModelError("--against onnxruntime needs onnxruntime: pip install onnxruntime") \
            from None
    if serializers.for_loading(model).name == "onnx":
        path = model
    else:  # export once to a temporary ONNX file (needs the onnx serializer)
        fd, path = tempfile.mkstemp(suffix=".onnx")
        os.close(fd)
        serializers.save(serializers.load(model), path, format="onnx")
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    try:
        sess = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    finally:
        if path != model:
            os.unlink(path)
    return lambda: sess.run(None, feeds)
