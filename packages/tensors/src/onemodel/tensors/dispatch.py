"""Eager dispatch: run an op on Tensors with the best registered kernel and record its gradient.

Kernels are chosen once per (op, input dtypes) and kept in a plain dict; the registry's pluggy
machinery is never called here. The cache drops itself when plugins change.

Tensors on another device (``onemodel.tensors.devices``) take :func:`_dispatch_on_device`: the
device's kernel for the op, or the CPU kernel with counted transfers when the device has none
and its backend allows that. Every input must be on the call's device, except the inputs an op
reads as sizes (``static`` inputs: axes, shapes, pads), which may stay in host memory, and 0-d
host tensors (Python scalars), which are moved, as PyTorch moves CPU scalars.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from . import devices, registry, trace_state
from .autograd import Node, grad_mode
from .dtype import DType
from .errors import OneModelError, PluginError, ShapeError
from .ops.base import OPS, OpDef, TensorSpec
from .tensor import Tensor

DEVICE = "cpu"
# (op, dtype of each input) -> (OpDef, kernel)
_cache: dict[tuple, tuple[OpDef, Any]] = {}
registry.on_change(_cache.clear)
# Called with every result while a TensorScope is open (see scope.py); None otherwise.
_observer = None


def set_observer(callback) -> None:
    global _observer
    _observer = callback


def dispatch(op: str, inputs: Sequence[Tensor | None], attrs: dict[str, Any] | None = None):
    """Run ``op`` on ``inputs`` (``None`` for an omitted optional input) and return a Tensor, or a
    tuple of Tensors for an op with several outputs."""
    if trace_state.active is not None:
        traced = trace_state.active.record(op, inputs, attrs)
        if traced is not NotImplemented:
            return traced
    arrays = []
    for t in inputs:
        if t is None:
            arrays.append(None)
        elif t._device == "cpu":
            arrays.append(t._data)
        else:
            return _dispatch_on_device(op, inputs, attrs)
    key = (op, *[None if a is None else a.dtype for a in arrays])
    entry = _cache.get(key)
    if entry is None:
        entry = _select(op, inputs, attrs)
    opdef, kernel = entry
    if kernel.__class__ is _Chooser:
        kernel = kernel.choose(arrays, attrs)
    try:
        out = kernel(*arrays, **attrs) if attrs else kernel(*arrays)
    except (ValueError, IndexError, TypeError) as exc:
        raise _explain(opdef, inputs, attrs, exc) from None
    if out.__class__ is tuple or out.__class__ is list:
        result = tuple(Tensor._wrap(o) for o in out)
    else:
        result = Tensor._wrap(out)
    if grad_mode.enabled and opdef.grad is not None:
        for t in inputs:
            if t is not None and t.requires_grad:
                _record(opdef, tuple(inputs), attrs, result)
                break
    if _observer is not None:
        _observer(result)
    return result


def dispatch_binary(op: str, a: Tensor, b: Tensor):
    """:func:`dispatch` for the common two-input, no-attribute call (Python operators)."""
    if trace_state.active is not None:
        traced = trace_state.active.record(op, (a, b), None)
        if traced is not NotImplemented:
            return traced
    if a._device != "cpu" or b._device != "cpu":
        return _dispatch_on_device(op, (a, b), None)
    da, db = a._data, b._data
    entry = _cache.get((op, da.dtype, db.dtype))
    if entry is None:
        entry = _select(op, (a, b), None)
    opdef, kernel = entry
    if kernel.__class__ is _Chooser:
        kernel = kernel.choose((da, db), None)
    try:
        out = kernel(da, db)
    except (ValueError, IndexError, TypeError) as exc:
        raise _explain(opdef, (a, b), None, exc) from None
    t = Tensor._wrap(out)
    if (a.requires_grad or b.requires_grad) and grad_mode.enabled and opdef.grad is not None:
        _record(opdef, (a, b), None, t)
    if _observer is not None:
        _observer(t)
    return t


# (op, device, dtype of each input) -> (OpDef, device kernel, or None: run on the CPU)
_device_cache: dict[tuple, tuple[OpDef, Any]] = {}
registry.on_change(_device_cache.clear)


def _dispatch_on_device(op: str, inputs: Sequence[Tensor | None], attrs):
    """:func:`dispatch` for a call with a tensor on a device other than the CPU."""
    opdef = OPS.get(op)
    if opdef is None:
        raise OneModelError(f"unknown op {op!r}")
    device = _call_device(opdef, inputs)
    dev = devices.get_device(device)
    key = (op, device, *[None if t is None else t._data.dtype for t in inputs])
    entry = _device_cache.get(key)
    if entry is None:
        entry = _device_cache[key] = (opdef, _device_kernel(opdef, device, inputs, attrs))
    kernel = entry[1]
    static = _static_positions(opdef)
    attrs = attrs or {}
    on_cpu = False
    if kernel is not None:  # the device's own kernel: device arrays, sizes in host memory
        args = [None if t is None else _host_or_here(t, device, i in static)
                for i, t in enumerate(inputs)]
        if kernel.__class__ is _Chooser:
            try:
                kernel = kernel.choose(args, attrs)
            except PluginError:  # every device kernel's supports check refused this call
                kernel = None
    if kernel is None:
        if not dev.fallback:
            raise devices.DeviceError(
                f"op {op} has no kernel on device {device!r}, and backend {device!r} (plugin "
                f"{dev.plugin!r}) does not run ops on the CPU instead; move the tensors with "
                ".cpu() for this op, or install a plugin with a kernel for it")
        devices.note_fallback(dev, op)
        args = [None if t is None else t._host() for t in inputs]
        kernel = registry.choose_kernel(op, "cpu", args, attrs)
        on_cpu = True
    try:
        out = kernel(*args, **attrs)
    except (ValueError, IndexError, TypeError) as exc:
        raise _explain(opdef, inputs, attrs or None, exc) from None
    move = on_cpu  # it ran on the CPU: the results go back to the device
    if out.__class__ is tuple or out.__class__ is list:
        result = tuple(Tensor._wrap(devices.to_device(o, device) if move else o, device)
                       for o in out)
    else:
        result = Tensor._wrap(devices.to_device(out, device) if move else out, device)
    if grad_mode.enabled and opdef.grad is not None:
        for t in inputs:
            if t is not None and t.requires_grad:
                _record(opdef, tuple(inputs), attrs or None, result)
                break
    if _observer is not None:
        _observer(result)
    return result


def _call_device(opdef: OpDef, inputs) -> str:
    """The one device of a call's data inputs; host sizes and host scalars go with any."""
    static = _static_positions(opdef)
    device = None
    for i, t in enumerate(inputs):
        if t is None or (t._device == "cpu" and (i in static or t._data.ndim == 0)):
            continue
        if device is None:
            device = t._device
        elif t._device != device:
            raise devices.DeviceError(
                f"{opdef.name}: its inputs are on devices {device!r} and {t._device!r}; move "
                "them to one device first (x.to(device))")
    if device is None:  # only sizes and scalars: they are on a device, which gives the call's
        device = next(t._device for t in inputs if t is not None and t._device != "cpu")
    return device


