"""``onemodel inspect MODEL``: what a model file holds, without running it."""

from __future__ import annotations

import json
from collections import Counter

import click
import numpy as np

from onemodel.tensors import DimExpr, registry

from .. import serializers


@click.command("inspect")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def inspect_command(model: str, as_json: bool) -> None:
    """Inputs and outputs (with symbolic axes), guards, ops used, parameters, format, metadata.

    Parameters are the floating-point initializers; integer ones (shapes, indices) are counted
    as constants."""
    record = serializers.for_loading(model)
    graph = serializers.load(model)
    details = registry.resolve(record.describe)(model) if record.describe else {}
    weights = [a for a in graph.initializers.values() if a.dtype.kind in "fc"]
    params = sum(int(a.size) for a in weights)
    info = {
        "path": model,
        "format": record.name,
        **details,
        "name": graph.name,
        "inputs": [_io(v) for v in graph.inputs],
        "outputs": [_io(v) for v in graph.outputs],
        "guards": [str(g) for g in getattr(graph, "guards", ())],
        "ops": dict(sorted(Counter(n.op for n in graph.nodes).items(),
                           key=lambda kv: (-kv[1], kv[0]))),
        "nodes": len(graph.nodes),
        "parameters": params,
        "parameter_bytes": sum(int(a.nbytes) for a in weights),
        "constants": len(graph.initializers) - len(weights),
        "metadata": dict(graph.metadata),
    }
    if as_json:
        click.echo(json.dumps(info, indent=2, default=_plain))
        return
    click.echo(f"{model}: {record.name} format" + "".join(f", {k} {v}" for k, v in details.items()))
    click.echo(f"graph {graph.name}: {info['nodes']} nodes, {params:,} parameters "
               f"({_bytes(info['parameter_bytes'])})")
    for kind in ("inputs", "outputs"):
        click.echo(f"{kind}:")
        for v in info[kind]:
            click.echo(f"  {v['name']}: {v['dtype']}[{', '.join(str(d) for d in v['shape'])}]")
    if info["guards"]:
        click.echo("guards:")
        for g in info["guards"]:
            click.echo(f"  {g}")
    click.echo("ops: " + ", ".join(f"{op} x{n}" for op, n in info["ops"].items()))
    if graph.metadata:
        click.echo("metadata:")
        for k, v in graph.metadata.items():
            click.echo(f"  {k}: {v}")


def _io(v) -> dict:
    return {"name": v.name, "dtype": v.dtype.name,
            "shape": [str(d) if isinstance(d, DimExpr) else int(d) for d in v.shape]}


def _plain(o):
    if isinstance(o, np.generic):
        return o.item()
    return str(o)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
