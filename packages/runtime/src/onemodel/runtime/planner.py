"""Plans: for one set of input shapes, everything the executor needs, decided once.

``make_plan`` binds the symbols, infers every shape, evaluates what is constant for these shapes
(Shape and the arithmetic on it, so symbolic Reshape targets become plain constants), picks a
kernel per node from the registry, and lays values out in numbered slots. Liveness analysis
releases each intermediate right after its last reader, so the allocator reuses its memory for
later values. Steps whose kernel writes ``out=`` get planned output buffers, reused from run to
run once the value held there is dead (buffers.py). The result is a flat list of steps.

What ``Plan.execute`` guarantees, whatever the kernels do: outputs are arrays the caller owns
(none shares memory with an input, a constant of the plan, a planned buffer, or another output),
and any error a kernel raises ends as an :class:`ExecutionError` naming the node, its op and its
input shapes.

Data-dependent sizes: a node whose output sizes the shape rules cannot give from these input
shapes (NonZero, Unique, NonMaxSuppression, a Loop's stacked outputs, a Reshape to a target
computed from data, an If whose branches differ) ends the plan's static part. Its kernel runs as
a normal step; the nodes after it form a :class:`Continuation`, planned when a run reaches it,
from the sizes the run produced, and cached by those sizes. So the plan (and the session's plan
cache) does not change with input values; only the part after such a node is re-planned, and
only for sizes it has not met.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from operator import itemgetter
from typing import Any

import numpy as np

from onemodel.tensors import DimExpr, DType, OneModelError, TensorSpec, registry
from onemodel.tensors import threads as _threads
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.base import UnknownValueError
from onemodel.tensors.ops.sequence import OptionalSpec, SequenceSpec, accepts_values, spec_of_value
from onemodel.tensors.ops.specialize import CallSite, specialize

from . import buffers as _buffers
from .buffers import BufferPool, BufferSet
from .codegen import compile_steps
from .graph import Graph, GraphError, ValueInfo, small_value
from .guards import check_guards

DEVICE = "cpu"
_PLAN_CONST_MAX = 4096  # elements: what plan-time evaluation may produce
_NBYTES_LOCK = threading.Lock()  # a plan's nbytes grows when runs add buffer sets or plans


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
    buf: int = -1  # the planned buffer its kernel writes (``out=``), or -1: it allocates
    # the node's attributes: ``call`` may be a specialized kernel that no longer carries them,
    # and a device placement (placement.py) hands them to the device's kernel
    attrs: dict | None = None
    # the op is declared ``new_outputs``: an output that comes back as a view is copied
    new_outputs: bool = False
    # each output's (shape, dtype) where the plan knows them (a nonempty tensor; else None),
    # or None: what a direct call without a planned buffer allocates (codegen.py)
    out_specs: tuple | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        if "out_specs" in self.__dict__:  # a step already made (its last field set): recompile
            global _STEP_EDITS
            _STEP_EDITS += 1
        object.__setattr__(self, name, value)


# changes made to steps after they were made (a profiler or a test wrapping a kernel): a
# compiled plan (codegen.py) older than the last one compiles its steps again
_STEP_EDITS = 0
_COMPILED_FROM = ("steps", "template", "inputs", "outputs")


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
    # the planned output buffers (buffers.py), or None. Not a dataclass field: a plan placed on
    # another device (placement.place copies the fields) runs without them
    _pool = None
    _code = None  # the steps compiled to one function (codegen.py), made at the first run

    @property
    def buffer_pool(self) -> BufferPool | None:
        """The pool of this plan's planned output buffers (None: every step allocates)."""
        return self._pool

    def _slots(self, arrays: Sequence[np.ndarray]) -> list:
        """The slot values a run starts from: the template with the feeds in place."""
        vals = self.template.copy()
        for (_, slot), arr in zip(self.inputs, arrays):
            vals[slot] = arr
        return vals

    def execute(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self._with_buffers(self._execute, arrays)

    def execute_profiled(self, arrays: Sequence[np.ndarray], profiler) -> list[np.ndarray]:
        """``execute``, recording each step's time in ``profiler`` (profiling.Profiler)."""
        return self._with_buffers(self._execute_profiled, arrays, profiler)

    def _with_buffers(self, run, arrays, *args) -> list[np.ndarray]:
        """``run(arrays, *args, bufs)`` with a buffer set checked out of the plan's pool for
        the run and given back at the end, also when a kernel fails (``bufs`` is None for a
        plan without planned buffers)."""
        pool = self._pool
        if pool is None:
            return run(arrays, *args, None)
        bufs, grew = pool.checkout()
        if grew:  # a set the pool newly keeps adds to nbytes (the first is counted from the start)
            with _NBYTES_LOCK:
                self.nbytes += pool.set_nbytes
        try:
            return run(arrays, *args, bufs)
        finally:
            pool.checkin(bufs)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _COMPILED_FROM:
            object.__setattr__(self, "_code", None)
            self.__dict__.pop("_codes", None)
        object.__setattr__(self, name, value)

    def _execute(self, arrays: Sequence[np.ndarray], bufs: BufferSet | None) -> list[np.ndarray]:
        code = self._code
        if code is None or code.edits != _STEP_EDITS or code.threads != _threads.generation:
            code = self._compiled()
        try:
            results = code.run(arrays, bufs.views if bufs is not None else ())
        except Exception as exc:  # any kernel error: name the node (costs nothing until raised)
            failed = code.failed_step(exc.__traceback__)
            if failed is None:
                raise step_failure(None, {}, exc) from exc
            step, values = self.steps[failed[0]], failed[1]
            raise step_failure(step, {i: values.get(i) for i in step.ins}, exc) from exc
        return self._owned(results, arrays, bufs.roots if bufs is not None else frozenset())

    def _compiled(self):
        """The steps compiled (codegen.py) for the current thread setting: at the first run,
        after a step edit, and at the first run under another thread count, since a kernel's
        direct form may hold only for one thread. Kept per thread count, so sessions of two
        settings taking turns do not compile at each run."""
        n = _threads.num_threads()
        codes = self.__dict__.setdefault("_codes", {})
        code = codes.get(n)
        if code is None or code.edits != _STEP_EDITS:
            pool = self._pool
            code = compile_steps(self.steps, [s for _, s in self.inputs],
                                 [s for _, s in self.outputs], self.template,
                                 [(b.shape, b.dtype) for b in pool.layout.slots]
                                 if pool is not None else ())
            code.edits = _STEP_EDITS
            codes[n] = code
        code.threads = _threads.generation
        self._code = code
        return code

    def _execute_profiled(self, arrays, profiler, bufs: BufferSet | None) -> list[np.ndarray]:
        clock = profiler.now_us
        views = bufs.views if bufs is not None else ()
        vals = self._slots(arrays)
        step = None
        try:
            for step in self.steps:
                start = clock()
                if step.buf < 0:
                    out = (step.call(step.gather(vals)) if step.single_input
                           else step.call(*step.gather(vals)))
                else:
                    buf = views[step.buf]
                    out = (step.call(step.gather(vals), out=buf) if step.single_input
                           else step.call(*step.gather(vals), out=buf))
                    if out is not buf:  # a kernel that broke the out= contract
                        out = _buffers.into(out, buf, step.call)
                if step.new_outputs:  # a view would break the buffer plan's promise
                    out = _buffers.new_arrays(out, step.multi)
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
        return self._owned([vals[s] for _, s in self.outputs], arrays,
                           bufs.roots if bufs is not None else frozenset())

    def _owned(self, results: list, arrays: Sequence[np.ndarray],
               buffers: frozenset[int] = frozenset()) -> list[np.ndarray]:
        """``results`` as arrays the caller owns: a result on the memory of an input, of a
        constant, of a planned buffer (``buffers``: the ids of this run's arenas), or of an
        earlier result (a view, or the array itself) is copied."""
        consts = self.const_roots
        fed = None
        seen: set[int] = set()
        owned = []
        for value in results:
            if value is None:  # an empty optional
                owned.append(None)
                continue
            if isinstance(value, list):  # a sequence: its tensors, each owned
                owned.append([np.array(v, copy=True) for v in value])
                continue
            if not isinstance(value, np.ndarray):
                value = np.array(value)  # a numpy scalar from a kernel: a new 0-d array
            if value.base is None:  # owns its memory: the common case, a kernel's new array
                root = value
                shared = any(value is a or value is a.base for a in arrays
                             if isinstance(a, np.ndarray))
            else:
                root = memory_root(value)
                if fed is None:
                    fed = {id(memory_root(a)) for a in arrays if isinstance(a, np.ndarray)}
                shared = root is None or id(root) in fed
            if shared or id(root) in consts or id(root) in seen or id(root) in buffers:
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


def step_failure(step: Step | None, vals, exc: Exception) -> OneModelError:
    """The error for a step whose kernel raised ``exc``; ``vals[slot]`` are the values it
    was given (a list of slots, or slot -> value)."""
    if step is None:
        return ExecutionError(f"the plan failed before its first step: {exc}")
    shapes = ", ".join(_describe(vals[i]) for i in step.ins)
    reason = f"{type(exc).__name__}: {exc}" if not isinstance(exc, OneModelError) else str(exc)
    return ExecutionError(f"{step.label} failed: {reason} (inputs: {shapes or 'none'})")


def _describe(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, list):
        return f"sequence of {len(value)} [{', '.join(_describe(v) for v in value[:4])}" + \
            (", ...]" if len(value) > 4 else "]")
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
        if v.kind != "tensor":
            continue  # a sequence or optional: its elements' sizes bind no symbol
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
        if v.kind != "tensor":
            continue
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
              symbolic: Mapping[str, TensorSpec | None] | None = None,
              buffers: bool | None = None) -> Plan:
    """The plan for these input shapes; ``values`` holds the inputs whose values shapes depend
    on (``Graph.value_inputs``): they are constants of this plan. ``symbolic`` (the specs of
    ``graph.validate(allow_unknown=True)``) settles shapes that zero-size inputs leave open.

    A node whose outputs are all empty runs no kernel: its step makes empty arrays of the
    planned shapes (nothing to compute, and no kernel's zero-size corner case to meet).

    Inputs that are sequences or optionals (``ValueInfo.kind``) give their spec in ``shapes``
    (``spec_of_value`` of the value fed). Nodes after one whose output sizes depend on data go
    to a :class:`Continuation` (see the module's docstring).

    ``buffers``: whether steps whose kernel writes ``out=`` get output buffers reused from run
    to run (see buffers.py); None reads ``ONEMODEL_PLANNED_BUFFERS`` (default on)."""
    buffers = _buffers.enabled(buffers)
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
        if v.kind == "tensor":
            specs[v.name] = TensorSpec(tuple(shapes[v.name]), v.dtype)
        else:
            specs[v.name] = shapes[v.name]
        slot(v.name)
    for name, arr in list(graph.initializers.items()) + list((values or {}).items()):
        consts[name] = arr
        specs[name] = TensorSpec(arr.shape, DType.from_numpy(arr.dtype), small_value(arr))
        template[slot(name)] = arr

    nodes, _ = graph.needed(wanted)

    pending = []
    rest: list = []  # the nodes after a node whose output sizes depend on data
    for idx, n in enumerate(nodes):
        op = OPS[n.op]
        in_specs = [specs[i] if i else None for i in n.inputs]
        dynamic = False
        try:
            out_specs = op.infer(in_specs, n.attrs)
        except OneModelError as exc:
            out_specs = _settled_by_symbols(n, in_specs, symbolic, bindings)
            # a rule that needs values its specs do not carry (a Range over float bounds
            # computed from Shape): every input is known now, so the kernel gives the outputs;
            # when some input is computed at run time, the node's outputs decide what follows
            if out_specs is None and isinstance(exc, UnknownValueError):
                dynamic = not _inputs_known(n, consts) or accepts_values(n.op)
            elif out_specs is None:
                raise GraphError(f"{n.label()}: {exc} (at {_bound(bindings)})") from None
        if out_specs is not None and _unbound(out_specs):
            dynamic = True
            if _inputs_known(n, consts) and all(isinstance(o, TensorSpec) for o in out_specs):
                out_specs = None  # computed from constants: evaluate it now, sizes and all
                dynamic = False
        if dynamic:
            pending.append((n, in_specs, None))
            rest = nodes[idx + 1:]
            break
        for name, spec in zip(n.outputs, out_specs or ()):
            if name and isinstance(spec, TensorSpec) and any(int(d) < 0 for d in spec.shape):
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
    sites: dict[int, tuple] = {}  # step -> its specs, where every shape is known (specialize)
    candidates: dict[int, tuple[tuple[int, ...], np.dtype]] = {}  # step -> its out= buffer
    for n, in_specs, out_specs in pending:
        named = [spec for spec, name in zip(out_specs or (), n.outputs) if name]
        if named and all(isinstance(spec, TensorSpec) and _size(spec) == 0 for spec in named):
            steps_src.append((n, _empties(n, out_specs), (), tuple(slot(o) if o else 1
                                                                   for o in n.outputs)))
            continue
        kernel, writes_out = _choose_kernel(n, in_specs)
        if out_specs is not None and _concrete(in_specs) and _concrete(out_specs):
            sites[len(steps_src)] = (in_specs, out_specs)
        ins = tuple(slot(i) if i else 0 for i in n.inputs)
        outs = tuple(slot(o) if o else 1 for o in n.outputs)
        if buffers and writes_out and _bufferable(n, out_specs):
            spec = out_specs[0]
            candidates[len(steps_src)] = (tuple(int(d) for d in spec.shape),
                                          np.dtype(spec.dtype.numpy))
        steps_src.append((n, kernel, ins, outs))
    if rest:
        cont = Continuation(pending[-1][0], rest, graph, specs, consts, wanted, buffers)
        ins = tuple(slot(name) for name in cont.live)
        outs = tuple(slot(name) for name in cont.wanted)
        steps_src.append((cont, cont, ins, outs))

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

    layout = None
    if candidates:
        io = [(ins, outs, isinstance(n, Continuation) or OPS[n.op].new_outputs)
              for n, _, ins, outs in steps_src]
        layout = _buffers.assign(io, candidates, {slot_of[w] for w in wanted})
    buf_of = {s.step: i for i, s in enumerate(layout.slots)} if layout is not None else {}

    steps = []
    for k, (n, kernel, ins, outs) in enumerate(steps_src):
        if isinstance(n, Continuation):
            steps.append(Step(kernel, itemgetter(*ins) if ins else (lambda vals: ()),
                              len(ins) == 1, True, outs, tuple(release_at.get(k, ())),
                              n.label(), ins, n.name, n.op))
            continue
        attrs = n.attrs if ins else None  # an empties step takes neither inputs nor attributes
        call = partial(kernel, **attrs) if attrs else kernel
        if ins and k in sites:
            call = _specialized(kernel, _call_site(sites[k], n, consts, call), n) or call
        if layout is not None and k in layout.escaping:
            call = _buffers.fresh_out(call, *candidates[k])
        gather = itemgetter(*ins) if ins else (lambda vals: ())
        multi = len(OPS[n.op].outputs) > 1 or OPS[n.op].outputs[0].endswith("...")
        steps.append(Step(call, gather, len(ins) == 1, multi, outs,
                          tuple(release_at.get(k, ())), n.label(), ins, n.name, n.op,
                          buf_of.get(k, -1), attrs, OPS[n.op].new_outputs,
                          _output_specs(sites.get(k))))
    outputs = [(w, slot_of[w]) for w in wanted]
    own = sum(v.nbytes for k, v in consts.items() if k not in graph.initializers)
    if layout is not None:
        own += layout.nbytes  # the first buffer set, made at the first run
    roots = frozenset(id(r) for r in (memory_root(v) for v in template
                                      if isinstance(v, np.ndarray)) if r is not None)
    plan = Plan(template, [(v.name, slot_of[v.name]) for v in graph.inputs], outputs, steps,
                {k: tuple(int(d) for d in s.shape) for k, s in specs.items()
                 if isinstance(s, TensorSpec)}, bindings,
                own, roots)
    if layout is not None:
        plan._pool = BufferPool(layout)
    if rest:
        cont.owner = weakref.ref(plan)  # its plans' bytes count as this plan's
    return plan


