"""``Session``: run a graph (loaded from a file or given) for inference.

The graph is optimized once; each new input-shape signature gets a plan (see planner.py), kept
in a cache bounded by count and bytes (plancache.py). Only inputs whose values set shapes join a
plan's key. ``run`` is safe to call from several threads at once; its outputs are new arrays that
share no memory with the feeds, the session, or other runs."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from onemodel.tensors import DimExpr, DType, OneModelError, Tensor, registry
from onemodel.tensors import threads as _threads

from .graph import Graph
from .passes import PassManager
from .plancache import CacheInfo, PlanCache
from .planner import Plan, make_plan


@dataclass(frozen=True)
class IOInfo:
    """A session input or output: symbolic axes are given by their names."""

    name: str
    dtype: DType
    shape: tuple[int | str, ...]


class Session:
    """An inference session over one graph.

    ``max_plans`` and ``max_plan_bytes`` bound the plan cache (least recently used plans go
    first); a plan bigger than ``max_plan_bytes`` on its own runs but is not kept."""

    def __init__(self, graph: Graph, *, optimize: bool = True, threads: int | None = None):
        # threads: for the BLAS and kernel plugins (default: ONEMODEL_NUM_THREADS, else all CPUs)
        self.threads = threads
        if threads is not None:
            _threads.set_num_threads(threads)
        else:
            _threads.configure(None)  # ONEMODEL_NUM_THREADS, once per process
        graph.validate(allow_unknown=True)
        self.source_graph = graph
        self.graph = graph.copy()
        self.optimizations: dict[str, int] = {}
        if optimize:
            self.optimizations = PassManager(default_passes()).run(self.graph)
        self._specs = self.graph.validate(allow_unknown=True)  # symbolic: settle zero sizes
        self._inputs = {v.name: v for v in self.graph.inputs}
        # inputs whose values set shapes: part of a plan's signature
        value_inputs = self.graph.value_inputs(self._specs)
        self._value_inputs = [i for i, v in enumerate(self.graph.inputs) if v.name in value_inputs]
        self._output_names = [v.name for v in self.graph.outputs]
        self._plans = PlanCache()

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
             threads: int | None = None) -> Session:
        """A session over a graph, or over the graph in a file (``.onemodel``, ``.onnx``, or any
        installed format, chosen by extension and then by content)."""
        if isinstance(path_or_graph, Graph):
            return cls(path_or_graph, optimize=optimize, threads=threads)
        from .serializers import load

        return cls(load(path_or_graph), optimize=optimize, threads=threads)

    @property
    def inputs(self) -> list[IOInfo]:
        return [io_info(v) for v in self.graph.inputs]

    @property
    def outputs(self) -> list[IOInfo]:
        return [io_info(v) for v in self.graph.outputs]

    def run(self, feeds: Mapping[str, Tensor | np.ndarray],
            outputs: Sequence[str] | None = None) -> dict[str, Tensor]:
        """Run the graph on ``feeds`` (name -> Tensor or numpy array); returns name -> Tensor."""
        arrays = self._check_feeds(feeds)
        wanted = tuple(self._output_names if outputs is None else outputs)
        key = (tuple(a.shape for a in arrays), wanted)
        if self._value_inputs:
            key += tuple(arrays[i].tobytes() for i in self._value_inputs)
        plan = self._plans.get_or_build(key, self._make_plan, arrays, wanted)
        if self.threads is not None and self.threads != _threads.num_threads():
            _threads.set_num_threads(self.threads)  # another session changed the setting
        results = plan.execute(arrays)
        return {name: Tensor._wrap(r) for name, r in zip(wanted, results)}

    def plan_for(self, shapes: Mapping[str, Sequence[int]],
                 outputs: Sequence[str] | None = None) -> Plan:
        """The plan for these input shapes (made now if needed): for inspection and reports.

        Graphs whose plans depend on the values of inputs (a Reshape target fed at run time)
        have no plan per shape; run them instead."""
        if self._value_inputs:
            names = ", ".join(repr(self.graph.inputs[i].name) for i in self._value_inputs)
            raise OneModelError(f"this graph's plans depend on the values of input {names}, "
                                "not only on shapes; call run() with those values instead")
        arrays = [np.empty(tuple(shapes[v.name]), v.dtype.numpy) for v in self.graph.inputs]
        wanted = tuple(self._output_names if outputs is None else outputs)
        key = (tuple(a.shape for a in arrays), wanted)
        return self._plans.get_or_build(key, self._make_plan, arrays, wanted)

    # ------------------------------------------------------------------------------------------
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
                raise OneModelError(f"missing input {v.name!r} ({v.dtype.name}"
                                    f"[{', '.join(str(d) for d in v.shape)}])")
            value = feeds[v.name]
            if isinstance(value, Tensor):
                arr = value.numpy()
            elif isinstance(value, np.ndarray):
                arr = value
            else:
                raise OneModelError(f"input {v.name!r} must be a Tensor or a numpy array, not "
                                    f"{type(value).__name__}")
            if arr.dtype != v.dtype.numpy:
                got = DType.from_numpy(arr.dtype).name if arr.dtype in _KNOWN else arr.dtype
                raise OneModelError(f"input {v.name!r} must have dtype {v.dtype.name}, got {got}; "
                                    "cast it first")
            arrays.append(arr)
        return arrays

    def _make_plan(self, arrays, wanted) -> Plan:
        missing = [w for w in wanted if w not in self._output_names]
        if missing:
            raise OneModelError(f"unknown output {missing[0]!r}; this graph's outputs are "
                                + ", ".join(repr(o) for o in self._output_names))
        shapes = {v.name: a.shape for v, a in zip(self.graph.inputs, arrays)}
        values = {self.graph.inputs[i].name: np.array(arrays[i], copy=True)
                  for i in self._value_inputs}
        return make_plan(self.graph, shapes, wanted, values, self._specs)


_KNOWN = {d.numpy for d in DType}


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
