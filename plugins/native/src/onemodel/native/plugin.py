"""Registers the .onemodel format with the runtime's serializer registry."""

from __future__ import annotations

from onemodel.tensors.registry import hookimpl

__version__ = "0.1.0"


@hookimpl
def onemodel_register_serializers(register) -> None:
    register("native", extensions=[".onemodel"], magic=b"ONEMODEL",
             save="onemodel.native.format:save", load="onemodel.native.format:load",
             describe="onemodel.native.describe:describe", package="onemodel-native")
