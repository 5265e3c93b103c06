"""The plugin registry: one pluggy ``PluginManager("onemodel")``, created on first use.

Registrations are collected once into plain dicts. Eager dispatch and the runtime's planner look
kernels up in those dicts and never call pluggy. Operators control loading with:

- ``ONEMODEL_PLUGINS=a,b``: load only these entry points (an allow list);
- ``ONEMODEL_DISABLE_PLUGINS=a,b``: never load these entry points (a deny list);
- ``ONEMODEL_DISABLE_PLUGIN_AUTOLOAD=1``: load no entry point at all (tests isolate themselves so).

Built-in parts (the reference numpy kernels) register through the same hooks, under names that
start with ``onemodel-``; they are not subject to the lists above.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pluggy

from . import hookspecs
from .dtype import DType
from .errors import PluginError

hookimpl = pluggy.HookimplMarker("onemodel")

ENTRY_POINT_GROUP = "onemodel"
ENV_ALLOW = "ONEMODEL_PLUGINS"
ENV_DENY = "ONEMODEL_DISABLE_PLUGINS"
ENV_NO_AUTOLOAD = "ONEMODEL_DISABLE_PLUGIN_AUTOLOAD"

# name -> module: built-in parts of installed OneModel packages, registered whatever the
# environment's allow and deny lists say. Packages add theirs with register_builtin().
BUILTIN_PLUGINS: dict[str, tuple[str, str]] = {
    "onemodel-tensors.reference": ("onemodel.tensors.ops.reference_plugin", "onemodel-tensors"),
}


class PluginLoadWarning(UserWarning):
    """A plugin could not be imported and was skipped."""


def resolve(name_or_obj: Any) -> Any:
    """Import ``"module:attr"`` (attributes may be dotted); return other objects unchanged."""
    if not isinstance(name_or_obj, str):
        return name_or_obj
    module_name, _, attr = name_or_obj.partition(":")
    if not attr:
        raise PluginError(f"{name_or_obj!r} is not a 'module:attribute' name")
    try:
        obj = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise PluginError(f"cannot load {name_or_obj!r}: {exc}") from exc
    return obj


@dataclass
class PluginInfo:
    """What ``list_plugins()`` reports of one loaded plugin."""

    name: str
    version: str
    hooks: list[str]
    distribution: str | None = None


@dataclass
class KernelRecord:
    """One registered kernel; ``impl`` and ``supports`` are imported on first use."""

    op: str
    impl: Any
    device: str = "cpu"
    dtypes: frozenset[DType] | None = None
    priority: int = 0
    supports: Any = None
    plugin: str = ""
    # the kernel takes ``out=``: a planned output buffer it fills and returns (see the hookspec)
    writes_out: bool = False
    _fn: Callable | None = field(default=None, repr=False)
    _supports_fn: Callable | None = field(default=None, repr=False)

    def function(self) -> Callable:
        if self._fn is None:
            self._fn = resolve(self.impl)
        return self._fn

    def supports_function(self) -> Callable | None:
        if self.supports is not None and self._supports_fn is None:
            self._supports_fn = resolve(self.supports)
        return self._supports_fn


@dataclass
class BackendRecord:
    """One registered device; the callables are ``"module:attr"`` names imported on first use
    (see ``onemodel.tensors.devices``)."""

    name: str
    description: str = ""
    available: Any = None
    plugin: str = ""
    array_module: Any = None  # the array namespace its kernels use (cupy)
    to_device: Any = None  # host numpy array -> device array
    to_host: Any = None  # device array -> host numpy array
    synchronize: Any = None  # wait for queued work (timing, before a host read)
    fallback: bool = True  # ops without a kernel here run on the CPU (else: an error)

    def is_available(self) -> bool:
        return True if self.available is None else bool(resolve(self.available)())


class Registry:
    """The loaded plugins and everything they registered."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._pm: pluggy.PluginManager | None = None
        self._infos: dict[str, PluginInfo] = {}
        self._collected: dict[str, list[tuple[str, tuple, dict]]] = {}
        self._kernels: dict[str, list[KernelRecord]] | None = None
        self._backends: dict[str, BackendRecord] | None = None

    # the plugin manager ------------------------------------------------------------------------
    @property
    def pluginmanager(self) -> pluggy.PluginManager:
        if self._pm is None:
            with self._lock:
                if self._pm is None:
                    self._pm = self._create()
        return self._pm

    def _create(self) -> pluggy.PluginManager:
        pm = pluggy.PluginManager("onemodel")
        pm.add_hookspecs(hookspecs)
        pm.hook.onemodel_addhooks.call_historic(kwargs={"pluginmanager": pm})
        self._pm = pm
        for name, (module, dist) in list(BUILTIN_PLUGINS.items()):
            self._register(pm, importlib.import_module(module), name, dist)
        if os.environ.get(ENV_NO_AUTOLOAD, "").strip().lower() not in ("", "0", "false", "no"):
            return pm
        allow = _env_list(ENV_ALLOW)
        deny = _env_list(ENV_DENY)
        for ep in _entry_points():
            if (allow is not None and ep.name not in allow) or (deny and ep.name in deny):
                continue
            if ep.name in self._infos:
                raise PluginError(
                    f"two plugins are named {ep.name!r} (entry point {ep.value!r} and an earlier "
                    "one); uninstall one of them or disable it with "
                    f"{ENV_DENY}={ep.name}"
                )
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken plugin must not break the framework
                warnings.warn(
                    f"onemodel plugin {ep.name!r} ({ep.value}) failed to import and was skipped: "
                    f"{type(exc).__name__}: {exc}",
                    PluginLoadWarning,
                    stacklevel=2,
                )
                continue
            dist = ep.dist.name if getattr(ep, "dist", None) is not None else None
            self._register(pm, plugin, ep.name, dist)
        return pm

    def _register(self, pm, plugin, name: str, dist: str | None) -> None:
        if pm.has_plugin(name) or name in self._infos:
            raise PluginError(f"a plugin named {name!r} is already registered")
        pm.register(plugin, name=name)
        version = "unknown"
        if dist:
            import importlib.metadata

            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                version = importlib.metadata.version(dist)
        version = getattr(plugin, "__version__", version)
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or ())
        self._infos[name] = PluginInfo(name, version, hooks, dist)
        self._invalidate()

    def register_plugin(self, plugin: object, name: str, version: str = "unknown") -> None:
        """Register a plugin object (a module or an instance with hook implementations) by hand."""
        with self._lock:
            self._register(self.pluginmanager, plugin, name, None)
            self._infos[name].version = getattr(plugin, "__version__", version)

    def unregister_plugin(self, name: str) -> None:
        with self._lock:
            pm = self.pluginmanager
            if not pm.has_plugin(name):
                raise PluginError(f"no plugin named {name!r} is registered")
            pm.unregister(name=name)
            self._infos.pop(name, None)
            self._invalidate()

    def list_plugins(self) -> list[PluginInfo]:
        """Every loaded plugin with its version and the hooks it implements."""
        self.pluginmanager  # noqa: B018 - load on first use
        # hooks added later by onemodel_addhooks may now be implemented too
        for name, info in self._infos.items():
            plugin = self.pluginmanager.get_plugin(name)
            if plugin is not None:
                info.hooks = sorted(h.name for h in self.pluginmanager.get_hookcallers(plugin) or ())
        return list(self._infos.values())

    def _invalidate(self) -> None:
        self._collected.clear()
        self._kernels = None
        self._backends = None
        _notify_change()

    # collecting registrations ------------------------------------------------------------------
    def collect(self, hook_name: str) -> list[tuple[str, tuple, dict]]:
        """Call every implementation of registration hook ``hook_name`` once and return the
        ``(plugin name, args, kwargs)`` of each ``register`` call, cached until plugins change."""
        with self._lock:
            cached = self._collected.get(hook_name)
            if cached is not None:
                return cached
            pm = self.pluginmanager
            caller = getattr(pm.hook, hook_name, None)
            if caller is None:
                raise PluginError(
                    f"no hook named {hook_name!r}; is the package that defines it installed?"
                )
            out: list[tuple[str, tuple, dict]] = []
            # reversed: pluggy lists the latest-registered first; keep registration order
            for impl in reversed(caller.get_hookimpls()):
                name = impl.plugin_name

                def register(*args, _name=name, **kwargs):
                    out.append((_name, args, kwargs))

                impl.function(**{arg: register for arg in impl.argnames})
            self._collected[hook_name] = out
            return out

    def kernels(self) -> dict[str, list[KernelRecord]]:
        """op name -> kernels, best first."""
        if self._kernels is None:
            with self._lock:
                table: dict[str, list[KernelRecord]] = {}
                for plugin, args, kwargs in self.collect("onemodel_register_kernels"):
                    rec = _kernel_record(plugin, *args, **kwargs)
                    table.setdefault(rec.op, []).append(rec)
                for recs in table.values():
                    recs.sort(key=lambda r: -r.priority)  # stable: earlier wins ties
                self._kernels = table
        return self._kernels

    def backends(self) -> dict[str, BackendRecord]:
        if self._backends is None:
            with self._lock:
                table = {"cpu": BackendRecord("cpu", "numpy on the host", None, "onemodel-tensors")}
                for plugin, args, kwargs in self.collect("onemodel_register_backends"):
                    rec = BackendRecord(*args, plugin=plugin, **kwargs)
                    if rec.name in table and rec.name != "cpu":
                        raise PluginError(
                            f"backend {rec.name!r} is registered by both {table[rec.name].plugin!r} "
                            f"and {plugin!r}"
                        )
                    table[rec.name] = rec
                self._backends = table
        return self._backends

    def candidates(self, op: str, device: str, dtype: DType | None) -> list[KernelRecord]:
        """Kernels for ``op`` on ``device`` that accept ``dtype`` (of the first input), best first."""
        recs = self.kernels().get(op)
        if not recs:
            raise PluginError(f"no kernel is registered for op {op!r}")
        out = [
            r
            for r in recs
            if r.device == device and (r.dtypes is None or dtype is None or dtype in r.dtypes)
        ]
        if not out:
            raise PluginError(
                f"no kernel for op {op!r} on device {device!r} accepts dtype "
                f"{dtype.name if dtype else None}; install a plugin for that device"
            )
        return out


