"""Plans: for one set of input shapes, everything the executor needs, decided once.

``make_plan`` binds the symbols, infers every shape, evaluates what is constant for these shapes
(Shape and the arithmetic on it, so symbolic Reshape targets become plain constants), picks a
kernel per node from the registry, and lays values out in numbered slots. Liveness analysis
releases each intermediate right after its last reader, so the allocator reuses its memory for
later values. The result is a flat list of steps.

What ``Plan.execute`` guarantees, whatever the kernels do: outputs are arrays the caller owns
(none shares memory with an input, a constant of the plan, or another output), and any error a
kernel raises ends as an :class:`ExecutionError` naming the node, its op and its input shapes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from operator import itemgetter
from typing import Any

import numpy as np

from onemodel.tensors import DimExpr, DType, OneModelError, TensorSpec, registry
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.base import UnknownValueError

from .graph import Graph, GraphError, small_value
from .guards import check_guards

DEVICE = "cpu"
_PLAN_CONST_MAX = 4096  # elements: what plan-time evaluation may produce


class ExecutionError(OneModelError):
    """A kernel failed while a plan ran; the message names the node, its op and input shapes,
    and the kernel's own exception is the ``__cause__``."""


@dataclass
class Step:
    call: Any  # kernel, or functools.partial of it with the node's attributes
    gather: Any  # itemgetter of the input slots
    single_input: bool
    multi: bool  # the kernel returns a tuple (an op with several outputs)
    outs: tuple[int, ...]
    release: tuple[int, ...]
    label: str
    ins: tuple[int, ...] = ()
    node: str = ""  # the node's name and op, for profiles
    op: str = ""