def _output_specs(site_specs) -> tuple | None:
    """Each output's (shape, dtype) from a step's site specs (where every shape is known), or
    None for an output that is not a nonempty tensor; None without a site."""
    if site_specs is None or not site_specs[1]:
        return None
    return tuple((tuple(int(d) for d in spec.shape), np.dtype(spec.dtype.numpy))
                 if isinstance(spec, TensorSpec) and _size(spec) > 0 else None
                 for spec in site_specs[1])


def _bufferable(n, out_specs) -> bool:
    """Whether a node's output can go to a planned buffer: one named tensor output, of known
    nonzero size, of an op with one output."""
    if len(n.outputs) != 1 or not n.outputs[0] or not out_specs or len(out_specs) != 1:
        return False
    op = OPS[n.op]
    if len(op.outputs) != 1 or op.outputs[0].endswith("..."):
        return False
    spec = out_specs[0]
    return isinstance(spec, TensorSpec) and _size(spec) > 0 and \
        all(not isinstance(d, DimExpr) for d in spec.shape)


def _specialized(kernel, site: CallSite, n):
    """``specialize(kernel, site)``; a specializer that raises names the node and the kernel
    (a plugin's bug must not surface as a bare numpy error from Session.run)."""
    try:
        return specialize(kernel, site)
    except Exception as exc:
        name = getattr(kernel, "__qualname__", repr(kernel))
        raise GraphError(f"{n.label()}: specializing kernel {name} for inputs "
                         f"{', '.join(str(list(s)) for s in site.shapes if s is not None)} "
                         f"failed: {type(exc).__name__}: {exc}") from exc


