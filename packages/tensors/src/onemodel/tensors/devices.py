"""Devices: where a tensor's data lives and how it moves.

``"cpu"`` (numpy arrays in host memory) is the reference device. A backend plugin adds another
through ``onemodel_register_backends``: its name, the array module its kernels use, how to move
an array to and from host memory, how to wait for queued work, and whether ops it has no kernel
for may run on the CPU instead (``fallback=True``: the arrays are moved explicitly, each move is
counted in :func:`transfer_stats`, and a warning names the op once) or must fail with an error
naming the op and the device (``fallback=False``).

Everything here is looked up once per device and kept in a plain dict; eager dispatch and the
planner never call pluggy.
"""

from __future__ import annotations

import threading
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import registry
from .errors import OneModelError

CPU = "cpu"


class DeviceError(OneModelError):
    """A device that is not installed or not usable, or tensors of two devices in one op."""


class DeviceFallbackWarning(UserWarning):
    """An op ran on the CPU because its device has no kernel for it (said once per op)."""


@dataclass
class Device:
    """One device, resolved from its backend registration."""

    name: str
    array_module: Any
    to_device: Callable[[np.ndarray], Any]
    to_host: Callable[[Any], np.ndarray]
    synchronize: Callable[[], None]
    fallback: bool
    plugin: str = ""
    warned: set[str] = field(default_factory=set, repr=False)

    def __str__(self) -> str:
        return self.name


def _identity(a):
    return a


def _nothing() -> None:
    return None


_CPU_DEVICE = Device(CPU, np, _identity, np.asarray, _nothing, True, "onemodel-tensors")
_devices: dict[str, Device] = {}
_lock = threading.Lock()
registry.on_change(_devices.clear)

_stats: Counter = Counter()


def get_device(name: Any) -> Device:
    """The device called ``name`` (``"cpu"``, ``"cuda"``, ``"cuda:0"``, ``"sim"``, or a Device)."""
    if isinstance(name, Device):
        return name
    key = normalize(name)
    if key == CPU:
        return _CPU_DEVICE
    dev = _devices.get(key)
    if dev is None:
        with _lock:
            dev = _devices.get(key) or _resolve(key)
            _devices[key] = dev
    return dev


def normalize(name: Any) -> str:
    """``"cuda:0"`` -> ``"cuda"`` (one device per backend), ``None`` -> ``"cpu"``."""
    if name is None:
        return CPU
    if isinstance(name, Device):
        return name.name
    text = str(getattr(name, "type", name))  # a torch.device has .type
    return text.split(":")[0].strip().lower()


def _resolve(name: str) -> Device:
    rec = registry.backends().get(name)
    if rec is None:
        known = ", ".join(sorted(registry.backends()))
        hint = " (pip install onemodel-cupy)" if name == "cuda" else ""
        raise DeviceError(f"no backend provides device {name!r}{hint}; installed devices: "
                          f"{known}")
    if rec.to_device is None or rec.to_host is None:
        raise DeviceError(f"backend {name!r} (plugin {rec.plugin!r}) declares no host transfers "
                          "(to_device, to_host), so tensors cannot be placed on it")
    if not rec.is_available():
        raise DeviceError(f"device {name!r} (plugin {rec.plugin!r}) is installed but not usable "
                          "here (no device found)")
    resolve = registry.resolve
    return Device(name, resolve(rec.array_module) if rec.array_module else None,
                  resolve(rec.to_device), resolve(rec.to_host),
                  resolve(rec.synchronize) if rec.synchronize else _nothing,
                  bool(rec.fallback), rec.plugin)


def to_host(array: Any, device: str) -> np.ndarray:
    """``array`` of ``device`` as a host numpy array (counted unless already on the CPU)."""
    if device == CPU:
        return array
    _stats["to_host"] += 1
    return get_device(device).to_host(array)


def to_device(array: np.ndarray, device: str) -> Any:
    """A host array moved to ``device`` (counted unless it stays on the CPU)."""
    if device == CPU:
        return array
    _stats["to_device"] += 1
    return get_device(device).to_device(np.asarray(array, order="C"))


def move(array: Any, src: str, dst: str) -> Any:
    """An array of device ``src`` as an array of device ``dst`` (through host memory)."""
    if src == dst:
        return array
    return to_device(to_host(array, src), dst)


def note_fallback(device: Device, op: str) -> None:
    """Count one CPU fallback of ``op`` and warn the first time it happens on this device."""
    _stats[f"fallback:{op}"] += 1
    if op not in device.warned:
        device.warned.add(op)
        warnings.warn(f"op {op} has no kernel on device {device.name!r}: it runs on the CPU, "
                      "with its inputs and outputs moved through host memory",
                      DeviceFallbackWarning, stacklevel=4)


def transfer_stats() -> dict[str, int]:
    """Host transfers and CPU fallbacks so far: ``to_host``, ``to_device`` and
    ``fallback:<op>`` counts (reset with :func:`reset_transfer_stats`)."""
    return dict(_stats)


def reset_transfer_stats() -> None:
    _stats.clear()


def assign(tensor: Any, host: np.ndarray) -> None:
    """Copy the host array ``host`` into ``tensor``'s data in place, on the tensor's device
    (loading weights into a model that lives on a device)."""
    if tensor._device == CPU:
        tensor._data[...] = host
    else:
        tensor._data[...] = to_device(np.asarray(host, tensor._data.dtype), tensor._device)


def move_tensor_data(tensor: Any, device: str) -> None:
    """Move ``tensor``'s data (and its gradient's) to ``device`` in place, keeping the Tensor
    object: a module's parameters stay the objects its optimizer holds."""
    if tensor._device != device:
        tensor._data = move(tensor._data, tensor._device, device)
        tensor._device = device
    grad = getattr(tensor, "grad", None)
    if grad is not None and grad._device != device:
        move_tensor_data(grad, device)
