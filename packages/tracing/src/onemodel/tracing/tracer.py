"""The Tracer: run a module or function once on traced inputs and record a static graph.

Every op whose inputs include a traced tensor becomes a node (its output shapes come from the
op's shape rule, on symbolic dims); constants it reads become initializers holding copies of their
values now. Ops on constants alone run eagerly. Python control flow runs once and is unrolled.

Python decisions on symbolic sizes are never frozen silently: a comparison used as a bool becomes
a guard on the graph or a TraceError (:mod:`.decisions`), and what Python does not let the tracer
see (``range(x.shape[1])``, ``len()``, ``int()``) is caught by tracing a second time with other
sizes and comparing the two graphs (:mod:`.verify`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence

import numpy as np

import onemodel.tensors.trace_state as trace_state
from onemodel.runtime import Graph, Node, ValueInfo
from onemodel.runtime.graph import Guard
from onemodel.runtime.guards import failed_guard
from onemodel.runtime.values import propagate
from onemodel.tensors import DimExpr, DType, OneModelError, Tensor, TensorSpec, autograd
from onemodel.tensors.ops import OPS
from onemodel.tensors.symbolic import Dim, SymBool, SymInt, as_dim, evaluate, internal_file

from .decisions import Verdict, classify
from .errors import TraceError, TraceWarning, user_location
from .traced import TracedData, TracedTensor
from .verify import Difference, first_difference, unstable_constants


class Tracer:
    """Trace ``target`` (a Module or a function of Tensors)::

        traced = Tracer(model).trace({"x": example}, axes={"x": ("batch", None)})
    """

    def __init__(self, target: Callable):
        self.target = target
        self._reset()

    def _reset(self) -> None:
        self.graph = Graph(name=getattr(type(self.target), "__name__", "graph"))
        self._examples: dict[str, int] = {}  # symbol -> example size
        self._sources: dict[str, tuple[str, int]] = {}  # symbol -> (input name, axis)
        self._consts: dict[int, str] = {}  # id(tensor) -> initializer name
        self._keep: list = []  # constants seen, so their ids are not reused during the trace
        self._param_names: dict[int, str] = {}
        self._counter = 0
        self._dim_cache: dict[str, TracedTensor] = {}
        self._fixed_dims: set[int] = set()
        self._values: dict[str, TensorSpec] = {}  # spec of every traced value
        self._locations: list[str] = []  # the user's file:line of each node, in order
        self._match_sizes: dict[str, int] | None = None  # the first trace's example sizes
        self._verdicts: dict[str, Verdict] = {}  # condition text -> what decide() made of it

    # the public entry point ------------------------------------------------------------------
    def trace(self, inputs: Mapping[str, Tensor], axes: Mapping[str, Sequence[str | None]] | None = None,
              output_names: Sequence[str] | None = None, *, verify: bool = True):
        """Trace ``target`` on ``inputs``; ``axes`` names the symbolic axes of each input.

        With symbolic axes and ``verify`` (the default), the target is traced a second time with
        other sizes of those axes, and a difference between the two graphs raises TraceError:
        Python control flow depended on a size in a way no guard could record."""
        from .model import TracedModel

        axes = dict(axes or {})
        unknown = [k for k in axes if k not in inputs]
        if unknown:
            raise TraceError("trace", f"axes names input {unknown[0]!r}, which is not among the "
                             f"inputs ({', '.join(inputs)})")
        self._trace_once(inputs, axes, output_names)
        if verify and self._examples:
            self._verify(inputs, axes, output_names)
        return TracedModel(self.graph, source=self.target, example_inputs=dict(inputs),
                           axes=axes)

    def _trace_once(self, inputs, axes, output_names, match_sizes=None) -> None:
        self._reset()
        self._match_sizes = match_sizes
        module_modes = self._enter_eval()
        try:
            traced_inputs = [self._add_input(name, t, axes.get(name)) for name, t in inputs.items()]
            self._index_constants()
            result = self._run(traced_inputs)
            self._set_outputs(result, output_names)
        finally:
            self._restore(module_modes)
        self.graph.metadata.update({"producer": "onemodel-tracing", "producer_version": "0.1.0"})
        self.graph.validate()

    # the structural check --------------------------------------------------------------------
    def _verify(self, inputs, axes, output_names) -> None:
        """Trace again with other sizes of every symbolic axis; the graphs must be the same."""
        state = dict(self.__dict__)  # the first trace: restored whatever happens
        graph, locations, examples = self.graph, self._locations, dict(self._examples)
        params = set(self._param_names.values())
        try:
            second = self._other_sizes(examples, list(examples), graph.guards)
            diff = self._retrace(inputs, axes, output_names, examples, second, locations, params)
            if diff is not None and diff.constant:  # random constants differ at any size
                params |= self._random_constants(inputs, axes, output_names, examples, params)
                if diff.constant in params:
                    diff = self._retrace(inputs, axes, output_names, examples, second, locations,
                                         params)
            if diff is None:
                return
            axis = next(iter(examples))
            if len(examples) > 1:  # name the axis: vary one at a time (on this error path only)
                for sym in examples:
                    alone = self._other_sizes(examples, [sym], graph.guards)
                    if self._retrace(inputs, axes, output_names, examples, alone, locations,
                                     params) is not None:
                        axis = sym
                        break
            raise TraceError(
                f"Python control flow on the size of symbolic axis {axis!r}",
                f"tracing with {_sizes(examples)} and with {_sizes(second)} records different "
                f"graphs: {diff.what}. A loop such as range(x.shape[i]), or a branch or constant "
                "on len(), int() or numpy of a size, was unrolled for the example size only",
                "declare the axis fixed (None in the axes) if it always has the example size, or "
                "compute with tensor ops over the whole axis",
                location=diff.second_location or diff.first_location or None)
        finally:
            self.__dict__.update(state)

    def _trace_at(self, inputs, axes, output_names, examples, sizes):
        """Trace at ``sizes`` of the symbolic axes; returns (graph, node locations) and leaves
        ``self.graph`` as it was. Raises whatever the trace raises."""
        first, first_locs = self.graph, self._locations
        changed = {}
        for name, t in inputs.items():
            names = axes.get(name) or ()
            shape = tuple(sizes.get(sym, d) if sym else d for d, sym in zip(t.shape, names))
            changed[name] = Tensor._wrap(np.zeros(shape, t.dtype.numpy)) if names else t
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TraceWarning)
                self._trace_once(changed, axes, output_names, match_sizes=examples)
            return self.graph, self._locations
        finally:
            self.graph, self._locations = first, first_locs

    def _retrace(self, inputs, axes, output_names, examples, sizes, locations, params):
        """The first difference between the first trace and one at ``sizes``, or None."""
        first = self.graph
        try:
            second, second_locs = self._trace_at(inputs, axes, output_names, examples, sizes)
        except Exception as exc:  # the first trace ran: whatever fails here depends on a size
            return Difference(f"the second trace failed with {type(exc).__name__}: {exc}", "",
                              getattr(exc, "location", "") or _raised_at(exc))
        return first_difference(first, locations, second, second_locs, params)

    def _random_constants(self, inputs, axes, output_names, examples, params) -> set[str]:
        """Constants that differ between two traces at the example sizes: drawn at random in
        forward, not computed from a size (asked on the error path only)."""
        try:
            again, _ = self._trace_at(inputs, axes, output_names, examples, examples)
        except Exception:
            return set()
        return unstable_constants(self.graph, again, params)

    def _other_sizes(self, examples: dict[str, int], symbols: list[str],
                     guards: list[Guard]) -> dict[str, int]:
        """For each of ``symbols``, the nearest other size (larger first) that keeps the symbols
        distinct and every guard true."""
        sizes = dict(examples)
        for sym in symbols:
            ex = examples[sym]
            for cand in [*range(ex + 1, ex + 65), *range(ex - 1, 1, -1)]:
                if cand in (v for k, v in sizes.items() if k != sym):
                    continue
                trial = {**sizes, sym: cand}
                if failed_guard(guards, trial) is None:
                    sizes[sym] = cand
                    break
            else:
                held = [g for g in guards if sym in g.axis.split(", ")]
                raise TraceError(
                    f"Python decisions on symbolic axis {sym!r}",
                    f"together the guards {', '.join(repr(g.condition) for g in held)} allow "
                    f"only {sym}={ex}, so the graph would be frozen to that size",
                    "declare the axis fixed (None in the axes), or use tensor ops instead of "
                    "Python control flow on the size",
                    location=held[0].location if held else None)
        return sizes

    # decisions on sizes (called by SymBool.__bool__) -------------------------------------------
    def decide(self, decision: SymBool) -> bool:
        """The outcome of a comparison of symbolic sizes used as a bool: recorded as a guard when
        it holds for a range of sizes; TraceError when it pins an axis to one size."""
        condition = decision.condition()
        verdict = self._verdicts.get(condition)
        if verdict is None:  # the same decision in a loop is classified once
            verdict = self._verdicts[condition] = classify(decision, self._examples)
        if verdict.kind == "always":
            return decision.value
        if verdict.kind == "pin":
            raise TraceError(
                f"the comparison '{condition}' on symbolic axis {verdict.axis!r} used as a bool",
                f"it holds only for {verdict.axis}={verdict.size}, so the graph would be frozen "
                "to that size",
                f"declare the axis fixed (None in the axes) if {verdict.axis} is always "
                f"{verdict.size}, or compute with tensor ops (where, masks) instead of Python "
                "control flow")
        if all(g.condition != condition for g in self.graph.guards):
            axis = ", ".join(sorted(decision.symbols()))
            self.graph.guards.append(Guard(condition, axis, user_location()))
        return decision.value

    # inputs ----------------------------------------------------------------------------------
    def _add_input(self, name: str, example: Tensor, axes: Sequence[str | None] | None):
        if not isinstance(example, Tensor):
            raise TraceError("trace", f"example input {name!r} is a {type(example).__name__}, "
                             "not a Tensor")
        shape = example.shape
        axes = tuple(axes) if axes is not None else (None,) * len(shape)
        if len(axes) != len(shape):
            raise TraceError("trace", f"input {name!r} has {len(shape)} axes but {len(axes)} axis "
                             "names were given", "give one name or None per axis")
        dims: list[Dim] = []
        for axis, (size, sym) in enumerate(zip(shape, axes)):
            if sym is None:
                dims.append(int(size))
                self._fixed_dims.add(int(size))
                continue
            if size < 2:
                raise TraceError("trace", f"symbolic axis {sym!r} (input {name!r} axis {axis}) "
                                 f"has example size {size}; it must be at least 2",
                                 "trace with a larger example so the tracer can follow the axis")
            for other, other_size in self._examples.items():
                if other != sym and other_size == size:
                    raise TraceError(
                        "trace", f"symbolic axes {other!r} and {sym!r} (input {name!r} axis {axis}) "
                        f"both have example size {size}",
                        "give each symbolic axis a different example size")
            if sym in self._examples and self._examples[sym] != size:
                raise TraceError("trace", f"axis {sym!r} has example size {self._examples[sym]} "
                                 f"elsewhere but {size} on input {name!r} axis {axis}")
            self._examples[sym] = int(size)
            self._sources.setdefault(sym, (name, axis))
            expr = DimExpr.symbol(sym)
            dims.append(expr)
        self.graph.inputs.append(ValueInfo(name, example.dtype, tuple(dims)))
        return self._traced(name, example.dtype, tuple(dims))

    def _traced(self, name: str, dtype: DType, dims: tuple, value=None) -> TracedTensor:
        self._values.setdefault(name, TensorSpec(tuple(dims), dtype, value))
        shape = tuple(SymInt(evaluate(d, self._examples), d) if isinstance(d, DimExpr) else int(d)
                      for d in dims)
        return TracedTensor._wrap(TracedData(self, name, dtype.numpy, shape))

    def _index_constants(self) -> None:
        if hasattr(self.target, "named_parameters"):
            for n, p in self.target.named_parameters():
                self._param_names[id(p)] = n
            for n, b in self.target.named_buffers():
                self._param_names[id(b)] = n

    # running ---------------------------------------------------------------------------------
    def _run(self, inputs):
        fn = self.target.forward if hasattr(self.target, "forward") else self.target
        prev_active, prev_grad = trace_state.active, autograd.grad_mode.enabled
        if prev_active is not None:
            raise TraceError("trace", "another trace is already running in this process")
        trace_state.active = self
        autograd.grad_mode.enabled = False  # nothing is differentiated while tracing
        autograd._enter_hooks.append(self._on_grad_mode)
        try:
            return fn(*inputs)
        finally:
            autograd._enter_hooks.remove(self._on_grad_mode)
            autograd.grad_mode.enabled = prev_grad
            trace_state.active = prev_active

    def _on_grad_mode(self, enabled: bool) -> None:
        if not enabled:
            self.refuse("no_grad()", "gradient modes have no meaning in an inference graph",
                        "remove the no_grad block from the traced forward pass")

    def _enter_eval(self):
        if not hasattr(self.target, "modules"):
            return []
        modes = [(m, m.training) for m in self.target.modules()]
        self.target.eval()
        return modes

    @staticmethod
    def _restore(modes) -> None:
        for m, training in modes:
            object.__setattr__(m, "training", training)

    # recording (called by eager dispatch) ----------------------------------------------------
    def record(self, op: str, inputs: Sequence[Tensor | None], attrs: dict | None):
        if not any(getattr(t, "_traced", False) for t in inputs if t is not None):
            return NotImplemented
        opdef = OPS.get(op)
        if opdef is None:
            raise OneModelError(f"unknown op {op!r}")
        if not opdef.traceable:
            self.refuse(op, "it is a training-only op with no inference graph form")
        names, specs = [], []
        for t in inputs:
            if t is None:
                names.append("")
                specs.append(None)
            elif t._traced:
                names.append(t.name)
                specs.append(self._spec(t))
            else:
                names.append(self._constant(t))
                specs.append(self._const_spec(t))
        attrs = dict(attrs or {})
        try:
            out_specs = propagate(op, specs, attrs, opdef.infer(specs, attrs))
        except OneModelError as exc:
            raise TraceError(op, str(exc)) from None
        self._counter += 1
        outs = [f"{op.lower()}_{self._counter}" + (f"_{i}" if len(out_specs) > 1 else "")
                for i in range(len(out_specs))]
        self.graph.nodes.append(Node(op, names, outs, attrs, f"{op}_{self._counter}"))
        self._locations.append(user_location())
        results = [self._traced(name, spec.dtype, spec.shape, spec.value)
                   for name, spec in zip(outs, out_specs)]
        return tuple(results) if len(results) > 1 or opdef.outputs[0].endswith("...") else results[0]

    def _spec(self, t: TracedTensor) -> TensorSpec:
        return self._values[t.name]  # every traced value is registered when it is made

    @staticmethod
    def _const_spec(t: Tensor) -> TensorSpec:
        arr = t.cpu().numpy()  # a graph holds host arrays, whatever device a model traced on
        value = None
        if arr.dtype.kind in "iu" and arr.ndim <= 1 and arr.size <= 64:
            value = tuple(int(v) for v in arr.reshape(-1))
        return TensorSpec(tuple(arr.shape), t.dtype, value)

    def _constant(self, t: Tensor) -> str:
        name = self._consts.get(id(t))
        if name is None:
            base = self._param_names.get(id(t)) or f"const_{len(self._consts)}"
            name = base if base not in self.graph.initializers else f"{base}_{len(self._consts)}"
            self.graph.initializers[name] = np.array(t.cpu().numpy(), copy=True)  # a copy now
            self._consts[id(t)] = name
            self._keep.append(t)
        return name

    # symbolic sizes as graph values ----------------------------------------------------------
    def shape_operand(self, dims, match: bool = True) -> Tensor:
        """A 1-D I64 tensor holding ``dims``: a constant if every dim is a plain int (after the
        spec's rule matches ints equal to a symbolic example size), else Shape arithmetic."""
        explicit: set[str] = set()
        for d in dims:
            e = as_dim(d)
            if isinstance(e, DimExpr):
                explicit |= e.symbols()
        resolved = [self._match(d, explicit) if match else as_dim(d) for d in dims]
        if not any(isinstance(d, DimExpr) for d in resolved):
            return Tensor._wrap(np.asarray([int(d) for d in resolved], np.int64))
        parts, run = [], []
        for d in resolved:
            if isinstance(d, DimExpr):
                if run:
                    parts.append(Tensor._wrap(np.asarray(run, np.int64)))
                    run = []
                parts.append(self._dim_tensor(d))
            else:
                run.append(int(d))
        if run:
            parts.append(Tensor._wrap(np.asarray(run, np.int64)))
        if len(parts) == 1:
            return parts[0]
        from onemodel.tensors.dispatch import dispatch

        return dispatch("Concat", parts, {"axis": 0})

    def _match(self, d, explicit: set[str]) -> Dim:
        """The spec's rule: a plain int equal to a symbolic example size is taken as that axis,
        unless the same shape already names the axis through x.shape[...]."""
        if isinstance(d, SymInt):
            return d.expr
        if isinstance(d, DimExpr):
            return d
        d = int(d)
        sizes = self._examples if self._match_sizes is None else self._match_sizes
        hits = [s for s, size in sizes.items() if size == d and s not in explicit]
        if not hits:
            return d
        if d in self._fixed_dims:
            warnings.warn(
                f"the size {d} given as a plain int is taken as symbolic axis {hits[0]!r} (its "
                f"example size), but {d} is also a fixed dimension here; use x.shape[...] to say "
                "which you mean (at " + user_location() + ")", TraceWarning, stacklevel=2)
        return DimExpr.symbol(hits[0])

    def _dim_tensor(self, d: Dim) -> Tensor:
        """A [1]-shaped I64 graph value computing ``d`` from the inputs' shapes."""
        from onemodel.tensors.dispatch import dispatch

        if not isinstance(d, DimExpr):
            return Tensor._wrap(np.asarray([int(d)], np.int64))
        if d.kind == "sym":
            sym = d.args[0]
            if sym not in self._dim_cache:
                name, axis = self._sources[sym]
                source = self._input_value(name)
                shape = dispatch("Shape", (source,), {})
                self._dim_cache[sym] = dispatch(
                    "Gather", (shape, Tensor._wrap(np.asarray([axis], np.int64))), {"axis": 0})
            return self._dim_cache[sym]
        args = [self._dim_tensor(a) for a in d.args]
        out = args[0]
        for a in args[1:]:
            if d.kind == "//":
                # Python floors; ONNX's integer Div truncates toward zero (they differ on a
                # negative numerator, as in the ceiling idiom -((-n) // k)): a - a mod b is a
                # multiple of b, so its Div is exact (Mod takes the divisor's sign, as Python)
                out = dispatch("Div", (dispatch("Sub", (out, dispatch("Mod", (out, a), {})),
                                                {}), a), {})
            else:
                out = dispatch({"+": "Add", "*": "Mul", "%": "Mod"}[d.kind], (out, a), {})
        return out

    def _input_value(self, name: str) -> TracedTensor:
        v = next(v for v in self.graph.inputs if v.name == name)
        return self._traced(v.name, v.dtype, v.shape)

    def scalar_operand(self, value: SymInt, dtype) -> Tensor:
        """A 0-d tensor of ``dtype`` holding a symbolic size (``x / x.shape[0]``)."""
        from onemodel.tensors.dispatch import dispatch

        t = dispatch("Reshape", (self._dim_tensor(value.expr),
                                 Tensor._wrap(np.zeros(0, np.int64))), {})
        dt = DType.from_numpy(dtype)
        return t if dt is DType.I64 else dispatch("Cast", (t,), {"to": dt})

    # outputs ---------------------------------------------------------------------------------
    def _set_outputs(self, result, names: Sequence[str] | None) -> None:
        if isinstance(result, Mapping):
            keys, values = list(result), list(result.values())
        elif isinstance(result, (tuple, list)):
            keys, values = None, list(result)
        else:
            keys, values = None, [result]
        if names is not None:
            names = list(names)
            if len(names) != len(values):
                raise TraceError("trace", f"{len(names)} output names for {len(values)} outputs")
        elif keys is not None:
            names = [str(k) for k in keys]
        else:
            names = ["output"] if len(values) == 1 else [f"output_{i}" for i in range(len(values))]
        if len(set(names)) != len(names):
            raise TraceError("trace", f"output names repeat: {names}")
        renamed: dict[str, str] = {}
        for name, value in zip(names, values):
            if not isinstance(value, Tensor):
                raise TraceError("trace", f"output {name!r} is a {type(value).__name__}, not a "
                                 "Tensor")
            src = value.name if value._traced else self._constant(value)
            producer = next((n for n in self.graph.nodes if src in n.outputs), None)
            if producer is not None and src not in renamed:
                # the value takes the output's name: no Identity node needed
                producer.outputs = [name if o == src else o for o in producer.outputs]
                for n in self.graph.nodes:
                    n.inputs = [name if i == src else i for i in n.inputs]
                renamed[src] = name
            else:
                src = renamed.get(src, src)
                self.graph.nodes.append(Node("Identity", [src], [name], {}, f"output_{name}"))
                self._locations.append("")
            # the spec recorded when the value was made (trace() validates the graph once)
            spec = self._spec(value) if value._traced else self._const_spec(value)
            self.graph.outputs.append(ValueInfo(name, spec.dtype, spec.shape))

    # refusing --------------------------------------------------------------------------------
    def refuse(self, operation: str, reason: str, hint: str = "") -> None:
        raise TraceError(operation, reason, hint)


def _sizes(sizes: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items())


def _raised_at(exc: BaseException) -> str:
    """The user's file:line in ``exc``'s traceback (the innermost frame outside OneModel)."""
    where = ""
    tb = exc.__traceback__
    while tb is not None:
        if not internal_file(tb.tb_frame.f_code.co_filename):
            where = f"{os.path.abspath(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where