def _concrete(specs) -> bool:
    """Every spec is an omitted input or a tensor of known sizes."""
    return all(s is None or (isinstance(s, TensorSpec) and
                             all(not isinstance(d, DimExpr) for d in s.shape)) for s in specs)


def _call_site(specs, n, consts, generic) -> CallSite:
    """What ``specialize`` is told about node ``n``: its specs, its constant inputs (an output
    the node does not name has no shape: nobody reads it)."""
    in_specs, out_specs = specs
    return CallSite(
        tuple(None if s is None else tuple(int(d) for d in s.shape) for s in in_specs),
        tuple(None if s is None else np.dtype(s.dtype.numpy) for s in in_specs),
        tuple(consts.get(i) if i else None for i in n.inputs),
        dict(n.attrs), tuple(None if s is None or k >= len(n.outputs) or not n.outputs[k]
                             else tuple(int(d) for d in s.shape)
                             for k, s in enumerate(out_specs)), generic)


def _unbound(out_specs) -> bool:
    """Whether some output's size is a symbol no input binds (a size decided by data)."""
    return any(isinstance(s, TensorSpec) and any(isinstance(d, DimExpr) for d in s.shape)
               for s in out_specs if s is not None)


class Continuation:
    """The nodes after a node whose output sizes depend on data, planned at run time.

    Called with the values live at that point (in the order of ``live``), it finds or makes the
    plan for their sizes (and for the values among them that set shapes further on), runs it,
    and returns the ``wanted`` outputs. Plans are kept per signature, least recently used out
    first (``MAX_PLANS``); ``info()`` counts hits and builds."""

    MAX_PLANS = 16

    def __init__(self, after, nodes, graph: Graph, specs, consts, wanted,
                 buffers: bool | None = None):
        self.buffers = buffers
        self.name = after.name
        self.op = after.op
        self.after = after.label()
        self.nodes = list(nodes)
        defined = set(specs) | {o for o in after.outputs if o}
        read = {i for n in self.nodes for i in n.inputs if i}
        made_later = {o for n in self.nodes for o in n.outputs if o}
        self.wanted = [w for w in wanted if w in made_later]
        need = (read | set(self.wanted)) - made_later
        self.consts = {k: v for k, v in consts.items() if k in need}
        self.live = [k for k in _ordered(graph, nodes, after, specs)
                     if k in need and k in defined and k not in self.consts]
        self._plans: OrderedDict = OrderedDict()
        self._value_inputs: list[int] | None = None
        self._lock = threading.Lock()
        self.hits = self.builds = 0
        self.owner = None  # weakref to the plan this continues: its nbytes counts these plans

    def label(self) -> str:
        return f"the nodes after {self.after}"

    def _graph(self, values) -> Graph:
        inputs = []
        for name, v in zip(self.live, values):
            spec = spec_of_value(v) if v is not None else None
            if isinstance(spec, TensorSpec):
                inputs.append(ValueInfo(name, spec.dtype, spec.shape))
            elif isinstance(spec, SequenceSpec):
                inputs.append(ValueInfo(name, spec.dtype or DType.F32, (), "sequence"))
            else:  # an empty optional
                inputs.append(ValueInfo(name, DType.F32, (), "optional"))
        outputs = [ValueInfo(w, DType.F32, ()) for w in self.wanted]
        return Graph(inputs, outputs, self.nodes, dict(self.consts))

    def __call__(self, *values):
        if self._value_inputs is None:
            self._value_inputs = self._find_value_inputs(values)
        key = tuple(_signature(v) for v in values)
        if self._value_inputs:
            key += tuple(np.ascontiguousarray(values[i]).tobytes() for i in self._value_inputs)
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                self.hits += 1
        if plan is None:
            g = self._graph(values)
            shapes = {v.name: (np.shape(x) if v.kind == "tensor" else _input_spec(v, x))
                      for v, x in zip(g.inputs, values)}
            fixed = {self.live[i]: np.array(values[i], copy=True) for i in self._value_inputs}
            g.inputs = [v for v in g.inputs if v.name not in fixed]
            plan = make_plan(g, shapes, self.wanted, fixed, buffers=self.buffers)
            with self._lock:
                self.builds += 1
                old = self._plans.get(key)
                self._plans[key] = plan
                delta = plan.nbytes - (old.nbytes if old is not None else 0)
                while len(self._plans) > self.MAX_PLANS:
                    delta -= self._plans.popitem(last=False)[1].nbytes
                owner = self.owner() if self.owner is not None else None
                if owner is not None:  # the session's plan cache re-reads it at its next hit
                    with _NBYTES_LOCK:
                        owner.nbytes += delta
        fed = [x for i, x in enumerate(values) if i not in (self._value_inputs or ())]
        out = plan.execute(fed)
        return tuple(out)

    def _find_value_inputs(self, values) -> list[int]:
        try:
            found = self._graph(values).value_inputs()
        except OneModelError:
            found = set()
        return [i for i, name in enumerate(self.live) if name in found]

    def info(self) -> dict[str, int]:
        return {"hits": self.hits, "builds": self.builds, "plans": len(self._plans)}


