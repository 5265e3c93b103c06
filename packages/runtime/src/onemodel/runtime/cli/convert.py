"""``onemodel convert A B``: between formats, chosen by the files' extensions."""

from __future__ import annotations

import click

from .. import serializers


@click.command("convert")
@click.argument("source", type=click.Path(dir_okay=False))
@click.argument("target", type=click.Path(dir_okay=False))
@click.option("--opset", type=int, default=None, help="ONNX opset to write (ONNX targets only).")
def convert_command(source: str, target: str, opset: int | None) -> None:
    """Load SOURCE and save it as TARGET (.onemodel <-> .onnx, or any installed format)."""
    record = serializers.for_saving(target)
    options = {}
    if opset is not None:
        if record.name != "onnx":
            raise click.UsageError(f"--opset applies to ONNX targets, not {record.name}")
        options["opset"] = opset
    graph = serializers.load(source)
    serializers.save(graph, target, **options)
    click.echo(f"wrote {target} ({record.name}, {len(graph.nodes)} nodes)")