def _static_positions(opdef: OpDef) -> frozenset[int]:
    return frozenset(i for i, name in enumerate(opdef.inputs) if name in opdef.static_inputs)


def _host_or_here(t: Tensor, device: str, static: bool):
    if static:
        return t._host()
    if t._device == device:
        return t._data
    return devices.to_device(t._data, device)  # a host scalar


def _device_kernel(opdef: OpDef, device: str, inputs, attrs):
    """The best kernel registered for ``device``, or None when the op must run on the CPU."""
    first = next((t for t in inputs if t is not None), None)
    dtype = first.dtype if first is not None else None
    recs = [r for r in registry.get_registry().kernels().get(opdef.name, ())
            if r.device == device and (r.dtypes is None or dtype is None or dtype in r.dtypes)]
    if not recs:
        return None
    return recs[0].function() if recs[0].supports is None else _Chooser(opdef.name, recs, device)


def _record(opdef: OpDef, inputs: tuple, attrs, result) -> None:
    outs = result if isinstance(result, tuple) else (result,)
    node = Node(opdef, inputs, opdef.full_attrs(attrs), outs)
    for i, o in enumerate(outs):
        o.requires_grad = True
        o._node = node
        o._index = i


def _select(op: str, inputs, attrs):
    opdef = OPS.get(op)
    if opdef is None:
        raise OneModelError(f"unknown op {op!r}")
    specs = [None if t is None else TensorSpec(tuple(t.shape), t.dtype) for t in inputs]
    # Checks dtypes (and these shapes) once per dtype signature; later shape errors are explained
    # when the kernel fails. Constant-valued inputs are not known here, so only dtype errors count.
    with contextlib.suppress(ShapeError):
        opdef.infer(specs, attrs)
    first = next((t for t in inputs if t is not None), None)
    dtype = first.dtype if first is not None else None
    recs = registry.get_registry().candidates(op, DEVICE, dtype)
    # a kernel without a supports check takes every call: choose once. Otherwise each call asks
    # registry.choose_kernel, the same function the planner uses.
    kernel = recs[0].function() if recs[0].supports is None else _Chooser(op, recs)
    entry = (opdef, kernel)
    _cache[(op, *[None if t is None else t._data.dtype for t in inputs])] = entry
    return entry


class _Chooser:
    """Kernels of which some may refuse a call: ask each in priority order."""

    def __init__(self, op: str, recs, device: str = DEVICE):
        self.op = op
        self.recs = recs
        self.device = device

    def choose(self, arrays, attrs):
        return registry.choose_kernel(self.op, self.device, arrays, attrs, self.recs)


def _explain(opdef: OpDef, inputs, attrs, exc: Exception) -> Exception:
    specs = [None if t is None else TensorSpec(tuple(t.shape), t.dtype, _small_value(t))
             for t in inputs]
    try:
        opdef.infer(specs, attrs)
    except OneModelError as err:
        return err
    shapes = ", ".join("None" if s is None else str(s) for s in specs)
    return ShapeError(f"{opdef.name} failed on inputs {shapes}: {exc}")


def _small_value(t: Tensor):
    if t.dtype is DType.I64 and t.ndim <= 1 and t.numel() <= 16:
        return tuple(int(v) for v in t._host().reshape(-1))
    return None
