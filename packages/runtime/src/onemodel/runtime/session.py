"""``Session``: run a graph (loaded from a file or given) for inference.

The graph is optimized once; each new input-shape signature gets a plan (see planner.py), kept
in a cache bounded by count and bytes (plancache.py). Only inputs whose values set shapes join a
plan's key. ``run`` is safe to call from several threads at once; its outputs are new arrays that
share no memory with the feeds, the session, or other runs."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from onemodel.tensors import DimExpr, DType, OneModelError, Tensor, devices, registry
from onemodel.tensors import threads as _threads

from . import buffers as _buffers
from .graph import Graph
from .passes import PassManager
from .passes.base import owned
from .placement import place
from .plancache import CacheInfo, PlanCache
from .planner import Plan, _input_spec, _signature, make_plan
from .profiling import Profiler


@dataclass(frozen=True)
class IOInfo:
    """A session input or output: symbolic axes are given by their names."""

    name: str
    dtype: DType
    shape: tuple[int | str, ...]


OPTIMIZATION_LEVELS = ("none", "basic", "all")


class Session:
    """An inference session over one graph.

    Options, as onnxruntime users know them: ``threads`` for the BLAS and kernel plugins
    (default: ``ONEMODEL_NUM_THREADS``, else every CPU); ``optimization_level`` ``"none"``,
    ``"basic"`` (passes that only remove or precompute nodes) or ``"all"`` (also rewrites and
    fusions; ``optimize=False`` means ``"none"``); ``profile=True`` records every node's time
    (see :meth:`end_profiling` and :meth:`profile_summary`).

    ``max_plans`` and ``max_plan_bytes`` bound the plan cache (least recently used plans go
    first); a plan bigger than ``max_plan_bytes`` on its own runs but is not kept.

    ``device`` (``"cpu"``, or a device a backend plugin registers, such as ``"cuda"``) is where
    the plans run: initializers are placed there once, feeds move there at each run, and
    outputs come back to host memory, or stay on the device as Tensors of that device with
    ``outputs_on_device=True`` (see ``onemodel.runtime.placement``).

    ``planned_buffers`` (default: ``ONEMODEL_PLANNED_BUFFERS``, else on): kernels that write
    ``out=`` get output buffers the plan reuses from run to run, so steady-state runs at one
    shape make no new arrays for them (see ``onemodel.runtime.buffers``); ``False`` makes every
    step of the session's plans allocate its outputs (the subgraphs of If, Loop and Scan, run by
    the graph's own runner, follow ``ONEMODEL_PLANNED_BUFFERS``). Device sessions plan none.

    The session owns its weights, as an onnxruntime session does: the graph's initializers
    that can change in place (a traced model's parameters) are copied once, read-only, when it
    is made; changing the graph's arrays afterwards does not reach it. Build a new session to
    run new weights. A file's constants are read-only already and are not copied."""

    def __init__(self, graph: Graph, *, optimize: bool = True, threads: int | None = None,
                 optimization_level: str = "all", profile: bool = False, device: str = "cpu",
                 outputs_on_device: bool = False, planned_buffers: bool | None = None):
        if optimization_level not in OPTIMIZATION_LEVELS:
            raise OneModelError(f"optimization_level must be one of {', '.join(OPTIMIZATION_LEVELS)}"
                                f", not {optimization_level!r}")
        self.optimization_level = optimization_level if optimize else "none"
        self.threads = threads
        if threads is not None:
            _threads.set_num_threads(threads)
        else:
            _threads.configure(None)  # ONEMODEL_NUM_THREADS, once per process
        graph.validate(allow_unknown=True)
        self.source_graph = graph
        self.graph = graph.copy()
        # the session owns its weights, as onnxruntime's does: a writable initializer is copied
        # once into a read-only array here, so kernels may lay weights out once (packed panels,
        # register tiles) and the caller changing its arrays later reaches no plan, half or whole
        self.graph.initializers = {k: owned(v) for k, v in self.graph.initializers.items()}
        self.optimizations: dict[str, int] = {}
        if self.optimization_level != "none":
            passes = [p for p in default_passes()
                      if self.optimization_level == "all" or getattr(p, "level", "all") == "basic"]
            self.optimizations = PassManager(passes).run(self.graph)
        self._specs = self.graph.validate(allow_unknown=True)  # symbolic: settle zero sizes
        self._inputs = {v.name: v for v in self.graph.inputs}
        # inputs whose values set shapes: part of a plan's signature
        value_inputs = self.graph.value_inputs(self._specs)
        self._value_inputs = [i for i, v in enumerate(self.graph.inputs) if v.name in value_inputs]
        self._output_names = [v.name for v in self.graph.outputs]
        self._all_outputs = tuple(self._output_names)
        # sequences or optionals among the inputs: their signatures are read element by element
        self._plain_inputs = all(v.kind == "tensor" for v in self.graph.inputs)
        # the common request, every input a numpy array of its dtype, is checked in one pass
        self._plain_feed = tuple((v.name, v.dtype.numpy) for v in self.graph.inputs) \
            if self._plain_inputs else None
        self._plans = PlanCache()
        self._profiler = Profiler() if profile else None
        self.device = devices.normalize(device)
        devices.get_device(self.device)  # an unknown device fails here, naming it
        self._keep_on_device = bool(outputs_on_device) and self.device != "cpu"
        self.planned_buffers = _buffers.enabled(planned_buffers)

    @property
    def max_plans(self) -> int:
        return self._plans.max_plans

    @max_plans.setter
    def max_plans(self, value: int) -> None:
        self._plans.max_plans = int(value)
        self._plans.trim()

    @property
    def max_plan_bytes(self) -> int:
        return self._plans.max_bytes

    @max_plan_bytes.setter
    def max_plan_bytes(self, value: int) -> None:
        self._plans.max_bytes = int(value)
        self._plans.trim()

    def cache_info(self) -> CacheInfo:
        """Plan-cache counters: hits, plans built, evictions, plans and bytes held, bounds."""
        return self._plans.info()

    @classmethod
    def load(cls, path_or_graph: str | os.PathLike | Graph, *, optimize: bool = True,
             threads: int | None = None, optimization_level: str = "all",
             profile: bool = False, device: str = "cpu",
             outputs_on_device: bool = False, planned_buffers: bool | None = None) -> Session:
        """A session over a graph, or over the graph in a file (``.onemodel``, ``.onnx``, or any
        installed format, chosen by extension and then by content). Options as for ``Session``."""
        options = {"optimize": optimize, "threads": threads,
                   "optimization_level": optimization_level, "profile": profile,
                   "device": device, "outputs_on_device": outputs_on_device,
                   "planned_buffers": planned_buffers}
        if isinstance(path_or_graph, Graph):
            return cls(path_or_graph, **options)
        from .serializers import load

        return cls(load(path_or_graph), **options)

    def end_profiling(self, path: str | os.PathLike | None = None) -> str:
        """Write the recorded runs as a Chrome trace (one event per executed node, one per run)
        to ``path`` (default ``onemodel_profile_<time>.json`` here), return the path, and start
        recording anew."""
        if self._profiler is None:
            raise OneModelError("this session does not profile; create it with profile=True")
        path = path or time.strftime("onemodel_profile_%Y%m%d_%H%M%S.json")
        written = self._profiler.write(path)
        self._profiler = Profiler()
        return written

    def profile_summary(self) -> str:
        """A table of time per op type over the runs recorded since profiling (re)started."""
        if self._profiler is None:
            raise OneModelError("this session does not profile; create it with profile=True")
        return self._profiler.summary()

    @property
    def inputs(self) -> list[IOInfo]:
        return [io_info(v) for v in self.graph.inputs]

    @property
    def outputs(self) -> list[IOInfo]:
        return [io_info(v) for v in self.graph.outputs]

    def run(self, feeds: Mapping[str, object], outputs: Sequence[str] | None = None, *,
            return_numpy: bool = False) -> dict[str, Tensor] | dict[str, np.ndarray]:
        """Run the graph on ``feeds``: name -> Tensor, numpy array, or anything array-like
        (nested lists, objects with ``__array__``, DLPack producers such as torch tensors).
        Returns name -> Tensor, or name -> numpy array with ``return_numpy=True``."""
        arrays = self._plain_arrays(feeds) or self._check_feeds(feeds)
        wanted = self._all_outputs if outputs is None else tuple(outputs)
        if self._plain_inputs:
            key = (tuple([a.shape for a in arrays]), wanted)
        else:
            key = (tuple(_signature(a) for a in arrays), wanted)
        if self._value_inputs:
            key += tuple(arrays[i].tobytes() for i in self._value_inputs)
        plan = self._plans.get_or_build(key, self._make_plan, arrays, wanted)
        if self.threads is not None and self.threads != _threads.num_threads():
            _threads.set_num_threads(self.threads)  # another session changed the setting
        if self._profiler is None:
            results = plan.execute(arrays)
        else:
            start = self._profiler.now_us()
            results = plan.execute_profiled(arrays, self._profiler)
            self._profiler.record("run", "Session", start, self._profiler.now_us() - start,
                                  {"input_shapes": {k: list(a.shape) for k, a in
                                                    zip(self._inputs, arrays)}})
        if self._keep_on_device:
            return {name: _wrap(r, self.device) for name, r in zip(wanted, results)}
        if return_numpy:
            return dict(zip(wanted, results))
        return {name: _wrap(r) for name, r in zip(wanted, results)}

    def plan_for(self, shapes: Mapping[str, Sequence[int]],
                 outputs: Sequence[str] | None = None) -> Plan:
        """The plan for these input shapes (made now if needed): for inspection and reports.

        Graphs whose plans depend on the values of inputs (a Reshape target fed at run time)
        have no plan per shape; run them instead."""
        if not self._plain_inputs:
            names = ", ".join(repr(v.name) for v in self.graph.inputs if v.kind != "tensor")
            raise OneModelError(f"input {names} is a sequence or optional, which has no shape "
                                "to plan for; call run() with its value instead")
        if self._value_inputs:
            names = ", ".join(repr(self.graph.inputs[i].name) for i in self._value_inputs)
            raise OneModelError(f"this graph's plans depend on the values of input {names}, "
                                "not only on shapes; call run() with those values instead")
        arrays = [np.empty(tuple(shapes[v.name]), v.dtype.numpy) for v in self.graph.inputs]
        wanted = tuple(self._output_names if outputs is None else outputs)
        key = (tuple(a.shape for a in arrays), wanted)
        return self._plans.get_or_build(key, self._make_plan, arrays, wanted)

    def warmup(self, shapes: Mapping[str, Sequence[int]],
               outputs: Sequence[str] | None = None) -> Plan:
        """Build the plan for these input shapes and run it once on zeros, so that JIT kernel
        plugins (numba) compile everything it uses now rather than on the first real request.
        Returns the plan; a later ``run`` at these shapes reuses it."""
        missing = [v.name for v in self.graph.inputs if v.name not in shapes]
        unknown = [k for k in shapes if k not in self._inputs]
        if missing or unknown:
            raise OneModelError(
                (f"warmup: no shape given for input {missing[0]!r}" if missing
                 else f"warmup: unknown input {unknown[0]!r}")
                + "; give one shape per input: " + ", ".join(repr(v.name) for v in self.graph.inputs))
        plan = self.plan_for(shapes, outputs)
        zeros = [np.zeros(tuple(shapes[v.name]), v.dtype.numpy) for v in self.graph.inputs]
        if self.threads is not None and self.threads != _threads.num_threads():
            _threads.set_num_threads(self.threads)
        with np.errstate(all="ignore"):  # zeros may divide by zero; only compilation matters
            plan.execute(zeros)
        return plan

    # ------------------------------------------------------------------------------------------
    def _plain_arrays(self, feeds) -> list[np.ndarray] | None:
        """The feeds when they are exactly the inputs, each a numpy array of its input's dtype
        (what a serving loop passes), else None: :meth:`_check_feeds` then converts, or says
        what is wrong."""
        plain = self._plain_feed
        if plain is None or type(feeds) is not dict or len(feeds) != len(plain):
            return None
        arrays = []
        for name, dtype in plain:
            arr = feeds.get(name)
            if type(arr) is not np.ndarray or arr.dtype != dtype:
                return None
            arrays.append(arr)
        return arrays

    def _check_feeds(self, feeds: Mapping[str, Tensor | np.ndarray]) -> list[np.ndarray]:
        unknown = [k for k in feeds if k not in self._inputs]
        if unknown:
            raise OneModelError(
                f"unknown input {unknown[0]!r}; this graph's inputs are "
                + ", ".join(f"{v.name!r}" for v in self.graph.inputs)
            )
        arrays = []
        for v in self.graph.inputs:
            if v.name not in feeds:
                if v.kind.startswith("optional"):
                    arrays.append(None)  # an optional input left out: an empty optional
                    continue
                raise OneModelError(f"missing input {v.name!r} ({v.dtype.name}"
                                    f"[{', '.join(str(d) for d in v.shape)}])")
            if v.kind != "tensor":
                arrays.append(_as_value(v, feeds[v.name]))
                continue
            arr = _as_array(v, feeds[v.name])
            if arr.dtype != v.dtype.numpy:
                got = getattr(DType.lookup(arr.dtype), "name", arr.dtype)
                raise OneModelError(f"input {v.name!r} must have dtype {v.dtype.name}, got {got}; "
                                    "cast it first")
            arrays.append(arr)
        return arrays

    def _make_plan(self, arrays, wanted) -> Plan:
        missing = [w for w in wanted if w not in self._output_names]
        if missing:
            raise OneModelError(f"unknown output {missing[0]!r}; this graph's outputs are "
                                + ", ".join(repr(o) for o in self._output_names))
        shapes = {v.name: a.shape if v.kind == "tensor" else _input_spec(v, a)
                  for v, a in zip(self.graph.inputs, arrays)}
        values = {self.graph.inputs[i].name: np.array(arrays[i], copy=True)
                  for i in self._value_inputs}
        plan = make_plan(self.graph, shapes, wanted, values, self._specs,
                         buffers=self.planned_buffers and self.device == "cpu")
        if self.device == "cpu":
            return plan
        return place(plan, self.device, self._keep_on_device)


def _wrap(result, device: str = "cpu"):
    """A run's output for the caller: a Tensor, a list of Tensors (a sequence), or None (an
    empty optional)."""
    if result is None:
        return None
    if isinstance(result, list):
        return [Tensor._wrap(r, device) for r in result]
    return Tensor._wrap(result, device)


def _as_value(v, value):
    """A feed for a sequence or optional input: a list of arrays, or None for an empty
    optional; each element must have the input's dtype."""
    if value is None:
        if v.kind.startswith("optional"):
            return None
        raise OneModelError(f"input {v.name!r} is a sequence; give a list of arrays, not None")
    if v.kind in ("sequence", "optional_sequence"):
        if isinstance(value, np.ndarray) or not isinstance(value, (list, tuple)):
            raise OneModelError(f"input {v.name!r} is a sequence of {v.dtype.name} tensors; "
                                f"give a list of arrays, not a {type(value).__name__}")
        out = []
        for k, x in enumerate(value):
            arr = _as_array(v, x)
            if arr.dtype != v.dtype.numpy:
                raise OneModelError(f"input {v.name!r} element {k} must have dtype "
                                    f"{v.dtype.name}, got {arr.dtype}; cast it first")
            out.append(arr)
        return out
    arr = _as_array(v, value)  # an optional tensor that holds a value
    if arr.dtype != v.dtype.numpy:
        raise OneModelError(f"input {v.name!r} must have dtype {v.dtype.name}, got "
                            f"{arr.dtype}; cast it first")
    return arr


def _as_array(v, value) -> np.ndarray:
    """A feed as a numpy array: Tensors and arrays as they are, DLPack producers without a
    copy, other array-likes through numpy. Python numbers (lists, scalars) take the input's
    dtype when numpy's same-kind rule allows it (floats to F32, ints to I64 or a float dtype)."""
    if isinstance(value, Tensor):
        return value.numpy()
    if isinstance(value, np.ndarray):
        return value
    try:
        if hasattr(value, "__dlpack__"):
            try:
                return np.from_dlpack(value)
            except (BufferError, TypeError, RuntimeError):
                pass  # a device or a type numpy cannot share: convert through __array__
        if hasattr(value, "detach") and hasattr(value, "numpy"):  # torch tensors needing grad
            return np.asarray(value.detach().numpy())
        arr = np.asarray(value)
    except Exception as exc:  # numpy's own message says what it could not convert
        raise OneModelError(f"input {v.name!r}: cannot read a {type(value).__name__} as an "
                            f"array ({exc})") from None
    if arr.dtype == object:
        raise OneModelError(f"input {v.name!r}: the {type(value).__name__} given is not a "
                            "rectangular array of numbers")
    if isinstance(value, (list, tuple, int, float, bool)) and arr.dtype != v.dtype.numpy \
            and np.can_cast(arr.dtype, v.dtype.numpy, "same_kind"):
        arr = arr.astype(v.dtype.numpy)
    return arr


def io_info(v) -> IOInfo:
    return IOInfo(v.name, v.dtype, tuple(str(d) if isinstance(d, DimExpr) else int(d)
                                         for d in v.shape))


def default_passes():
    """Instances of every registered pass, in their order."""
    entries = []
    for plugin, args, kwargs in registry.collect("onemodel_register_passes"):
        name, impl = args[0], args[1]
        entries.append((kwargs.get("order", 100), name, impl, plugin))
    entries.sort(key=lambda e: e[0])
    out = []
    for _, name, impl, _plugin in entries:
        cls = registry.resolve(impl)
        p = cls()
        p.name = name
        out.append(p)
    return out
