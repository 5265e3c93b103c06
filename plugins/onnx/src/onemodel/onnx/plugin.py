"""Registers ONNX with the runtime's serializer registry (onnx is imported only when used)."""

from __future__ import annotations

from onemodel.tensors.registry import hookimpl

__version__ = "0.1.0"


@hookimpl
def onemodel_register_serializers(register) -> None:
    register("onnx", extensions=[".onnx"], magic=b"",
             save="onemodel.onnx.export:save", load="onemodel.onnx.importer:load",
             describe="onemodel.onnx.cli:describe", package="onemodel-onnx")


@hookimpl
def onemodel_register_commands(register) -> None:
    register("validate", "onemodel.onnx.cli:validate_command")
