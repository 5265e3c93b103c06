"""The serializer registry: file formats for graphs, chosen by extension, then by content."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onemodel.tensors import OneModelError, registry

from .graph import Graph

# formats OneModel ships as separate plugins: what to install when one is missing
KNOWN_FORMATS = {".onemodel": ("native", "onemodel-native"), ".onnx": ("onnx", "onemodel-onnx")}


class FormatNotInstalledError(OneModelError):
    """A file format is needed whose plugin is not installed."""


@dataclass
class SerializerRecord:
    name: str
    extensions: tuple[str, ...]
    magic: bytes
    save: Any
    load: Any
    package: str
    plugin: str = ""
    describe: Any = None  # describe(path) -> {"opset": 17, ...}: format details for inspect


def serializers() -> dict[str, SerializerRecord]:
    table: dict[str, SerializerRecord] = {}
    for plugin, args, kwargs in registry.collect("onemodel_register_serializers"):
        name = args[0]
        rec = SerializerRecord(name, tuple(kwargs["extensions"]), kwargs.get("magic", b""),
                               kwargs["save"], kwargs["load"], kwargs.get("package", ""), plugin,
                               kwargs.get("describe"))
        if name in table:
            raise OneModelError(f"serializer {name!r} is registered twice ({table[name].plugin} "
                                f"and {plugin})")
        table[name] = rec
    return table


def _missing(suffix: str) -> FormatNotInstalledError:
    name, package = KNOWN_FORMATS[suffix]
    return FormatNotInstalledError(
        f"the {name} format ({suffix}) is not installed: pip install {package}"
    )


def for_saving(path: str | os.PathLike, format: str | None = None) -> SerializerRecord:
    table = serializers()
    if format is not None:
        if format in table:
            return table[format]
        for suffix, (name, _) in KNOWN_FORMATS.items():
            if name == format:
                raise _missing(suffix)
        raise OneModelError(f"unknown format {format!r}; installed: {', '.join(table) or 'none'}")
    suffix = Path(path).suffix.lower()
    for rec in table.values():
        if suffix in rec.extensions:
            return rec
    if suffix in KNOWN_FORMATS:
        raise _missing(suffix)
    raise OneModelError(f"no installed format saves {suffix or 'files without an extension'}; "
                        f"installed: {', '.join(table) or 'none'} (pass format=...)")


def for_loading(path: str | os.PathLike) -> SerializerRecord:
    table = serializers()
    p = Path(path)
    if not p.exists():
        raise OneModelError(f"{path}: no such file")
    suffix = p.suffix.lower()
    for rec in table.values():
        if suffix in rec.extensions:
            return rec
    with open(p, "rb") as f:
        head = f.read(64)
    for rec in table.values():
        if rec.magic and head.startswith(rec.magic):
            return rec
    if suffix in KNOWN_FORMATS:
        raise _missing(suffix)
    raise OneModelError(f"{path}: no installed format recognises this file; installed: "
                        f"{', '.join(table) or 'none'}")


def save(graph: Graph, path: str | os.PathLike, format: str | None = None, **options) -> None:
    """Save ``graph`` in the format its extension (or ``format``) names."""
    rec = for_saving(path, format)
    graph.validate(allow_unknown=True)
    registry.resolve(rec.save)(graph, path, **options)


def load(path: str | os.PathLike) -> Graph:
    """Load a graph, picking the format by extension, then by the file's first bytes."""
    rec = for_loading(path)
    return registry.resolve(rec.load)(path)
