"""``onemodel run MODEL``: run once on inputs from files or random data; save the outputs."""

from __future__ import annotations

import click
import numpy as np

from onemodel.tensors import OneModelError

from .feeds import bind_from_feeds, check_known, file_feeds, parse_sizes, random_feeds
from .sessions import open_session


@click.command("run")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--input", "-i", "inputs", multiple=True, metavar="FILE.npz | NAME=FILE.npy",
              help="Feeds from files; inputs not given are random.")
@click.option("--shape", "-s", "shapes", multiple=True, metavar="AXIS=SIZE",
              help="Size of a symbolic axis for random inputs (default 1).")
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None,
              help="Write every output to this .npz file.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of random inputs.")
@click.option("--threads", type=int, default=None, help="Threads for kernels and BLAS.")
@click.option("--optimization-level", "level", type=click.Choice(["none", "basic", "all"]),
              default="all", show_default=True, help="Which optimization passes run.")
@click.option("--profile", type=click.Path(dir_okay=False), default=None,
              help="Write a Chrome trace of the run (one event per node) and print time per op.")
def run_command(model: str, inputs: tuple[str, ...], shapes: tuple[str, ...], output: str | None,
                seed: int, threads: int | None, level: str, profile: str | None) -> None:
    """Run MODEL once and print each output's shape and summary (or save them with -o)."""
    session = open_session(model, threads, level=level, profile=profile is not None)
    sizes = {k: v[0] for k, v in parse_sizes(shapes).items()}
    check_known(session.graph, sizes)
    feeds = file_feeds(inputs)
    missing = [v for v in session.graph.inputs if v.name not in feeds]
    if missing:
        bindings = {s: 1 for s in _symbols(missing)} | bind_from_feeds(session.graph, feeds) | sizes
        feeds.update(random_feeds(missing, bindings, np.random.default_rng(seed)))
    results = {k: v.numpy() for k, v in session.run(feeds).items()}
    for name, arr in results.items():
        summary = (f", mean {arr.mean():.6g}, min {arr.min():.6g}, max {arr.max():.6g}"
                   if arr.size and arr.dtype.kind in "fiu" else "")
        click.echo(f"{name}: {arr.dtype}{list(arr.shape)}{summary}")
    if profile is not None:
        click.echo(session.profile_summary())
        click.echo(f"wrote {session.end_profiling(profile)}")
    if output is not None:
        if not output.endswith(".npz"):
            raise OneModelError(f"--output {output!r}: outputs are written as .npz")
        np.savez(output, **results)
        click.echo(f"wrote {output}")


def _symbols(values) -> set[str]:
    from onemodel.tensors import DimExpr

    return {s for v in values for d in v.shape if isinstance(d, DimExpr) for s in d.symbols()}
