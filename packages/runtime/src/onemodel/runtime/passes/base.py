"""What a pass is, and the manager that runs passes to a fixpoint.

A pass says in ``changes`` what it rewrites and returns from ``run`` whether it modified the
graph. Passes come from the registry (``onemodel_register_passes``), the built-in ones included.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..graph import Graph


class Pass:
    """Base class of optimization passes. Subclasses set ``name`` and ``changes``."""

    name = "pass"
    changes = ""

    def run(self, graph: Graph) -> bool:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.changes}>"


class PassManager:
    """Run passes in order, again and again, until a whole round changes nothing."""

    def __init__(self, passes: Sequence[Pass], max_rounds: int = 20):
        self.passes = list(passes)
        self.max_rounds = max_rounds

    def run(self, graph: Graph) -> dict[str, int]:
        """Optimize ``graph`` in place; returns how many times each pass changed it."""
        counts = {p.name: 0 for p in self.passes}
        for _ in range(self.max_rounds):
            changed = False
            for p in self.passes:
                if p.run(graph):
                    counts[p.name] += 1
                    changed = True
            if not changed:
                break
        graph.validate(allow_unknown=True)
        return counts


def replace_uses(graph: Graph, old: str, new: str) -> None:
    """Make every consumer of value ``old`` read ``new`` instead."""
    for n in graph.nodes:
        n.inputs = [new if i == old else i for i in n.inputs]


def output_names(graph: Graph) -> set[str]:
    return {v.name for v in graph.outputs}


def sole_consumer(graph: Graph, value: str):
    """The only node reading ``value``, or None (also None when it is a graph output)."""
    if value in output_names(graph):
        return None
    users = [n for n in graph.nodes if value in n.inputs]
    return users[0] if len(users) == 1 else None
