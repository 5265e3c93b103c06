"""Running the subgraphs of If, Loop, Scan and SequenceMap (defined in
``onemodel.tensors.ops.controlflow``) with the same planner and executor as any graph.

Outer-scope values are explicit inputs of the node and of its subgraphs (see the ops'
module), so a subgraph here is an ordinary graph with ordinary inputs.

A subgraph runs through a :class:`SubgraphRunner` kept on the graph object: it makes a plan
per signature of the values it is given (shapes and dtypes, and the values of inputs that set
shapes) and keeps them in a :class:`PlanCache`, as a Session does for its graph.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from onemodel.tensors import OneModelError, TensorSpec
from onemodel.tensors.ops import controlflow as _ops
from onemodel.tensors.ops.sequence import OptionalSpec, SequenceSpec, spec_of_value

from .graph import Graph, ValueInfo
from .plancache import PlanCache
from .planner import _signature, make_plan

_RUNNER_LOCK = threading.Lock()


class SubgraphRunner:
    """Runs one subgraph on lists of values, with plans cached per input signature."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.plans = PlanCache(max_plans=16, max_bytes=64 << 20)
        self._value_inputs: list[int] | None = None
        self._wanted = tuple(v.name for v in graph.outputs)

    def run(self, values: Sequence) -> list:
        if len(values) != len(self.graph.inputs):
            raise OneModelError(f"subgraph {self.graph.name!r} takes {len(self.graph.inputs)} "
                                f"values, {len(values)} given")
        if self._value_inputs is None:
            self._value_inputs = self._find_value_inputs(values)
        key = tuple(_signature(v) for v in values)
        if self._value_inputs:
            key += tuple(np.ascontiguousarray(values[i]).tobytes() for i in self._value_inputs)
        plan = self.plans.get_or_build(key, self._build, values)
        if self._value_inputs:
            values = [v for i, v in enumerate(values) if i not in self._value_inputs]
        return plan.execute(values)

    def _concrete(self, values) -> tuple[Graph, dict]:
        """This graph with its inputs declared as the values given are, and their specs."""
        inputs, shapes = [], {}
        for v, x in zip(self.graph.inputs, values):
            spec = spec_of_value(x)
            if isinstance(spec, TensorSpec):
                inputs.append(ValueInfo(v.name, spec.dtype, spec.shape))
                shapes[v.name] = spec.shape
            elif isinstance(spec, SequenceSpec):
                inputs.append(ValueInfo(v.name, spec.dtype or v.dtype, (), "sequence"))
                shapes[v.name] = spec
            else:
                inputs.append(ValueInfo(v.name, v.dtype, (), "optional"))
                shapes[v.name] = OptionalSpec(None, False)
        g = Graph(inputs, self.graph.outputs, self.graph.nodes, self.graph.initializers,
                  name=self.graph.name)
        return g, shapes

    def _find_value_inputs(self, values) -> list[int]:
        g, _ = self._concrete(values)
        try:
            found = g.value_inputs()
        except OneModelError:
            found = set()
        return [i for i, v in enumerate(g.inputs) if v.name in found]

    def _build(self, values):
        g, shapes = self._concrete(values)
        fixed = {g.inputs[i].name: np.array(values[i], copy=True) for i in self._value_inputs}
        g.inputs = [v for v in g.inputs if v.name not in fixed]
        return make_plan(g, shapes, self._wanted, fixed)


def runner(graph: Graph) -> SubgraphRunner:
    """The runner kept on ``graph`` (made on first use)."""
    r = graph.__dict__.get("_runner")
    if r is None:
        with _RUNNER_LOCK:
            r = graph.__dict__.get("_runner")
            if r is None:
                r = SubgraphRunner(graph)
                graph.__dict__["_runner"] = r
    return r


def run_graph(graph: Graph, values: Sequence) -> list:
    """Run ``graph`` on ``values`` (one per input, in order) and return its outputs."""
    return runner(graph).run(values)


_ops.set_subgraph_runner(run_graph)