def _ordered(graph: Graph, nodes, after, specs) -> list[str]:
    """The names defined before the continuation, in a stable order."""
    return list(specs) + [o for o in after.outputs if o and o not in specs]


def _input_spec(v: ValueInfo, value):
    spec = spec_of_value(value)
    if v.kind.startswith("optional"):
        return OptionalSpec(spec, value is not None)
    return spec


def _signature(value):
    """What a plan depends on in a value: its shape and dtype (each element's, in a sequence)."""
    if isinstance(value, np.ndarray):
        return value.shape, value.dtype.char
    if value is None:
        return None
    if isinstance(value, list):
        return ("seq", tuple(_signature(v) for v in value))
    arr = np.asarray(value)
    return arr.shape, arr.dtype.char


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
    if symbolic is None or not any(isinstance(s, TensorSpec) and _size(s) == 0
                                   for s in in_specs):
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
    return all(isinstance(s, TensorSpec) and int(np.prod(s.shape)) <= _PLAN_CONST_MAX
               for s in out_specs)


def _inputs_known(n, consts) -> bool:
    """Every input of a deterministic node is a constant of this plan."""
    if n.op == "Dropout" or not n.inputs:
        return False
    return all((not i) or i in consts for i in n.inputs)


def _choose_kernel(n, in_specs) -> tuple[Any, bool]:
    """The node's kernel (registry.choose_kernel_record, the one place kernels are chosen) and
    whether it writes ``out=``."""
    if accepts_values(n.op):  # sequences, optionals, subgraphs: the op's own kernel only
        return OPS[n.op].kernel, False
    if any(s is not None and not isinstance(s, TensorSpec) for s in in_specs):
        if n.op == "Identity":
            return _identity_value, False
        raise GraphError(f"{n.label()}: {n.op} takes tensors, not sequences or optionals")
    fakes = [None if s is None else _fake(s) for s in in_specs]
    try:
        rec = registry.choose_kernel_record(n.op, DEVICE, fakes, n.attrs)
    except OneModelError as exc:
        raise GraphError(f"{n.label()}: {exc}") from None
    return rec.function(), rec.writes_out


def _identity_value(value):
    """Identity of a sequence (a new list of copies) or of an optional (None when empty)."""
    if value is None:
        return None
    if isinstance(value, list):
        return [np.array(v, copy=True) for v in value]
    return np.array(value, copy=True)


def _fake(spec: TensorSpec) -> np.ndarray:
    """A zero-strided array with the spec's shape and dtype, for ``supports`` checks; a small
    constant whose value the plan knows (a Reduce's axes) is that value, read-only."""
    if spec.value is not None and all(type(v) is int for v in spec.value):
        known = np.array(spec.value, spec.dtype.numpy).reshape(spec.shape)
        known.flags.writeable = False
        return known
    # broadcast_to, not as_strided: the array interface cannot name ml_dtypes' float8 types
    return np.broadcast_to(np.zeros((), spec.dtype.numpy), spec.shape)


def _specs_text(in_specs) -> str:
    return ", ".join("omitted" if s is None else f"{s.dtype.name}{list(s.shape)}"
                     for s in in_specs)


def _bound(bindings) -> str:
    return ", ".join(f"{k}={v}" for k, v in bindings.items()) or "static shapes"


from . import controlflow  # noqa: E402,F401 - installs the subgraph executor (needs make_plan)
