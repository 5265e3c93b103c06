"""The optimizer base: parameter groups, ``zero_grad``, ``state_dict`` in PyTorch's layout.

Updates run on the parameters' numpy buffers in place (no ops, no tape, no new tensors), so an
``ActivationScope`` around a training step never releases optimizer state."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable
from typing import Any

import numpy as np

from onemodel.tensors import OneModelError, Tensor, devices, registry
from onemodel.tensors.errors import PluginError

from ..memory import keep_freed_memory

# (update name, numpy dtype) -> a registered update kernel, or None: use the numpy update
_updates: dict[tuple, Any] = {}
registry.on_change(_updates.clear)


def update_kernel(name: str, *arrays: np.ndarray):
    """The update a plugin registered under ``name`` (e.g. ``"optim.SGD"``: a whole step for
    one parameter, in place) for these host arrays, or None when none is registered or the
    arrays are not what such kernels take: C-contiguous numpy arrays of one float dtype."""
    dt = arrays[0].dtype
    for a in arrays:
        if a.__class__ is not np.ndarray or a.dtype != dt or not a.flags.c_contiguous:
            return None
    key = (name, dt)
    if key not in _updates:
        fn = None
        if dt.kind == "f":
            # the registry's one kernel choice; none registered for these arrays: numpy's update
            with contextlib.suppress(PluginError):
                fn = registry.choose_kernel(name, "cpu", arrays)
        _updates[key] = fn
    return _updates[key]


def _follow_parameter(p: Tensor, state: dict, where: dict[int, str]) -> None:
    """State arrays live where their parameter lives: after ``model.to(device)`` (or a state
    dict loaded as host arrays) they move with it, once, through host memory."""
    src = where.get(id(p), "cpu")
    if src != p._device:
        for name, v in state.items():
            if hasattr(v, "shape") and hasattr(v, "dtype") and getattr(v, "ndim", 0):
                state[name] = devices.move(v, src, p._device)
    where[id(p)] = p._device


def _host_copy(v: Any, device: str) -> Any:
    if isinstance(v, np.ndarray):
        return v.copy()
    if device != "cpu" and hasattr(v, "shape") and hasattr(v, "dtype"):
        return devices.to_host(v, device)  # a copy in host memory
    return v


class Optimizer:
    def __init__(self, params: Iterable, defaults: dict[str, Any]):
        keep_freed_memory()  # this process trains: steps reuse the memory the last one freed
        self.defaults = dict(defaults)
        params = list(params)
        if not params:
            raise OneModelError("the optimizer got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self.param_groups: list[dict[str, Any]] = []
        for g in groups:
            self.add_param_group(g)
        self.state: dict[int, dict[str, Any]] = {}  # keyed by id(parameter)
        self._buffers: dict[tuple, np.ndarray] = {}  # scratch space, reused across steps
        self._where: dict[int, str] = {}  # id(parameter) -> the device its state is on

    def add_param_group(self, group: dict[str, Any]) -> None:
        group = dict(group)
        group["params"] = list(group["params"])
        for p in group["params"]:
            if not isinstance(p, Tensor) or not p.requires_grad:
                raise OneModelError("optimizers take tensors that require grad (parameters)")
        for k, v in self.defaults.items():
            group.setdefault(k, v)
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none or p.grad is None:
                    p.grad = None
                else:
                    p.grad._data[...] = 0

    def step(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad._data
                if g.dtype != p._data.dtype:
                    g = g.astype(p._data.dtype)
                if group.get("maximize"):
                    g = -g
                state = self.state.setdefault(id(p), {})
                if state and self._where.get(id(p), "cpu") != p._device:
                    _follow_parameter(p, state, self._where)
                elif p._device != "cpu":
                    self._where[id(p)] = p._device
                self._update(p._data, g, state, group)

    def _scratch(self, like: np.ndarray) -> np.ndarray:
        """A reusable array shaped like ``like``: updates without a temporary per step."""
        key = (like.shape, like.dtype.str, type(like))
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = np.empty_like(like, order="C")
        return buf

    def _update(self, param: np.ndarray, grad: np.ndarray, state: dict, group: dict) -> None:
        raise NotImplementedError

    # state -------------------------------------------------------------------------------------
    def _params(self) -> list[Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def state_dict(self) -> dict[str, Any]:
        """``{"state": {index: {name: array or number}}, "param_groups": [...]}`` as in PyTorch;
        arrays are host (numpy) copies, whatever device the parameters live on."""
        index = {id(p): i for i, p in enumerate(self._params())}
        state = {index[k]: {n: _host_copy(v, self._where.get(k, "cpu")) for n, v in s.items()}
                 for k, s in self.state.items() if k in index}
        groups = []
        for g in self.param_groups:
            entry = {k: v for k, v in g.items() if k != "params"}
            entry["params"] = [index[id(p)] for p in g["params"]]
            groups.append(entry)
        return {"state": state, "param_groups": groups}

    @staticmethod
    def _state_value(name: str, v: Any) -> Any:
        """A loaded state entry as this optimizer keeps it: arrays (numpy, torch, anything with
        ``__array__``) as numpy copies, 0-d ones (torch keeps ``step`` and ``mu_product`` as
        0-d tensors) as Python numbers so later arithmetic stays in float64."""
        if isinstance(v, (bool, int, float, str)) or v is None:
            return v
        if not hasattr(v, "__array__"):
            return copy.deepcopy(v)
        a = np.asarray(v).copy()
        if a.ndim:
            return a
        x = a.item()
        if name == "step" and isinstance(x, float) and x.is_integer():
            return int(x)
        return x

    def _check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise unless ``state_dict`` fits this optimizer's groups and parameters."""
        if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= state_dict.keys():
            raise OneModelError("an optimizer state dict has the keys 'state' and "
                                "'param_groups' (as Optimizer.state_dict() writes it)")
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
            len(a["params"]) != len(b["params"]) for a, b in zip(groups, self.param_groups)
        ):
            raise OneModelError("optimizer state does not match this optimizer's parameter groups")
        params = self._params()
        for i, s in state_dict["state"].items():
            if not 0 <= int(i) < len(params):
                raise OneModelError(f"optimizer state names parameter {i}, which does not exist")
            p = params[int(i)]
            for name, v in s.items():
                shape = tuple(getattr(v, "shape", ()))
                if hasattr(v, "__array__") and shape and shape != tuple(p.shape):
                    raise OneModelError(
                        f"optimizer state {name!r} of parameter {i} has shape {list(shape)}, "
                        f"the parameter has {list(p.shape)}"
                    )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load ``state_dict()`` output, or PyTorch's (its tensors converted or not): indices
        name parameters in group order, as in torch."""
        self._check_state_dict(state_dict)
        groups = state_dict["param_groups"]
        params = self._params()
        for saved, group in zip(groups, self.param_groups):
            for k, v in saved.items():
                if k != "params":
                    group[k] = tuple(v) if k == "betas" else copy.deepcopy(v)
        self.state = {}
        self._where.clear()  # loaded state is in host memory; it follows its parameters later
        for i, s in state_dict["state"].items():
            p = params[int(i)]
            self.state[id(p)] = {name: self._state_value(name, v) for name, v in s.items()}
            for name, v in self.state[id(p)].items():
                if isinstance(v, np.ndarray) and v.dtype != p._data.dtype:
                    self.state[id(p)][name] = v.astype(p._data.dtype)

    def __repr__(self) -> str:
        hp = ", ".join(f"{k}={v}" for k, v in self.defaults.items())
        return f"{type(self).__name__}({hp})"
