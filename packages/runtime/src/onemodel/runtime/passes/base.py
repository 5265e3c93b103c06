"""What a pass is, and the manager that runs passes to a fixpoint.

A pass says in ``changes`` what it rewrites. ``run`` rewrites *every* match in one call and
returns a :class:`PassResult` saying how many rewrites it made (a plain ``bool`` from a plugin's
pass is accepted too). Passes come from the registry (``onemodel_register_passes``), the
built-in ones included. A rewrite is kept only when the op's shape rule accepts the new node and
gives the value it replaces the same dtype and shape (:func:`same_spec`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from onemodel.tensors import DType, OneModelError, TensorSpec
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.specialize import is_frozen

from ..graph import Graph, Node, small_value


@dataclass(frozen=True)
class PassResult:
    """What one call of a pass did: ``rewrites`` sites changed (0: the graph is untouched)."""

    rewrites: int = 0

    @property
    def modified(self) -> bool:
        return self.rewrites > 0

    def __bool__(self) -> bool:
        return self.rewrites > 0


class Pass:
    """Base class of optimization passes. Subclasses set ``name``, ``changes`` and ``level``.

    ``level`` is the lowest session optimization level that runs the pass: ``"basic"`` for
    passes that only remove or precompute nodes (the ops that run stay the graph's own),
    ``"all"`` for rewrites into other or fused ops."""

    name = "pass"
    changes = ""
    level = "all"

    def run(self, graph: Graph) -> PassResult:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.changes}>"


class FixpointWarning(UserWarning):
    """The pass manager stopped at its round cap while passes were still changing the graph."""


class PassManager:
    """Run passes in order, again and again, until a whole round changes nothing.

    Each pass rewrites every match per call, so a fixpoint normally takes two or three rounds;
    ``max_rounds`` is only a guard against passes that undo each other, and hitting it warns."""

    def __init__(self, passes: Sequence[Pass], max_rounds: int = 20):
        self.passes = list(passes)
        self.max_rounds = max_rounds

    def run(self, graph: Graph) -> dict[str, int]:
        """Optimize ``graph`` in place; returns how many rewrites each pass made."""
        counts = {p.name: 0 for p in self.passes}
        for _ in range(self.max_rounds):
            changed = False
            for p in self.passes:
                n = _rewrites(p.run(graph))
                if n:
                    counts[p.name] += n
                    changed = True
            if not changed:
                break
        else:
            warnings.warn(
                f"the optimization passes did not reach a fixpoint in {self.max_rounds} rounds "
                f"(rewrites so far: {counts}); the graph is valid but may be partly optimized. "
                "Two passes probably undo each other: disable one with the registry's deny list.",
                FixpointWarning, stacklevel=2)
        graph.validate(allow_unknown=True)
        return counts


def _rewrites(result) -> int:
    if isinstance(result, PassResult):
        return result.rewrites
    if isinstance(result, bool) or result is None:
        return int(bool(result))
    return int(result)


# helpers the passes share ---------------------------------------------------------------------
def output_names(graph: Graph) -> set[str]:
    return {v.name for v in graph.outputs}


def rename_uses(graph: Graph, renames: dict[str, str]) -> None:
    """Make every consumer of a value in ``renames`` read its new name instead (one sweep)."""
    if not renames:
        return

    def final(name: str) -> str:
        seen = 0
        while name in renames and seen < len(renames) + 1:
            name = renames[name]
            seen += 1
        return name

    for n in graph.nodes:
        if any(i in renames for i in n.inputs):
            n.inputs = [final(i) if i else i for i in n.inputs]


def replace_uses(graph: Graph, old: str, new: str) -> None:
    """Make every consumer of value ``old`` read ``new`` instead."""
    rename_uses(graph, {old: new})


class Uses:
    """Who reads each value, built once per pass call and kept current by the pass."""

    def __init__(self, graph: Graph):
        self.outputs = output_names(graph)
        self.readers: dict[str, list[Node]] = {}
        self.producer: dict[str, Node] = {}
        for n in graph.nodes:
            for i in n.inputs:
                if i:
                    self.readers.setdefault(i, []).append(n)
            for o in n.outputs:
                if o:
                    self.producer[o] = n

    def sole_consumer(self, value: str) -> Node | None:
        """The only node reading ``value``, or None (also None when it is a graph output)."""
        if value in self.outputs:
            return None
        users = self.readers.get(value, ())
        if len(users) != 1:
            return None
        return users[0]


def sole_consumer(graph: Graph, value: str):
    """The only node reading ``value``, or None (also None when it is a graph output)."""
    return Uses(graph).sole_consumer(value)


def frozen(value: np.ndarray) -> np.ndarray:
    """``value`` as a read-only view of an immutable ``bytes`` copy: for constants a pass
    computes (folded weights), which nothing outside the graph holds. Kernels may then lay
    them out once at plan time, as they do for constants loaded from a file (:func:`is_frozen`,
    which the numba plugin's kernels ask)."""
    shape = np.shape(value)  # (np.ascontiguousarray makes a 0-d array 1-d)
    value = np.ascontiguousarray(value)
    return np.frombuffer(value.tobytes(), value.dtype).reshape(shape)


def owned(value):
    """``value`` as a constant the session owns: :func:`frozen` unless it is already frozen
    (or holds Python objects, which have no bytes to copy)."""
    if not isinstance(value, np.ndarray) or value.dtype.hasobject or is_frozen(value):
        return value
    return frozen(value)


def spec_of_array(arr) -> TensorSpec:
    return TensorSpec(tuple(arr.shape), DType.from_numpy(arr.dtype), small_value(arr))


def same_spec(node: Node, specs: dict, want: Sequence[TensorSpec | None]) -> bool:
    """Run ``node``'s shape rule on ``specs`` (value -> spec) and check that its outputs have the
    dtypes and shapes ``want`` (the specs of the values it replaces; ``None``: unknown, taken on
    trust only if the inputs are unknown too). Every rewrite calls this before it is kept."""
    op = OPS.get(node.op)
    if op is None:
        return False
    in_specs = []
    for i in node.inputs:
        if not i:
            in_specs.append(None)
            continue
        if i not in specs:
            return False
        in_specs.append(specs[i])
    if any(i and specs[i] is None for i in node.inputs):
        return all(w is None for w in want)
    try:
        got = op.infer(in_specs, node.attrs)
    except OneModelError:
        return False
    for g, w in zip(got, want):
        if w is None:
            continue
        if g.dtype != w.dtype or tuple(g.shape) != tuple(w.shape):
            return False
    return len(got) >= len(want)
