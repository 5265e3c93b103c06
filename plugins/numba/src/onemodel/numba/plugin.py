"""The plugin's hooks (entry point ``numba`` in group ``onemodel``). Registration names code
lazily: discovering this plugin imports neither numba nor a kernel module. Every kernel has a
priority above the reference kernels (0) and a ``supports`` check, so the reference kernel stays
the fallback for whatever a numba kernel does not cover."""

from __future__ import annotations

from onemodel.tensors.registry import hookimpl

PRIORITY = 10
_K = "onemodel.numba"

# op -> (kernel, supports check)
KERNELS: dict[str, tuple[str, str]] = {
    "Conv": (f"{_K}.conv:conv", f"{_K}.support:conv"),
    "FusedConv": (f"{_K}.conv:fused_conv", f"{_K}.support:conv"),
}


@hookimpl
def onemodel_register_kernels(register) -> None:
    for op, (impl, check) in KERNELS.items():
        register(op, impl, device="cpu", dtypes=("F32", "F64"), priority=PRIORITY,
                 supports=check)
