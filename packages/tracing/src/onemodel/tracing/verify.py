"""The structural check: two traces at different sizes of the symbolic axes must record the same
graph. Python lets an ``int`` subclass through ``range()``, ``len()``, ``int()`` and numpy without
asking it, so a loop or a branch on a size can slip past the guards; it then shows here as a node,
a constant or an attribute that differs between the two graphs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from onemodel.runtime import Graph


@dataclass
class Difference:
    """Where two traces part: ``index`` of the first differing node (or -1), a description, and
    the user's source line in each trace (``""`` when that trace has no such node)."""

    what: str
    first_location: str
    second_location: str
    constant: str = ""  # the constant whose values differ, when that is the difference


def first_difference(first: Graph, first_locs: Sequence[str], second: Graph,
                     second_locs: Sequence[str], params: set[str]) -> Difference | None:
    """The first structural difference between two traces of one function, or None. Constants
    named in ``params`` are not compared (parameters; constants that differ between two traces
    at the same sizes, drawn at random).

    Nodes are compared in order (op, inputs, attributes; not their output names, since a graph
    output takes over the name of the value it is); then the constants made during the trace
    (``params`` are the module's parameters, the same objects in both traces), which nodes
    compute the outputs, and the guards."""
    n1, n2 = first.nodes, second.nodes
    for i in range(max(len(n1), len(n2))):
        a = n1[i] if i < len(n1) else None
        b = n2[i] if i < len(n2) else None
        if a is not None and b is not None and (a.op, a.inputs, len(a.outputs), a.attrs) == (
                b.op, b.inputs, len(b.outputs), b.attrs):
            continue
        la = first_locs[i] if a is not None and i < len(first_locs) else ""
        lb = second_locs[i] if b is not None and i < len(second_locs) else ""
        return Difference(f"{_describe(a, la, 'first')}; {_describe(b, lb, 'second')}", la, lb)
    diff, name = _constants(first.initializers, second.initializers, params)
    if diff:
        users = [i for i, n in enumerate(n1) if name in n.inputs]
        where = first_locs[users[0]] if users and users[0] < len(first_locs) else ""
        if where:
            diff += f", read by node {n1[users[0]].name} made at {where}"
        same_shape = name in second.initializers and first.initializers.get(
            name, np.empty(0)).shape == second.initializers[name].shape
        return Difference(diff, where, "", name if same_shape else "")
    o1 = [(v.name, v.dtype, tuple(map(str, v.shape)), _producer(first, v.name))
          for v in first.outputs]
    o2 = [(v.name, v.dtype, tuple(map(str, v.shape)), _producer(second, v.name))
          for v in second.outputs]
    if o1 != o2:
        return Difference(f"the outputs differ: {_outs(first)} in the first, {_outs(second)} in "
                          "the second", "", "")
    g1 = [g.condition for g in first.guards]
    g2 = [g.condition for g in second.guards]
    if g1 != g2:
        return Difference(f"the guards differ: {g1} in the first, {g2} in the second",
                          first.guards[0].location if first.guards else "",
                          second.guards[0].location if second.guards else "")
    return None


def _describe(node, location: str, which: str) -> str:
    if node is None:
        return f"the {which} has no node there"
    where = f" made at {location}" if location else ""
    return (f"the {which} has node {node.name}: {', '.join(node.outputs)} = {node.op}("
            f"{', '.join(node.inputs)}){where}")


def unstable_constants(first: Graph, again: Graph, params: set[str]) -> set[str]:
    """Constants whose values differ between two traces at the same sizes (random draws)."""
    return {n for n, a in first.initializers.items()
            if n not in params and n in again.initializers and a.shape ==
            again.initializers[n].shape and not np.array_equal(a, again.initializers[n],
                                                               equal_nan=a.dtype.kind in "fc")}


def _constants(c1: Mapping[str, np.ndarray], c2: Mapping[str, np.ndarray],
               params: set[str]) -> tuple[str, str]:
    """A description of the first constant that differs, and its name."""
    if list(c1) != list(c2):
        extra = sorted(set(c1) ^ set(c2))
        return f"the constants differ ({', '.join(extra) or 'order'})", (extra or [""])[0]
    for name, a in c1.items():
        if name in params:
            continue
        b = c2[name]
        if a.shape != b.shape or a.dtype != b.dtype:
            return (f"constant {name} has shape {list(a.shape)} in the first and "
                    f"{list(b.shape)} in the second (a tensor made with a size that was frozen)",
                    name)
        if not np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"):
            return (f"constant {name} holds different values in the two traces (computed from "
                    "a size)", name)
    return "", ""


def _producer(g: Graph, name: str) -> int:
    return next((i for i, n in enumerate(g.nodes) if name in n.outputs), -1)


def _outs(g: Graph) -> str:
    return ", ".join(str(v) for v in g.outputs)
