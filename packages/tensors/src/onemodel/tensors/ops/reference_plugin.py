"""The built-in plugin that registers every op's reference numpy kernel (priority 0)."""

from __future__ import annotations

from ..registry import hookimpl
from . import OPS


@hookimpl
def onemodel_register_kernels(register) -> None:
    for name, op in OPS.items():
        register(name, op.kernel, device="cpu", priority=0, writes_out=op.writes_out)
