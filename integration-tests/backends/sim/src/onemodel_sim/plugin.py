"""Hook implementations: device "sim" (falls back to the CPU) and "sim-strict" (refuses to),
with kernels for both. Nothing here imports more than the registry needs."""

from __future__ import annotations

import os

from onemodel.tensors.registry import hookimpl

if os.environ.get("ONEMODEL_SIM_FAIL_IMPORT"):  # lets tests prove a broken plugin is skipped
    raise RuntimeError("onemodel-sim-backend was asked to fail at import")

_ARRAYS = "onemodel_sim.arrays"


@hookimpl
def onemodel_register_backends(register):
    for name, fallback in (("sim", True), ("sim-strict", False)):
        register(name, description="host arrays in a wrapper type (an example backend)",
                 to_device=f"{_ARRAYS}:to_sim", to_host=f"{_ARRAYS}:to_host",
                 synchronize=f"{_ARRAYS}:synchronize", fallback=fallback)


@hookimpl
def onemodel_register_kernels(register):
    from .kernels import OPS_ON_DEVICE

    for device in ("sim", "sim-strict"):
        for op in OPS_ON_DEVICE:
            register(op, f"onemodel_sim.kernels:{op}", device=device)
    register("Relu", "onemodel_sim.kernels:relu_fast", device="sim", priority=10,
             supports="onemodel_sim.kernels:relu_fast_supports")
    register("Abs", "onemodel_sim.kernels:abs_f32", device="sim",
             supports="onemodel_sim.kernels:abs_f32_supports")
