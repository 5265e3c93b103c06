"""The graph IR: named values with dtypes and (symbolic) shapes, nodes of the op set,
initializers and metadata. Nodes are kept in topological order; every value is assigned once."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from onemodel.tensors import DimExpr, DType, OneModelError, TensorSpec
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.base import UnknownValueError
from onemodel.tensors.ops.sequence import OptionalSpec, SequenceSpec, accepts_values
from onemodel.tensors.symbolic import Dim, format_shape

from .values import propagate


class GraphError(OneModelError):
    """A graph is malformed; the message names the offending node or value."""


VALUE_KINDS = ("tensor", "sequence", "optional", "optional_sequence")


@dataclass
class ValueInfo:
    """A graph input or output: name, dtype and shape (ints and symbols). ``kind`` says what
    the value is: a tensor, a sequence of tensors (``dtype`` and ``shape`` then describe its
    elements; a run passes a list), or an optional tensor or sequence (a run passes the value
    or None)."""

    name: str
    dtype: DType
    shape: tuple[Dim, ...]
    kind: str = "tensor"

    def spec(self):
        """What shape rules know of this value before a run."""
        tensor = TensorSpec(tuple(self.shape), self.dtype)
        if self.kind == "tensor":
            return tensor
        if self.kind == "sequence":
            return SequenceSpec(self.dtype, None)
        if self.kind == "optional":
            return OptionalSpec(tensor, None)
        if self.kind == "optional_sequence":
            return OptionalSpec(SequenceSpec(self.dtype, None), None)
        raise GraphError(f"value {self.name!r} has unknown kind {self.kind!r}; the kinds are "
                         + ", ".join(VALUE_KINDS))

    def __str__(self) -> str:
        text = f"{self.dtype.name}{format_shape(self.shape)}"
        if self.kind != "tensor":
            text = f"{self.kind}<{text}>"
        return f"{self.name}: {text}"


@dataclass
class Node:
    """One op application. ``inputs`` name values ('' for an omitted optional input)."""

    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""

    def label(self) -> str:
        return f"node {self.name or '?'} ({self.op})"


@dataclass(frozen=True)
class Guard:
    """A condition on symbolic sizes that a Python decision assumed while tracing (``batch > 2``):
    the graph is valid only where it holds. ``axis`` names the symbols, ``location`` the user's
    ``file:line``. The Session checks guards when it plans (:mod:`onemodel.runtime.guards`)."""

    condition: str
    axis: str
    location: str = "<unknown>"

    def __str__(self) -> str:
        return f"guard  {self.condition}  (axis {self.axis}, decided at {self.location})"


_ATTR_TYPES = (int, float, str, bool, DType, type(None))


class Graph:
    """A static computation graph."""

    def __init__(self, inputs: Sequence[ValueInfo] = (), outputs: Sequence[ValueInfo] = (),
                 nodes: Sequence[Node] = (), initializers: Mapping[str, np.ndarray] | None = None,
                 metadata: Mapping[str, str] | None = None, name: str = "graph"):
        self.name = name
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.nodes = list(nodes)
        self.initializers: dict[str, np.ndarray] = dict(initializers or {})
        self.metadata: dict[str, str] = dict(metadata or {})
        self.guards: list[Guard] = []  # conditions on symbolic sizes the graph is valid under

    def copy(self) -> Graph:
        g = Graph(copy.deepcopy(self.inputs), copy.deepcopy(self.outputs),
                  [Node(n.op, list(n.inputs), list(n.outputs), dict(n.attrs), n.name)
                   for n in self.nodes],
                  dict(self.initializers), dict(self.metadata), self.name)
        g.guards = list(self.guards)
        return g

    def subgraphs(self) -> list[Graph]:
        """The graphs held by this graph's nodes' attributes (If branches, Loop bodies), not
        those nested deeper."""
        out = []
        for n in self.nodes:
            for v in n.attrs.values():
                if isinstance(v, Graph):
                    out.append(v)
        return out

    def infer(self, in_specs: Sequence) -> list:
        """The specs of this graph's outputs when its inputs have ``in_specs`` (in order): how
        If, Loop and Scan learn what their subgraphs give. UnknownValueError when an output
        depends on values known only at run time; errors name the node."""
        if len(in_specs) != len(self.inputs):
            raise GraphError(f"graph {self.name!r} takes {len(self.inputs)} inputs, "
                             f"{len(in_specs)} given")
        specs: dict = {}
        for v, spec in zip(self.inputs, in_specs):
            specs[v.name] = spec
        for name, arr in self.initializers.items():
            specs[name] = TensorSpec(tuple(arr.shape), DType.from_numpy(arr.dtype),
                                     small_value(arr))
        for n in self.nodes:
            specs.update(self._check_node(n, specs, allow_unknown=True))
        out = []
        for v in self.outputs:
            if v.name not in specs:
                raise GraphError(f"graph {self.name!r}: output {v.name!r} is not computed by "
                                 "any node")
            if specs[v.name] is None:
                raise UnknownValueError(f"graph {self.name!r}: output {v.name!r} depends on "
                                        "values known only at run time")
            out.append(specs[v.name])
        return out

    # queries ---------------------------------------------------------------------------------
    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    out.setdefault(i, []).append(n)
        return out

    def needed(self, outputs) -> tuple[list[Node], set[str]]:
        """The nodes the values ``outputs`` depend on (in order), and every value they read."""
        needed = set(outputs)
        keep = []
        for n in reversed(self.nodes):
            if any(o in needed for o in n.outputs if o):
                keep.append(n)
                needed.update(i for i in n.inputs if i)
        keep.reverse()
        return keep, needed

    def symbols(self) -> set[str]:
        out: set[str] = set()
        for v in self.inputs:
            for d in v.shape:
                if isinstance(d, DimExpr):
                    out |= d.symbols()
        return out

    def value_inputs(self, specs: Mapping[str, TensorSpec | None] | None = None) -> set[str]:
        """Graph inputs whose *values* set shapes (they reach a static operand, such as a Reshape
        target): a plan is made per value of these, so no other input may be among them.

        The walk back from each static operand stops at a node whose output value its shape
        rule derives from the shapes of its inputs alone (``Shape``): such a node reads no
        values, so the input behind it joins no plan key. ``specs``: this graph's
        ``validate(allow_unknown=True)``, when the caller has it."""
        inputs = {v.name for v in self.inputs}
        producers = self.producers()
        wanted: list[str] = []
        for n in self.nodes:
            op = OPS.get(n.op)
            if op is None:
                continue
            for pos, name in enumerate(n.inputs):
                if name and pos < len(op.inputs) and op.inputs[pos] in op.static_inputs:
                    wanted.append(name)
        if not wanted:
            return set()
        if specs is None:
            specs = self._specs_or_none()
        found, seen = set(), set()
        while wanted:
            name = wanted.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in inputs:
                found.add(name)
            elif name in producers and not reads_shapes_only(producers[name], specs):
                wanted.extend(i for i in producers[name].inputs if i)
        return found

    def _specs_or_none(self) -> dict[str, TensorSpec | None]:
        try:
            return self.validate(allow_unknown=True)
        except OneModelError:
            return {}

    def fresh_name(self, base: str) -> str:
        taken = ({v.name for v in self.inputs} | set(self.initializers)
                 | {o for n in self.nodes for o in n.outputs})
        i = 0
        while f"{base}_{i}" in taken:
            i += 1
        return f"{base}_{i}"

    # checking --------------------------------------------------------------------------------
    def validate(self, *, allow_unknown: bool = False) -> dict[str, TensorSpec | None]:
        """Check structure and shapes; returns the spec of every value. Errors name the node.

        With ``allow_unknown``, a shape that depends on the value of a graph input (a Reshape
        target fed at run time) is left unknown (``None``) instead of being an error; the session
        plans such graphs once it sees that input's value."""
        specs: dict[str, TensorSpec] = {}
        for v in self.inputs:
            if v.name in specs:
                raise GraphError(f"input {v.name!r} is declared twice")
            specs[v.name] = v.spec()
        for name, arr in self.initializers.items():
            if name in specs:
                raise GraphError(f"{name!r} is both an input and an initializer")
            try:
                dt = DType.from_numpy(arr.dtype)
            except OneModelError:
                raise GraphError(f"initializer {name!r} has unsupported dtype {arr.dtype}") from None
            specs[name] = TensorSpec(tuple(arr.shape), dt, small_value(arr))
        for n in self.nodes:
            specs.update(self._check_node(n, specs, allow_unknown))
        for v in self.outputs:
            if v.name not in specs:
                raise GraphError(f"output {v.name!r} is not computed by any node")
        return specs

    def _check_node(self, n: Node, specs: dict, allow_unknown: bool = False) -> dict:
        op = OPS.get(n.op)
        if op is None:
            raise GraphError(f"{n.label()}: unknown op {n.op!r}")
        for k, v in n.attrs.items():
            if k not in op.attrs:
                raise GraphError(f"{n.label()}: {n.op} has no attribute {k!r}")
            if not _attr_ok(v):
                raise GraphError(f"{n.label()}: attribute {k!r} has unsupported type "
                                 f"{type(v).__name__}")
        if not op.variadic and len(n.inputs) > len(op.inputs):
            raise GraphError(f"{n.label()}: {len(n.inputs)} inputs, {n.op} takes at most "
                             f"{len(op.inputs)}")
        in_specs = []
        for _i, name in enumerate(n.inputs):
            if not name:
                in_specs.append(None)
                continue
            if name not in specs:
                raise GraphError(f"{n.label()}: input {name!r} is used before it is computed "
                                 "(nodes must be in topological order)")
            in_specs.append(specs[name])
        # required inputs by position (a variadic op needs its first variadic input)
        missing = [p for pos, p in enumerate(op.inputs) if p not in op.optional
                   and (pos >= len(n.inputs) or not n.inputs[pos])
                   and not (op.variadic and pos == len(op.inputs) - 1
                            and accepts_values(n.op))]  # Loop's carried values may be none
        if missing:
            raise GraphError(f"{n.label()}: missing required input {', '.join(missing)} of "
                             f"{n.op} (its inputs are {', '.join(op.inputs)})")
        present = [i for i in n.inputs if i]
        if not accepts_values(n.op) and n.op != "Identity":
            for name in present:
                if specs[name] is not None and not isinstance(specs[name], TensorSpec):
                    raise GraphError(f"{n.label()}: input {name!r} is {specs[name]}, not a "
                                     f"tensor; {n.op} takes tensors")
        if allow_unknown and any(specs[i] is None for i in present):
            return {o: None for o in n.outputs if o}
        try:
            outs = propagate(n.op, in_specs, n.attrs, op.infer(in_specs, n.attrs))
        except UnknownValueError as exc:
            if allow_unknown:
                return {o: None for o in n.outputs if o}
            raise GraphError(f"{n.label()}: {exc}") from None
        except OneModelError as exc:
            raise GraphError(f"{n.label()}: {exc}") from None
        if len(outs) < len([o for o in n.outputs if o]):
            raise GraphError(f"{n.label()}: {n.op} has {len(outs)} outputs, the node names "
                             f"{len(n.outputs)}")
        result = {}
        for name, spec in zip(n.outputs, outs):
            if not name:
                continue
            if name in specs or name in result:
                raise GraphError(f"{n.label()}: value {name!r} is assigned twice")
            result[name] = spec
        return result

    # text form -------------------------------------------------------------------------------
    def __str__(self) -> str:
        try:
            specs = self.validate(allow_unknown=True)
        except OneModelError:
            specs = {}
        lines = [f"graph {self.name} ("]
        lines += [f"  input  {v}" for v in self.inputs]
        lines.append(") -> (")
        lines += [f"  output {v}" for v in self.outputs]
        lines.append(")")
        for name, arr in self.initializers.items():
            lines.append(f"  init   {name}: {DType.from_numpy(arr.dtype).name}"
                         f"{format_shape(arr.shape)}")
        for n in self.nodes:
            outs = ", ".join(f"{o}: {specs[o]}" if specs.get(o) is not None else o
                             for o in n.outputs)
            attrs = ", ".join(f"{k}={_attr_text(v)}" for k, v in n.attrs.items())
            lines.append(f"  {outs} = {n.op}({', '.join(i or '_' for i in n.inputs)})"
                         + (f"  [{attrs}]" if attrs else ""))
        lines += [f"  {g}" for g in self.guards]
        return "\n".join(lines)