def choose_kernel(op: str, device: str, inputs: Sequence[Any], attrs: dict | None = None,
                  recs: Sequence[KernelRecord] | None = None) -> Callable:
    """The kernel for one call of ``op`` on ``device``: the function of
    :func:`choose_kernel_record`'s choice. Eager dispatch calls it with the arrays."""
    return choose_kernel_record(op, device, inputs, attrs, recs).function()


def choose_kernel_record(op: str, device: str, inputs: Sequence[Any], attrs: dict | None = None,
                         recs: Sequence[KernelRecord] | None = None) -> KernelRecord:
    """The record of the kernel for one call of ``op`` on ``device``: the best-priority kernel
    that accepts the dtype of the first input and whose ``supports`` check accepts the call.
    This is the one place kernels are chosen: eager dispatch (through :func:`choose_kernel`)
    calls it with the arrays, the planner with stand-ins of the planned shapes and dtypes, and
    reads the record's ``writes_out``. ``recs`` skips the lookup (callers cache it)."""
    if recs is None:
        first = next((a for a in inputs if a is not None), None)
        dtype = DType.from_numpy(first.dtype) if first is not None else None
        recs = _registry.candidates(op, device, dtype)
    for rec in recs:
        check = rec.supports_function()
        if check is None or check(*inputs, **(attrs or _NO_ATTRS)):
            return rec
    raise PluginError(f"no registered kernel for {op} on {device!r} accepts this call "
                      f"(inputs: {_describe_arrays(inputs)}); the kernels' supports checks "
                      "refused it and no fallback kernel is registered")


