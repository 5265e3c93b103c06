"""``Module``: parameters, buffers and submodules registered by attribute assignment, as in
PyTorch, with ``state_dict`` names PyTorch would give the same structure."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from onemodel.tensors import DType, OneModelError, Tensor


class Parameter(Tensor):
    """A tensor that is a module's learnable weight: it requires grad and is found by
    ``parameters()``."""

    __slots__ = ()

    def __init__(self, data, requires_grad: bool = True):
        arr = data._data if isinstance(data, Tensor) else np.asarray(data)
        super().__init__(arr)
        if requires_grad:
            self.requires_grad_()

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


class StateDictError(OneModelError, KeyError):
    """``load_state_dict`` got a mapping that does not fit the module."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Module:
    """Base class of every layer and model. Subclasses set attributes in ``__init__`` and define
    ``forward``; calling the module runs ``forward``."""

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # registration by assignment ----------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise OneModelError(
                f"{type(self).__name__}.__init__ must call super().__init__() before assigning "
                "attributes"
            )
        if name in self._buffers and not isinstance(value, (Parameter, Module)):
            self._buffers[name] = value  # assigning a registered buffer replaces it
            return
        for table in (self._parameters, self._buffers, self._modules):
            table.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)
            return
        self.__dict__.pop(name, None)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table in d and name in d[table]:
                return d[table][name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                return
        object.__delattr__(self, name)

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """A tensor that is state but not learnable (BatchNorm's running mean)."""
        self.__dict__.pop(name, None)
        self._buffers[name] = tensor
        if not persistent:
            self._non_persistent.add(name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        self.__dict__.pop(name, None)
        self._parameters[name] = param

    def add_module(self, name: str, module: Module | None) -> None:
        self._modules[name] = module

    # running -----------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self) -> Module:
        return self.train(False)

    def trace(self, example: Tensor, *axis_names):
        """Trace the inference forward pass into a static graph (see onemodel.tracing)."""
        try:
            from onemodel.tracing import trace_module
        except ImportError:
            raise OneModelError(
                "Module.trace needs the tracing package: pip install onemodel-tracing"
            ) from None
        return trace_module(self, example, *axis_names)

    # traversal ---------------------------------------------------------------------------------
    def named_modules(self, prefix: str = "", memo=None) -> Iterator[tuple[str, Module]]:
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, Module]]:
        for name, m in self._modules.items():
            if m is not None:
                yield name, m

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def _named(self, table: str, prefix: str, recurse: bool):
        seen = set()
        mods = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mprefix, m in mods:
            for name, t in getattr(m, table).items():
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                yield (f"{mprefix}.{name}" if mprefix else name), t

    def named_parameters(self, prefix: str = "", recurse: bool = True):
        yield from self._named("_parameters", prefix, recurse)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True):
        yield from self._named("_buffers", prefix, recurse)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients (``set_to_none``, the default, as in PyTorch) or zero them in
        place, keeping the arrays."""
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad = Tensor._wrap(np.zeros_like(p.grad.numpy()))

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        """Turn gradients of every parameter on or off (freezing a part of a model)."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def apply(self, fn) -> Module:
        """Call ``fn`` on every submodule, children before their parent (as PyTorch does)."""
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # state -------------------------------------------------------------------------------------
    def state_dict(self) -> OrderedDict[str, Tensor]:
        """Parameters and persistent buffers by dotted name (``fc1.weight``,
        ``bn.running_mean``), in registration order."""
        out: OrderedDict[str, Tensor] = OrderedDict()
        for mprefix, m in self.named_modules():
            dot = f"{mprefix}." if mprefix else ""
            for name, p in m._parameters.items():
                if p is not None:
                    out[dot + name] = p
            for name, b in m._buffers.items():
                if b is not None and name not in m._non_persistent:
                    out[dot + name] = b
        return out

    def load_state_dict(self, state: Mapping[str, Any] | str | os.PathLike, strict: bool = True):
        """Copy values (Tensors, numpy arrays, torch tensors) into the parameters and buffers, in
        place; or read them from a safetensors file (``safetensors.torch.save_file`` output,
        ``Checkpoint.save_weights``, or a OneModel checkpoint's model part).

        Raises :class:`StateDictError` listing missing, unexpected and mis-shaped keys; nothing
        is copied unless every key fits. Returns (missing, unexpected) keys."""
        if isinstance(state, (str, os.PathLike)):
            from .checkpoint import read_weights

            state = read_weights(state)
        plan = self._fit_state_dict(state, strict)
        for target, arr in plan:
            target._data[...] = arr
        own = self.state_dict()
        return [k for k in own if k not in state], [k for k in state if k not in own]

    def _fit_state_dict(self, state: Mapping[str, Any], strict: bool):
        """Check ``state`` against this module; returns (target tensor, array) pairs to copy."""
        own = self.state_dict()
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        wrong, plan = [], []
        for k, target in own.items():
            if k not in state:
                continue
            v = state[k]
            if not isinstance(v, (Tensor, np.ndarray)) and hasattr(v, "detach"):
                v = v.detach()  # a torch parameter: numpy refuses one that requires grad
            arr = v.numpy() if isinstance(v, Tensor) else np.asarray(v)
            if tuple(arr.shape) != tuple(target.shape):
                wrong.append(f"{k}: expected {list(target.shape)}, got {list(arr.shape)}")
            plan.append((target, arr.astype(target.numpy().dtype, copy=False)))
        if wrong or (strict and (missing or unexpected)):
            parts = []
            if missing:
                parts.append("missing keys: " + ", ".join(missing))
            if unexpected:
                parts.append("unexpected keys: " + ", ".join(unexpected))
            if wrong:
                parts.append("mis-shaped keys: " + "; ".join(wrong))
            raise StateDictError(
                f"state dict does not fit {type(self).__name__}: " + " | ".join(parts)
            )
        return plan

    def to(self, *args, dtype=None, device=None) -> Module:
        """PyTorch's ``to``: ``to(dtype)``, ``to("cpu")`` or ``to("cpu", dtype)``: casts every
        floating parameter and buffer in place. Modules live on the CPU; other devices are
        refused."""
        for a in args:
            if isinstance(a, str) and a.split(":")[0] in ("cpu", "cuda", "mps", "meta", "xla"):
                device = a
            elif dtype is None:
                dtype = a
            else:
                raise OneModelError(f"Module.to(): unexpected argument {a!r}; pass a dtype "
                                    "and/or 'cpu'")
        if device is not None and str(device).split(":")[0] != "cpu":
            raise OneModelError(f"device {device!r}: OneModel modules live on the CPU; use "
                                "'cpu' (accelerators run through the runtime's execution "
                                "providers)")
        if dtype is None:
            return self
        dt = DType.of(dtype)
        if not dt.is_floating:
            raise OneModelError(f"Module.to({dt.name}): modules cast their floating parameters "
                                "and buffers, so the dtype must be floating (F16, F32, F64)")
        for t in list(self.parameters()) + list(self.buffers()):
            if t.dtype.is_floating:
                t._data = t._data.astype(dt.numpy)
                if t.grad is not None:
                    t.grad = Tensor._wrap(t.grad.numpy().astype(dt.numpy))
        return self

    def half(self) -> Module:
        return self.to(DType.F16)

    def double(self) -> Module:
        return self.to(DType.F64)

    def float(self) -> Module:
        return self.to(DType.F32)

    # repr --------------------------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = []
        for name, m in self._modules.items():
            body = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n" + "\n".join(lines) + "\n)"
