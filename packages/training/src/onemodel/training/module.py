"""``Module``: parameters, buffers and submodules registered by attribute assignment, as in
PyTorch, with ``state_dict`` names PyTorch would give the same structure."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from onemodel.tensors import DType, OneModelError, Tensor, devices


def _is_dtype(value) -> bool:
    try:
        DType.of(value)
    except (OneModelError, KeyError, ValueError, TypeError):
        return False
    return True


class Parameter(Tensor):
    """A tensor that is a module's learnable weight: it requires grad and is found by
    ``parameters()``."""

    __slots__ = ()

    def __init__(self, data, requires_grad: bool = True):
        if isinstance(data, Tensor):
            super().__init__(data._host(), device=data.device)
        else:
            super().__init__(np.asarray(data))
        if requires_grad:
            self.requires_grad_()

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


class RemovableHandle:
    """What ``register_forward_hook`` and ``register_forward_pre_hook`` return: ``remove()``
    takes the hook off (also as a context manager: ``with m.register_forward_hook(h): ...``)."""

    _next_id = 0

    def __init__(self, hooks: OrderedDict):
        self._hooks = hooks
        self.id = RemovableHandle._next_id
        RemovableHandle._next_id += 1

    def remove(self) -> None:
        self._hooks.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


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
        d = self.__dict__
        if not (d.get("_forward_pre_hooks") or d.get("_forward_hooks")):
            return self.forward(*args, **kwargs)
        return self._call_with_hooks(args, kwargs)

    def _call_with_hooks(self, args: tuple, kwargs: dict):
        for hook, with_kwargs in list(self.__dict__.get("_forward_pre_hooks", {}).values()):
            if with_kwargs:
                result = hook(self, args, kwargs)
                if result is not None:
                    if not (isinstance(result, tuple) and len(result) == 2):
                        raise OneModelError(f"a forward pre-hook with_kwargs on "
                                            f"{type(self).__name__} returned {type(result).__name__}"
                                            "; return None or (args, kwargs)")
                    args, kwargs = result
            else:
                result = hook(self, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
        out = self.forward(*args, **kwargs)
        for hook, with_kwargs in list(self.__dict__.get("_forward_hooks", {}).values()):
            result = hook(self, args, kwargs, out) if with_kwargs else hook(self, args, out)
            if result is not None:
                out = result
        return out

    def _add_hook(self, table: str, hook, prepend: bool, with_kwargs: bool) -> RemovableHandle:
        if not callable(hook):
            raise OneModelError(f"a hook must be callable, got {type(hook).__name__}")
        hooks = self.__dict__.get(table)
        if hooks is None:
            hooks = OrderedDict()
            object.__setattr__(self, table, hooks)
        handle = RemovableHandle(hooks)
        hooks[handle.id] = (hook, with_kwargs)
        if prepend:
            hooks.move_to_end(handle.id, last=False)
        return handle

    def register_forward_pre_hook(self, hook, *, prepend: bool = False,
                                  with_kwargs: bool = False) -> RemovableHandle:
        """``hook(module, args)`` before each ``forward``; returning a value replaces the
        positional arguments (a tuple, or one value). With ``with_kwargs``:
        ``hook(module, args, kwargs)`` returning None or ``(args, kwargs)``. The handle's
        ``remove()`` takes the hook off."""
        return self._add_hook("_forward_pre_hooks", hook, prepend, with_kwargs)

    def register_forward_hook(self, hook, *, prepend: bool = False,
                              with_kwargs: bool = False) -> RemovableHandle:
        """``hook(module, args, output)`` after each ``forward`` (``hook(module, args, kwargs,
        output)`` with ``with_kwargs``); returning a value replaces the output."""
        return self._add_hook("_forward_hooks", hook, prepend, with_kwargs)

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
                p.grad = Tensor.zeros(*p.grad.shape, dtype=p.grad.dtype, device=p.grad.device)

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
            devices.assign(target, arr)
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
            plan.append((target, arr.astype(target.dtype.numpy, copy=False)))
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
        """PyTorch's ``to``: ``to(dtype)``, ``to("cuda")`` or ``to("cuda", dtype)``: moves and
        casts every (floating) parameter and buffer in place, so an optimizer made afterwards
        (as in PyTorch) updates them where they live."""
        for a in args:
            if isinstance(a, (devices.Device, str)) and not _is_dtype(a):
                device = a
            elif dtype is None:
                dtype = a
            else:
                raise OneModelError(f"Module.to(): unexpected argument {a!r}; pass a dtype "
                                    "and/or a device")
        if device is not None:
            target = devices.normalize(device)
            devices.get_device(target)  # an unknown device fails here, naming it
            for t in list(self.parameters()) + list(self.buffers()):
                devices.move_tensor_data(t, target)
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
                    t.grad = Tensor._wrap(t.grad._data.astype(dt.numpy), t.grad.device)
        return self

    def cpu(self) -> Module:
        return self.to("cpu")

    def cuda(self) -> Module:
        return self.to("cuda")

    def half(self) -> Module:
        return self.to(DType.F16)

    def double(self) -> Module:
        return self.to(DType.F64)

    def float(self) -> Module:
        return self.to(DType.F32)

    # summary -----------------------------------------------------------------------------------
    def summary(self, *inputs, input_size=None, dtype=DType.F32, depth: int | None = None
                ) -> ModelSummary:
        """A torchinfo-like table: one row per submodule (up to ``depth`` levels) with its output
        shape for the given input and its parameter count, and the totals (all, trainable).

        Pass example inputs (Tensors or arrays), or ``input_size`` (a shape, or a list of shapes
        for several inputs) for zeros of ``dtype``; without either, only parameters are
        counted. The forward pass runs in eval mode without gradients; the mode is restored."""
        from onemodel.tensors import no_grad

        if input_size is not None:
            if inputs:
                raise OneModelError("summary(): pass example inputs or input_size, not both")
            sizes = (input_size if input_size and isinstance(input_size[0], (tuple, list))
                     else [input_size])
            dt = DType.of(dtype)
            inputs = tuple(Tensor._wrap(np.zeros(tuple(s), dt.numpy)) for s in sizes)
        inputs = tuple(x if isinstance(x, Tensor) else Tensor(np.asarray(x)) for x in inputs)
        shapes: dict[int, Any] = {}
        handles = []

        def record(mod, _args, out) -> None:  # returns None: the output stays as it is
            shapes.setdefault(id(mod), _shapes(out))

        if inputs:
            for _, m in self.named_modules():
                handles.append(m.register_forward_hook(record))
            modes = [(m, m.training) for m in self.modules()]
            self.eval()
            try:
                with no_grad():
                    self(*inputs)
            finally:
                for h in handles:
                    h.remove()
                for m, mode in modes:
                    object.__setattr__(m, "training", mode)
        rows = []
        for name, m in self.named_modules():
            level = name.count(".") + 1 if name else 0
            if depth is not None and level > depth:
                continue
            count = sum(p.numel() for p in m.parameters())
            rows.append(SummaryRow(name, type(m).__name__, level, shapes.get(id(m)), count))
        params = list(self.parameters())
        total = sum(p.numel() for p in params)
        trainable = sum(p.numel() for p in params if p.requires_grad)
        return ModelSummary(rows, total, trainable, sum(b.numel() for b in self.buffers()
                                                        if b is not None))

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


def _shapes(out):
    if isinstance(out, Tensor):
        return list(out.shape)
    if isinstance(out, (tuple, list)):
        return [_shapes(o) for o in out]
    return None


class SummaryRow(NamedTuple):
    name: str  # dotted name, "" for the model itself
    kind: str  # class name
    depth: int
    output_shape: Any  # a list of ints, a list of those for several outputs, or None
    params: int  # parameters of this module and its children


class ModelSummary(NamedTuple):
    """``Module.summary()``'s result; ``str()`` gives the table."""

    rows: list[SummaryRow]
    total_params: int
    trainable_params: int
    buffer_elements: int

    @property
    def non_trainable_params(self) -> int:
        return self.total_params - self.trainable_params

    def __str__(self) -> str:
        table = [("Layer (type)", "Output shape", "Param #")]
        for r in self.rows:
            label = "  " * r.depth + (f"{r.name} ({r.kind})" if r.name else r.kind)
            shape = "--" if r.output_shape is None else str(r.output_shape)
            table.append((label, shape, f"{r.params:,}"))
        widths = [max(len(row[i]) for row in table) for i in range(3)]
        rule = "=" * (sum(widths) + 4)
        lines = [rule]
        for i, (a, b, c) in enumerate(table):
            lines.append(f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:>{widths[2]}}")
            if i == 0:
                lines.append(rule)
        lines += [rule, f"Total params: {self.total_params:,}",
                  f"Trainable params: {self.trainable_params:,}",
                  f"Non-trainable params: {self.non_trainable_params:,}", rule]
        return "\n".join(lines)
