"""Running a plan on a device other than the CPU.

The planner makes one plan per input signature, device-independent: shapes, slots, plan-time
constants. ``place`` turns it into a :class:`DevicePlan` for one device: each step runs the
device's kernel for its op (chosen with the same registry function eager dispatch uses), or,
where the device has none, the CPU kernel with its inputs and outputs moved through host memory
(counted, and warned about once per op, by ``onemodel.tensors.devices``); a backend that does
not allow that makes the plan fail to build, naming the op and the device. Initializers move to
the device once, when the plan is placed; feeds move at each run; outputs come back to host
memory unless the session keeps them on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from onemodel.tensors import devices, registry
from onemodel.tensors.dtype import DType
from onemodel.tensors.errors import PluginError
from onemodel.tensors.ops import OPS

from .planner import Plan, Step


@dataclass
class DevicePlan(Plan):
    device: str = "cpu"
    keep_on_device: bool = False

    def execute(self, arrays):
        return super().execute([devices.to_device(a, self.device) for a in arrays])

    def execute_profiled(self, arrays, profiler):
        return super().execute_profiled([devices.to_device(a, self.device) for a in arrays],
                                        profiler)

    def _owned(self, results: list, arrays, buffers: frozenset[int] = frozenset()) -> list:
        return [self._own(r) for r in results]  # every output is copied (no buffers on devices)

    def _own(self, r):
        """An output as the caller gets it: a copy (it must not alias a constant or a feed),
        in host memory unless the session keeps outputs on the device; sequences element by
        element, an empty optional as None."""
        if r is None:
            return None
        if isinstance(r, list):
            return [self._own(x) for x in r]
        if isinstance(r, np.ndarray):  # a host constant (a size computed when planning)
            return r.copy() if not self.keep_on_device else devices.to_device(r, self.device)
        return r.copy() if self.keep_on_device else devices.to_host(r, self.device)


def place(plan: Plan, device: str, keep_on_device: bool = False) -> DevicePlan:
    """``plan`` (made by the planner) run on ``device``."""
    dev = devices.get_device(device)
    static_slots: set[int] = set()
    data_slots: set[int] = set()
    steps = []
    for step in plan.steps:
        static = _static_positions(step.op)
        for pos, slot in enumerate(step.ins):
            (static_slots if pos in static else data_slots).add(slot)
        steps.append(_place_step(step, dev, static))
    template = list(plan.template)
    for slot, value in enumerate(template):
        # constants that steps read as data live on the device; sizes stay in host memory
        if isinstance(value, np.ndarray) and slot in data_slots and slot not in static_slots:
            template[slot] = devices.to_device(value, device)
    base = {f.name: getattr(plan, f.name) for f in fields(Plan)}
    base.update(template=template, steps=steps)
    return DevicePlan(**base, device=device, keep_on_device=keep_on_device)


def _static_positions(op: str) -> frozenset[int]:
    opdef = OPS.get(op)
    if opdef is None:
        return frozenset()
    return frozenset(i for i, name in enumerate(opdef.inputs) if name in opdef.static_inputs)


def _place_step(step: Step, dev: devices.Device, static: frozenset[int]) -> Step:
    """The same step with a call that runs on ``dev``."""
    call = _DeviceCall(step, dev, static)
    fields_ = {f.name: getattr(step, f.name) for f in fields(Step)}
    fields_["call"] = call.single if step.single_input else call
    return Step(**fields_)


class _DeviceCall:
    """One step's kernel on a device: the device's kernel when it has one for the op and the
    dtype of the step's first input (chosen at the first run, then kept), else the CPU kernel
    with transfers."""

    __slots__ = ("attrs", "cpu_call", "dev", "kernel", "multi", "op", "static")

    def __init__(self, step: Step, dev: devices.Device, static: frozenset[int]):
        self.op, self.dev, self.static, self.multi = step.op, dev, static, step.multi
        self.cpu_call = step.call
        self.attrs = dict(step.attrs or {})
        self.kernel: Any = None  # None: not chosen yet; False: the CPU fallback
        if not dev.fallback and not _has_device_kernels(step.op, dev.name):
            raise devices.DeviceError(
                f"op {step.op} ({step.node or step.label}) has no kernel on device "
                f"{dev.name!r}, and backend {dev.name!r} (plugin {dev.plugin!r}) does not run "
                "ops on the CPU instead; run this model on the CPU or install a plugin with a "
                "kernel for it")

    def single(self, arg):
        return self(arg)

    def __call__(self, *args):
        if self.kernel is not False:
            placed = [_host(a, self.dev.name) if i in self.static else _here(a, self.dev.name)
                      for i, a in enumerate(args)]
            if self.kernel is None:
                self.kernel = self._choose(placed)
            if self.kernel is not False:
                return self.kernel(*placed, **self.attrs)
        devices.note_fallback(self.dev, self.op)
        out = self.cpu_call(*[_host(a, self.dev.name) for a in args])
        if self.multi:  # several outputs (a list output is one sequence value)
            return tuple(_to_device(o, self.dev.name) for o in out)
        return _to_device(out, self.dev.name)

    def _choose(self, args):
        first = next((a for a in args if a is not None), None)
        dtype = DType.lookup(getattr(first, "dtype", None))
        recs = [r for r in registry.get_registry().kernels().get(self.op, ())
                if r.device == self.dev.name
                and (r.dtypes is None or dtype is None or dtype in r.dtypes)]
        if not recs:
            if not self.dev.fallback:
                raise devices.DeviceError(
                    f"op {self.op} has no kernel on device {self.dev.name!r} for dtype "
                    f"{dtype.name if dtype else None}, and the backend does not fall back")
            return False
        try:
            return registry.choose_kernel(self.op, self.dev.name, args, self.attrs, recs)
        except PluginError:  # every device kernel's supports check refused these shapes
            if not self.dev.fallback:
                raise
            return False


def _has_device_kernels(op: str, device: str) -> bool:
    return any(r.device == device for r in registry.get_registry().kernels().get(op, ()))


def _host(a, device: str):
    """A step's value in host memory: arrays, sequences (lists) element by element, None."""
    if a is None or isinstance(a, np.ndarray):
        return a
    if isinstance(a, list):
        return [_host(x, device) for x in a]
    return devices.to_host(a, device)


def _here(a, device: str):
    """A step's value on the device: host constants and scalars read as data are moved."""
    if isinstance(a, np.ndarray):
        return devices.to_device(a, device)
    if isinstance(a, list):
        return [_here(x, device) for x in a]
    return a


def _to_device(v, device: str):
    """A CPU kernel's output on the device (numpy scalars become arrays; None stays)."""
    if v is None:
        return None
    if isinstance(v, list):
        return [_to_device(x, device) for x in v]
    return devices.to_device(np.asarray(v), device)
