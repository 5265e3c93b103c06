"""``onemodel plugins``: what the registry loaded, and which kernels serve each op."""

from __future__ import annotations

import json

import click

from onemodel.tensors import registry


@click.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--kernels/--no-kernels", default=True, help="List the kernels registered per op.")
def plugins_command(as_json: bool, kernels: bool) -> None:
    """Loaded plugins with their versions and hooks, and the kernels registered per op."""
    plugins = [{"name": p.name, "version": p.version, "distribution": p.distribution,
                "hooks": p.hooks} for p in registry.list_plugins()]
    table = {}
    if kernels:
        for op, recs in sorted(registry.kernels().items()):
            table[op] = [{"plugin": r.plugin, "device": r.device, "priority": r.priority,
                          "dtypes": None if r.dtypes is None else sorted(d.name for d in r.dtypes),
                          "supports_check": r.supports is not None} for r in recs]
    if as_json:
        click.echo(json.dumps({"plugins": plugins, "kernels": table}, indent=2))
        return
    click.echo(f"{len(plugins)} plugins:")
    for p in plugins:
        click.echo(f"  {p['name']} {p['version']}"
                   + (f" ({p['distribution']})" if p["distribution"] else ""))
        click.echo(f"    hooks: {', '.join(p['hooks']) or 'none'}")
    if kernels:
        click.echo(f"kernels for {len(table)} ops (best first):")
        for op, recs in table.items():
            click.echo(f"  {op}: " + ", ".join(
                f"{r['plugin']}[{r['device']}, priority {r['priority']}]" for r in recs))