_NO_ATTRS: dict = {}


def _describe_arrays(inputs) -> str:
    return ", ".join("None" if a is None else f"{a.dtype}{list(a.shape)}" for a in inputs)


def _kernel_record(plugin, op, impl, *, device="cpu", dtypes=None, priority=0, supports=None,
                   writes_out=False):
    dts = None if dtypes is None else frozenset(DType.of(d) for d in dtypes)
    return KernelRecord(op, impl, device, dts, int(priority), supports, plugin, bool(writes_out))


def _env_list(name: str) -> set[str] | None:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    return {p.strip() for p in raw.split(",") if p.strip()}


def _entry_points() -> Iterable:
    import importlib.metadata  # not at import time: it costs tens of milliseconds

    return importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)


_registry = Registry()


def get_registry() -> Registry:
    return _registry


def reset() -> None:
    """Forget every plugin; the next use loads them again (honouring the environment)."""
    global _registry
    with _registry._lock:
        _registry = Registry()
    _notify_change()


_change_callbacks: list[Callable[[], None]] = []


def on_change(callback: Callable[[], None]) -> None:
    """Call ``callback`` whenever registrations change, so caches built from them drop."""
    _change_callbacks.append(callback)


def _notify_change() -> None:
    for cb in _change_callbacks:
        cb()


def pluginmanager() -> pluggy.PluginManager:
    return _registry.pluginmanager


def list_plugins() -> list[PluginInfo]:
    return _registry.list_plugins()


def register_plugin(plugin: object, name: str, version: str = "unknown") -> None:
    _registry.register_plugin(plugin, name, version)


def register_builtin(name: str, module: str, distribution: str) -> None:
    """Make ``module`` (a hook-implementing module of a OneModel package) a built-in plugin: it
    is registered now if the registry is loaded, and at every later load or reset."""
    if name in BUILTIN_PLUGINS:
        return
    BUILTIN_PLUGINS[name] = (module, distribution)
    reg = _registry
    if reg._pm is not None:
        with reg._lock:
            reg._register(reg._pm, importlib.import_module(module), name, distribution)


def unregister_plugin(name: str) -> None:
    _registry.unregister_plugin(name)


def kernels() -> dict[str, list[KernelRecord]]:
    return _registry.kernels()


def backends() -> dict[str, BackendRecord]:
    return _registry.backends()


def collect(hook_name: str) -> list[tuple[str, tuple, dict]]:
    return _registry.collect(hook_name)
