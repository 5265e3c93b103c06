"""``onemodel check A B``: two model files give the same outputs at several sizes."""

from __future__ import annotations

import json

import click
import numpy as np

from onemodel.tensors import OneModelError

from .feeds import check_known, graph_symbols, parse_sizes, random_feeds, size_combinations
from .sessions import open_session

DEFAULT_SIZES = (1, 3, 8)


@click.command("check")
@click.argument("first", type=click.Path(dir_okay=False))
@click.argument("second", type=click.Path(dir_okay=False))
@click.option("--sizes", "sizes_opt", multiple=True, metavar="AXIS=N[,N...]",
              help=f"Sizes to try per symbolic axis (default {','.join(map(str, DEFAULT_SIZES))}); "
                   "every combination is tried, or an even sample of 24 when there are more.")
@click.option("--rtol", type=float, default=1e-4, show_default=True)
@click.option("--atol", type=float, default=1e-5, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def check_command(first: str, second: str, sizes_opt: tuple[str, ...], rtol: float, atol: float,
                  seed: int, as_json: bool) -> None:
    """Run FIRST and SECOND on the same random inputs at several sizes of each symbolic axis and
    print the largest difference; exit status 1 when it exceeds the tolerance."""
    a, b = open_session(first), open_session(second)
    names_a = [v.name for v in a.graph.inputs]
    if sorted(names_a) != sorted(v.name for v in b.graph.inputs):
        raise OneModelError(f"the models' inputs differ: {names_a} and "
                            f"{[v.name for v in b.graph.inputs]}")
    given = parse_sizes(sizes_opt, many=True)
    check_known(a.graph, given)
    sizes = {s: given.get(s, list(DEFAULT_SIZES)) for s in graph_symbols(a.graph)}
    rng = np.random.default_rng(seed)
    rows, worst, failed = [], 0.0, False
    for combo in size_combinations(sizes):
        label = ", ".join(f"{k}={v}" for k, v in combo.items()) or "static shapes"
        feeds = random_feeds(a.graph.inputs, combo, rng)
        outcome = [_run(s, feeds) for s in (a, b)]
        errors = [o for o in outcome if isinstance(o, str)]
        if len(errors) == 2:
            rows.append({"sizes": combo, "status": "refused by both", "detail": errors[0]})
            continue
        if errors:
            which = first if isinstance(outcome[0], str) else second
            rows.append({"sizes": combo, "status": "FAIL", "detail": f"{which}: {errors[0]}"})
            failed = True
            continue
        diff, over = _compare(outcome[0], outcome[1], rtol, atol)
        worst = max(worst, diff)
        failed |= over is not None
        rows.append({"sizes": combo, "status": "FAIL" if over else "ok", "largest_difference": diff,
                     **({"detail": over} if over else {})})
    if as_json:
        click.echo(json.dumps({"first": first, "second": second, "rtol": rtol, "atol": atol,
                               "largest_difference": worst, "ok": not failed, "runs": rows},
                              indent=2))
    else:
        for r in rows:
            label = ", ".join(f"{k}={v}" for k, v in r["sizes"].items()) or "static shapes"
            diff = f"  largest difference {r['largest_difference']:.3g}" \
                if "largest_difference" in r else ""
            click.echo(f"{label}: {r['status']}{diff}" + (f"  ({r['detail']})" if "detail" in r
                                                          else ""))
        click.echo(f"largest difference: {worst:.3g} (rtol {rtol:g}, atol {atol:g})")
    if failed:
        raise click.exceptions.Exit(1)


def _run(session, feeds) -> dict[str, np.ndarray] | str:
    try:
        return {k: v.numpy() for k, v in session.run(feeds).items()}
    except OneModelError as exc:
        return " ".join(str(exc).split())


def _compare(x: dict, y: dict, rtol: float, atol: float) -> tuple[float, str | None]:
    """Largest absolute difference, and what exceeded the tolerance (None if nothing did).
    Outputs pair by name, or by position when the two files name them differently."""
    pairs = ([(k, x[k], y[k]) for k in x] if set(x) == set(y)
             else [(f"{k1}/{k2}", x[k1], y[k2]) for k1, k2 in zip(x, y)])
    if len(x) != len(y):
        return float("inf"), f"{len(x)} outputs against {len(y)}"
    worst, over = 0.0, None
    for name, p, q in pairs:
        if p.shape != q.shape:
            return float("inf"), f"output {name}: shapes {list(p.shape)} and {list(q.shape)}"
        if p.size == 0:
            continue
        p64, q64 = p.astype(np.float64), q.astype(np.float64)
        same_nan = np.isnan(p64) & np.isnan(q64)
        diff = np.where(same_nan, 0.0, np.abs(p64 - q64))
        d = float(np.max(diff))
        worst = max(worst, d if np.isfinite(d) else float("inf"))
        if over is None and not np.all(diff <= atol + rtol * np.abs(q64)):
            over = f"output {name} differs by up to {d:.3g}"
    return worst, over
