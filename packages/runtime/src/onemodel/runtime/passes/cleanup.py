"""Passes that remove work: dead nodes, Identity and inference Dropout, duplicate nodes."""

from __future__ import annotations

import numpy as np

from onemodel.tensors import DType, OneModelError
from onemodel.tensors.ops import OPS

from ..graph import Graph
from .base import Pass, PassResult, output_names, replace_uses


class DeadCodeElimination(Pass):
    name = "dead-code"
    level = "basic"
    changes = "removes nodes no graph output depends on, and unused initializers"

    def run(self, graph: Graph) -> PassResult:
        keep, needed = graph.needed(output_names(graph))
        unused = [k for k in graph.initializers if k not in needed]
        for k in unused:
            del graph.initializers[k]
        removed = len(graph.nodes) - len(keep)
        graph.nodes = keep
        return PassResult(removed + len(unused))


class IdentityElimination(Pass):
    name = "identity"
    level = "basic"
    changes = ("removes Identity nodes, Dropout nodes that run in inference mode (their mask "
               "unused) and Casts to the dtype their input already has, rewiring their consumers")

    def run(self, graph: Graph) -> PassResult:
        outputs = output_names(graph)
        inputs = {v.name for v in graph.inputs}
        done = 0
        specs: dict | None = None  # the values' specs, computed once a Cast is met
        for n in list(graph.nodes):
            if n.op == "Cast":
                if specs is None:
                    specs = self._specs(graph)
                if not self._is_same_type_cast(n, specs):
                    continue
            elif not self._is_identity(graph, n):
                continue
            src, dst = n.inputs[0], n.outputs[0]
            if dst in outputs:
                # keep the graph's output name: rename the producer's output instead, when the
                # source is a plain intermediate value
                if src in inputs or src in graph.initializers or src in outputs:
                    continue
                producer = next((p for p in graph.nodes if src in p.outputs), None)
                if producer is None:
                    continue
                producer.outputs = [dst if o == src else o for o in producer.outputs]
                replace_uses(graph, src, dst)
            else:
                replace_uses(graph, dst, src)
            graph.nodes.remove(n)
            done += 1
        return PassResult(done)

    @staticmethod
    def _specs(graph: Graph) -> dict:
        try:
            return graph.validate(allow_unknown=True)
        except OneModelError:
            return {}  # the graph's checks will report it; Casts stay as they are

    @staticmethod
    def _is_same_type_cast(n, specs: dict) -> bool:
        """A Cast whose input's dtype is known and is its target's: an identity (ONNX Cast
        leaves a value of the target type as it is)."""
        if len(n.inputs) != 1 or len(n.outputs) != 1 or not n.inputs[0] or not n.outputs[0]:
            return False
        spec = specs.get(n.inputs[0])
        if spec is None:
            return False
        try:
            to = DType.of(n.attrs.get("to", OPS["Cast"].attrs["to"]))
        except (OneModelError, TypeError, ValueError):
            return False
        return spec.dtype == to

    @staticmethod
    def _is_identity(graph: Graph, n) -> bool:
        if n.op == "Identity":
            return True
        if n.op != "Dropout":
            return False
        if len(n.outputs) > 1 and n.outputs[1]:
            used = any(n.outputs[1] in m.inputs for m in graph.nodes)
            if used or n.outputs[1] in output_names(graph):
                return False
        training = n.inputs[2] if len(n.inputs) > 2 else ""
        if not training:
            return True
        value = graph.initializers.get(training)
        return value is not None and not bool(np.asarray(value).reshape(-1)[0])


class CommonSubexpressionElimination(Pass):
    name = "cse"
    level = "basic"
    changes = "merges nodes that apply the same op with the same attributes to the same inputs"

    def run(self, graph: Graph) -> PassResult:
        seen: dict[tuple, object] = {}
        outputs = output_names(graph)
        renames: dict[str, str] = {}
        kept = []
        for n in graph.nodes:
            # nodes are in topological order: every merged value is renamed before it is read
            if renames and any(i in renames for i in n.inputs):
                n.inputs = [renames.get(i, i) for i in n.inputs]
            kept.append(n)
            if n.op == "Dropout":
                continue  # random in training mode
            key = (n.op, tuple(n.inputs), _freeze(n.attrs), len(n.outputs))
            first = seen.get(key)
            if first is None:
                seen[key] = n
                continue
            if any(o in outputs for o in n.outputs):
                continue
            for mine, theirs in zip(n.outputs, first.outputs):
                if mine:
                    renames[mine] = theirs
            kept.pop()
        removed = len(graph.nodes) - len(kept)
        graph.nodes = kept
        return PassResult(removed)


def _freeze(attrs: dict) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))