_PROBE = TensorSpec(tuple(DimExpr.symbol(f"probe{i}") for i in range(4)), DType.F32)


def reads_shapes_only(node: Node, specs: Mapping[str, TensorSpec | None]) -> bool:
    """Whether ``node``'s outputs depend on the shapes of its inputs only, never their values:
    its op's shape rule gives every output's value from input specs that carry no values."""
    op = OPS.get(node.op)
    if op is None or not node.inputs or not node.outputs:
        return False
    in_specs = []
    for name in node.inputs:
        spec = specs.get(name) if name else None
        if name and spec is None:  # its shape is not known before planning: probe any shape
            spec = _PROBE
        if spec is not None and not isinstance(spec, TensorSpec):
            return False  # a sequence or optional: its contents are values
        in_specs.append(None if spec is None else replace(spec, value=None))
    try:
        outs = op.infer(in_specs, node.attrs)
    except OneModelError:
        return False
    named = [o for o, name in zip(outs, node.outputs) if name]
    return len(outs) >= len([o for o in node.outputs if o]) and all(
        o.value is not None for o in named)


def _attr_ok(v) -> bool:
    if isinstance(v, (*_ATTR_TYPES, Graph, TensorSpec, SequenceSpec, OptionalSpec)):
        return True
    return isinstance(v, (tuple, list)) and all(isinstance(x, (int, float, str)) for x in v)


def _attr_text(v) -> str:
    if isinstance(v, DType):
        return v.name
    if isinstance(v, Graph):
        return f"<graph {v.name}: {len(v.inputs)} inputs, {len(v.nodes)} nodes>"
    if isinstance(v, (TensorSpec, SequenceSpec, OptionalSpec)):
        return str(v)
    return repr(tuple(v)) if isinstance(v, list) else repr(v)


def small_value(arr: np.ndarray):
    """The value of a small constant that shape rules may read (integers; integral floats)."""
    if arr.ndim > 1 or arr.size > 64 or arr.dtype.kind not in "iuf":
        return None
    flat = arr.reshape(-1)
    if arr.dtype.kind == "f" and not np.all(np.isfinite(flat) & (flat == np.round(flat))):
        return None
    return tuple(int(v) for v in flat)