@dataclass
class Plan:
    template: list  # slot values before a run: None, initializers and plan-time constants
    inputs: list[tuple[str, int]]
    outputs: list[tuple[str, int]]  # (name, slot)
    steps: list[Step]
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    bindings: dict[str, int] = field(default_factory=dict)
    # memory this plan holds of its own (not the graph's initializers): the plan cache's byte
    # bound counts it, so anything a plan keeps across runs (buffers too) belongs in it
    nbytes: int = 0
    # ids of the memory a plan keeps across runs (the template's arrays; reused buffers belong
    # here too): an output on it is copied, so no caller ever holds the session's memory
    const_roots: frozenset[int] = frozenset()

    def _slots(self, arrays: Sequence[np.ndarray]) -> list:
        """The slot values a run starts from: the template with the feeds in place."""
        vals = self.template.copy()
        for (_, slot), arr in zip(self.inputs, arrays):
            vals[slot] = arr
        return vals

    def execute(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        vals = self._slots(arrays)
        step = None
        try:
            for step in self.steps:
                if step.single_input:
                    out = step.call(step.gather(vals))
                else:
                    out = step.call(*step.gather(vals))
                outs = step.outs
                if not step.multi:
                    vals[outs[0]] = out
                else:
                    for slot, value in zip(outs, out):
                        vals[slot] = value
                for slot in step.release:
                    vals[slot] = None
        except Exception as exc:  # any kernel error: name the node (costs nothing until raised)
            raise step_failure(step, vals, exc) from exc
        return self._owned([vals[s] for _, s in self.outputs], arrays)

    def execute_profiled(self, arrays: Sequence[np.ndarray], profiler) -> list[np.ndarray]:
        """``execute``, recording each step's time in ``profiler`` (profiling.Profiler)."""
        clock = profiler.now_us
        vals = self._slots(arrays)
        step = None
        try:
            for step in self.steps:
                start = clock()
                out = (step.call(step.gather(vals)) if step.single_input
                       else step.call(*step.gather(vals)))
                if not step.multi:
                    vals[step.outs[0]] = out
                else:
                    for slot, value in zip(step.outs, out):
                        vals[slot] = value
                profiler.record(step.node or step.op, "Node", start, clock() - start,
                                {"op": step.op, "output_shapes": [
                                    list(np.shape(vals[o])) for o in step.outs if o > 1]})
                for slot in step.release:
                    vals[slot] = None
        except Exception as exc:
            raise step_failure(step, vals, exc) from exc
        return self._owned([vals[s] for _, s in self.outputs], arrays)

    def _owned(self, results: list, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``results`` as arrays the caller owns: a result on the memory of an input, of a
        constant, or of an earlier result (a view, or the array itself) is copied."""
        consts = self.const_roots
        fed = None
        seen: set[int] = set()
        owned = []
        for value in results:
            if not isinstance(value, np.ndarray):
                value = np.array(value)  # a numpy scalar from a kernel: a new 0-d array
            if value.base is None:  # owns its memory: the common case, a kernel's new array
                root = value
                shared = any(value is a or value is a.base for a in arrays)
            else:
                root = memory_root(value)
                if fed is None:
                    fed = {id(memory_root(a)) for a in arrays}
                shared = root is None or id(root) in fed
            if shared or id(root) in consts or id(root) in seen:
                value = value.copy()
                root = value
            seen.add(id(root))
            owned.append(value)
        return owned


def memory_root(a: np.ndarray) -> np.ndarray | None:
    """The array that owns ``a``'s memory, or None when that is not a numpy array (a buffer,
    a memory map) and so cannot be told apart from others."""
    while a.base is not None:
        if not isinstance(a.base, np.ndarray):
            return None
        a = a.base
    return a


def step_failure(step: Step | None, vals: list, exc: Exception) -> OneModelError:
    """The error for a step whose kernel raised ``exc``."""
    if step is None:
        return ExecutionError(f"the plan failed before its first step: {exc}")
    shapes = ", ".join(_describe(vals[i]) for i in step.ins)
    reason = f"{type(exc).__name__}: {exc}" if not isinstance(exc, OneModelError) else str(exc)
    return ExecutionError(f"{step.label} failed: {reason} (inputs: {shapes or 'none'})")


def _describe(value) -> str:
    if value is None:
        return "None"
    try:
        dtype = DType.from_numpy(value.dtype).name
    except (OneModelError, AttributeError):
        dtype = str(getattr(value, "dtype", type(value).__name__))
    return f"{dtype}[{', '.join(str(d) for d in np.shape(value))}]"


def bind_symbols(graph: Graph, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """Symbol -> size from the inputs' shapes; errors name the input and the axis."""
    bindings: dict[str, int] = {}
    where: dict[str, str] = {}
    for v in graph.inputs:
        shape = shapes[v.name]
        if len(shape) != len(v.shape):
            raise OneModelError(
                f"input {v.name!r} has rank {len(shape)} (shape {list(shape)}); the graph expects "
                f"rank {len(v.shape)}: [{', '.join(str(d) for d in v.shape)}]"
            )
        for axis, (want, got) in enumerate(zip(v.shape, shape)):
            if isinstance(want, DimExpr):
                if want.kind != "sym":
                    continue  # checked below, once every symbol is bound
                name = want.args[0]
                if name in bindings and bindings[name] != got:
                    raise OneModelError(
                        f"input {v.name!r} axis {axis} is {got}, but symbol {name!r} is already "
                        f"{bindings[name]} from {where[name]}"
                    )
                bindings[name] = int(got)
                where[name] = f"input {v.name!r} axis {axis}"
            elif int(want) != got:
                raise OneModelError(
                    f"input {v.name!r} axis {axis} must be {want}, got {got} (shape {list(shape)})"
                )
    for v in graph.inputs:
        for axis, want in enumerate(v.shape):
            if not isinstance(want, DimExpr) or want.kind == "sym":
                continue
            if want.symbols() <= set(bindings) and want.evaluate(bindings) != shapes[v.name][axis]:
                raise OneModelError(
                    f"input {v.name!r} axis {axis} must be {want} = "
                    f"{want.evaluate(bindings)}, got {shapes[v.name][axis]}"
                )
    return bindings


def make_plan(graph: Graph, shapes: Mapping[str, tuple[int, ...]],
              wanted: Sequence[str], values: Mapping[str, np.ndarray] | None = None,
              symbolic: Mapping[str, TensorSpec | None] | None = None) -> Plan:
    """The plan for these input shapes; ``values`` holds the inputs whose values shapes depend
    on (``Graph.value_inputs``): they are constants of this plan. ``symbolic`` (the specs of
    ``graph.validate(allow_unknown=True)``) settles shapes that zero-size inputs leave open.

    A node whose outputs are all empty runs no kernel: its step makes empty arrays of the
    planned shapes (nothing to compute, and no kernel's zero-size corner case to meet)."""
    bindings = bind_symbols(graph, shapes)
    check_guards(graph, bindings)
    slot_of: dict[str, int] = {"": 0}  # slot 0: an omitted input; slot 1: unnamed outputs
    template: list = [None, None]

    def slot(name: str) -> int:
        if name not in slot_of:
            slot_of[name] = len(template)
            template.append(None)
        return slot_of[name]

    specs: dict[str, TensorSpec] = {}
    consts: dict[str, np.ndarray] = {}
    for v in graph.inputs:
        specs[v.name] = TensorSpec(tuple(shapes[v.name]), v.dtype)
        slot(v.name)
    for name, arr in list(graph.initializers.items()) + list((values or {}).items()):
        consts[name] = arr
        specs[name] = TensorSpec(arr.shape, DType.from_numpy(arr.dtype), small_value(arr))
        template[slot(name)] = arr

    nodes, _ = graph.needed(wanted)

    pending = []
    for n in nodes:
        op = OPS[n.op]
        in_specs = [specs[i] if i else None for i in n.inputs]
        try:
            out_specs = op.infer(in_specs, n.attrs)
        except OneModelError as exc:
            out_specs = _settled_by_symbols(n, in_specs, symbolic, bindings)
            # a rule that needs values its specs do not carry (a Range over float bounds
            # computed from Shape): every input is known now, so the kernel gives the outputs
            if out_specs is None and not (isinstance(exc, UnknownValueError)
                                          and _inputs_known(n, consts)):
                raise GraphError(f"{n.label()}: {exc} (at {_bound(bindings)})") from None
        for name, spec in zip(n.outputs, out_specs or ()):
            if name and any(int(d) < 0 for d in spec.shape):
                # name the node that made the absurd size, not the one that would meet it later
                raise GraphError(f"{n.label()}: its output {name!r} would have the negative shape "
                                 f"{list(spec.shape)} (inputs: {_specs_text(in_specs)}; at "
                                 f"{_bound(bindings)})")
            if name:
                specs[name] = spec
        if out_specs is None or _plan_time(n, consts, out_specs):
            args = [consts.get(i) if i else None for i in n.inputs]
            if n.op == "Shape":  # only the shape is read: a zero-strided view allocates nothing
                args = [_fake(specs[n.inputs[0]])]
            try:
                out = op.kernel(*args, **n.attrs)
            except Exception as exc:  # a constant the kernel cannot take: name the node
                raise GraphError(f"{n.label()}: evaluating it while planning failed: "
                                 f"{type(exc).__name__}: {exc} (at {_bound(bindings)})") from exc
            outs = out if isinstance(out, tuple) else (out,)
            for name, value in zip(n.outputs, outs):
                if name:
                    value = np.asarray(value)
                    consts[name] = value
                    specs[name] = TensorSpec(value.shape, DType.from_numpy(value.dtype),
                                             small_value(value))
                    template[slot(name)] = value
            continue
        pending.append((n, in_specs, out_specs))

    steps_src = []
    for n, in_specs, out_specs in pending:
        named = [spec for spec, name in zip(out_specs, n.outputs) if name]
        if named and all(_size(spec) == 0 for spec in named):
            steps_src.append((n, _empties(n, out_specs), (), tuple(slot(o) if o else 1
                                                                   for o in n.outputs)))
            continue
        kernel = _choose_kernel(n, in_specs)
        ins = tuple(slot(i) if i else 0 for i in n.inputs)
        outs = tuple(slot(o) if o else 1 for o in n.outputs)
        steps_src.append((n, kernel, ins, outs))

    # liveness: release a value after its last reader (never inputs' owners' arrays we keep:
    # constants stay in the template; graph outputs stay until the end)
    keep = {slot_of[w] for w in wanted} | {slot_of[c] for c in consts}
    last_use: dict[int, int] = {}
    for k, (_, _, ins, outs) in enumerate(steps_src):
        for s in ins + outs:
            last_use[s] = k
    release_at: dict[int, list[int]] = {}
    for s, k in last_use.items():
        if s > 1 and s not in keep:
            release_at.setdefault(k, []).append(s)

    steps = []
    for k, (n, kernel, ins, outs) in enumerate(steps_src):
        attrs = n.attrs if ins else None  # an empties step takes neither inputs nor attributes
        call = partial(kernel, **attrs) if attrs else kernel
        gather = itemgetter(*ins) if ins else (lambda vals: ())
        multi = len(OPS[n.op].outputs) > 1 or OPS[n.op].outputs[0].endswith("...")
        steps.append(Step(call, gather, len(ins) == 1, multi, outs,
                          tuple(release_at.get(k, ())), n.label(), ins, n.name, n.op))
    outputs = [(w, slot_of[w]) for w in wanted]
    own = sum(v.nbytes for k, v in consts.items() if k not in graph.initializers)
    roots = frozenset(id(r) for r in (memory_root(v) for v in template
                                      if isinstance(v, np.ndarray)) if r is not None)
    return Plan(template, [(v.name, slot_of[v.name]) for v in graph.inputs], outputs, steps,
                {k: tuple(int(d) for d in s.shape) for k, s in specs.items()}, bindings,
                own, roots)


def _size(spec: TensorSpec) -> int:
    return math.prod(int(d) for d in spec.shape)


def _empties(n, out_specs):
    """A step function making the node's (all empty) outputs."""
    layout = [(tuple(int(d) for d in s.shape), s.dtype.numpy) for s in out_specs]
    if len(OPS[n.op].outputs) > 1 or OPS[n.op].outputs[0].endswith("..."):
        return lambda: tuple(np.empty(shape, dt) for shape, dt in layout)
    shape, dt = layout[0]
    return lambda: np.empty(shape, dt)


def _settled_by_symbols(n, in_specs, symbolic, bindings) -> list[TensorSpec] | None:
    """Output specs for a node whose concrete shape rule fails on a zero-size input (a
    Reshape to ``[0, -1]`` leaves the -1 open), from the graph's symbolic shapes (``[batch,
    64]``) at these sizes; None when that does not settle them."""
    if symbolic is None or not any(s is not None and _size(s) == 0 for s in in_specs):
        return None
    out = []
    for name in n.outputs:
        spec = symbolic.get(name) if name else None
        if spec is None:
            return None
        try:
            dims = tuple(d.evaluate(bindings) if isinstance(d, DimExpr) else int(d)
                         for d in spec.shape)
        except (OneModelError, KeyError, ArithmeticError):
            return None
        out.append(TensorSpec(dims, spec.dtype))
    return out


def _plan_time(n, consts, out_specs) -> bool:
    """Evaluate a node while planning: Shape (its value is known once shapes are), and small
    results computed only from constants."""
    if n.op == "Shape":
        return True
    if not _inputs_known(n, consts):
        return False
    return all(int(np.prod(s.shape)) <= _PLAN_CONST_MAX for s in out_specs)


def _inputs_known(n, consts) -> bool:
    """Every input of a deterministic node is a constant of this plan."""
    if n.op == "Dropout" or not n.inputs:
        return False
    return all((not i) or i in consts for i in n.inputs)


def _choose_kernel(n, in_specs):
    fakes = [None if s is None else _fake(s) for s in in_specs]
    try:
        return registry.choose_kernel(n.op, DEVICE, fakes, n.attrs)
    except OneModelError as exc:
        raise GraphError(f"{n.label()}: {exc}") from None


def _fake(spec: TensorSpec) -> np.ndarray:
    """A zero-strided array with the spec's shape and dtype, for ``supports`` checks."""
    # broadcast_to, not as_strided: the array interface cannot name ml_dtypes' float8 types
    return np.broadcast_to(np.zeros((), spec.dtype.numpy), spec.shape)


def _specs_text(in_specs) -> str:
    return ", ".join("omitted" if s is None else f"{s.dtype.name}{list(s.shape)}"
                     for s in in_specs)


def _bound(bindings) -> str:
    return ", ".join(f"{k}={v}" for k, v in bindings.items()) or "static shapes"
