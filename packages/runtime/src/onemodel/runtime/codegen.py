"""A plan's steps as one straight-line Python function, so a run pays no interpreter loop.

The loop in ``Plan._execute_profiled`` reads seven attributes of each step, calls an
``itemgetter`` and stores into a list of slots; on the small graphs that dominate serving
latency (a few us per node) that measured 0.2-0.6 us per step. ``compile_steps`` writes the same
steps out as code: each slot a local variable, each kernel and constant a global of the
function, one line per call::

    def run(arrays, views):
        v3 = arrays[0]
        v4 = c0(v3, k2)
        b = views[0]; o = c1(v4, out=b)
        ...

The source is built only from slot numbers, generated names and the method names kernels
declare (``as_method``, see ops/specialize.py: a Reshape or Transpose becomes the array method
call, 0.15-0.46 us less per step): nothing from a model file reaches it, so compiling it
executes no code a file brought. Slots are released (set to None) after their last reader
exactly as in the loop, so memory is freed as early.

A step whose call offers its kernel (``direct``, see ops/specialize.py) is written as a call of
that kernel itself where the plan proves what the call would check: its inputs that are planned
buffers of a step before it (``Planned``: their shape and dtype), constants, and its own output
buffer. Its line is then a call of the kernel's machine code, with no Python frame in between::

    o = views[1]; d3_0(v4, g3_0_1, g3_0_2, o)

Errors still name the node: ``failed_step`` maps the line a kernel raised on back to its step
and reads the step's inputs from the function's frame.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType

import numpy as np

from onemodel.tensors import OneModelError
from onemodel.tensors.ops.specialize import Constant, Input, Output, Planned

from . import buffers as _buffers

_NAME = "<onemodel plan>"
_UNNAMED = 1  # the slot of the outputs a node leaves unnamed (planner.py): never read


class CompiledSteps:
    """A plan's steps compiled to ``run(arrays, views) -> list``: ``arrays`` the feeds in the
    plan's input order, ``views`` the planned buffers of the run (empty when none)."""

    def __init__(self, run: Callable, line_step: dict[int, int], consts: dict[str, object]):
        self.run = run
        self.edits = 0  # the count of step edits it was compiled after (planner.py)
        self.threads = -1  # the thread setting's generation it was compiled under (planner.py)
        self._line_step = line_step
        self._consts = consts

    def failed_step(self, tb: TracebackType | None) -> tuple[int, dict[int, object]] | None:
        """(the index of the step whose line raised, slot -> value at that moment) from an
        exception's traceback, or None when the generated function is not in it (it failed
        before its first step)."""
        code = self.run.__code__
        while tb is not None:
            if tb.tb_frame.f_code is code:
                step = self._line_step.get(tb.tb_lineno)
                if step is None:
                    return None
                values = {int(k[1:]): v for k, v in self._consts.items()}
                values.update((int(k[1:]), v) for k, v in tb.tb_frame.f_locals.items()
                              if k[0] == "v" and k[1:].isdigit())
                return step, values
            tb = tb.tb_next
        return None


def compile_steps(steps: Sequence, input_slots: Sequence[int], output_slots: Sequence[int],
                  template: Sequence, planned: Sequence[tuple] = ()) -> CompiledSteps:
    """``steps`` (planner.Step) as one function that does what the step loop does.
    ``planned[i]`` is planned buffer ``i``'s (shape, dtype): what a direct call may rely on."""
    inputs = set(input_slots)
    written = {o for st in steps for o in st.outs}
    ns: dict[str, object] = {"_into": _buffers.into, "_new": _buffers.new_arrays,
                             "_empty": np.empty}
    consts: dict[str, object] = {}
    # slots that hold a planned buffer at every run: the one output of a buffered step, which
    # the step's line makes the buffer itself (``_into``), and (added below, in step order) a
    # declared reshape of one to its planned shape, a C-contiguous view of the same memory
    buffered = {st.outs[0]: Planned(tuple(planned[st.buf][0]), planned[st.buf][1])
                for st in steps if 0 <= st.buf < len(planned) and not st.multi
                and not st.new_outputs}

    def known(slot: int):
        if slot in buffered:
            return buffered[slot]
        if slot in written or slot in inputs:
            return None
        return Constant(template[slot])

    def ref(slot: int) -> str:
        if slot in written or slot in inputs:
            return f"v{slot}"
        name = f"k{slot}"  # a constant of the plan (or None: an omitted input)
        consts[name] = template[slot]
        return name

    lines = ["def run(arrays, views):"]
    # a slot a step writes starts as the template's value, as the loop's list of slots does
    lines += [f"    v{slot} = k{slot}" for slot in sorted(written - inputs)
              if template[slot] is not None]
    consts.update((f"k{slot}", template[slot]) for slot in written - inputs
                  if template[slot] is not None)
    lines += [f"    v{slot} = arrays[{k}]" for k, slot in enumerate(input_slots)]
    line_step: dict[int, int] = {}
    for k, st in enumerate(steps):
        ns[f"c{k}"] = st.call
        args = ", ".join(ref(i) for i in st.ins)
        first = len(lines) + 1  # line numbers count from 1
        method = getattr(st.call, "as_method", None)
        if method is not None and st.buf < 0 and not st.multi and st.ins and \
                method[0].isidentifier():  # a reshape or transpose: the method call itself
            name, ns[f"a{k}"], shape = method
            data = ref(st.ins[0])
            call = f"{data}.{name}(a{k})"
            if shape is not None:
                ns[f"s{k}"] = shape
                call = f"{call} if {data}.shape == s{k} else c{k}({args})"
            lines.append(f"    o = {call}")
            source = buffered.get(st.ins[0])
            if name == "reshape" and source is not None and shape is not None and \
                    source.shape == tuple(shape):  # a reshape of a planned buffer: one too
                buffered[st.outs[0]] = Planned(tuple(int(d) for d in ns[f"a{k}"]),
                                               source.dtype)
        elif (direct := _direct_calls(st, known, planned, ref)) is not None:
            calls, extra = direct
            for c, (run, arguments) in enumerate(calls):
                ns[f"d{k}_{c}"] = run
                for j, (name, value) in enumerate(arguments):
                    if name is None:
                        ns[f"g{k}_{c}_{j}"] = value
            text = [f"d{k}_{c}(" + ", ".join(name or f"g{k}_{c}_{j}"
                                             for j, (name, _) in enumerate(arguments)) + ")"
                    for c, (_, arguments) in enumerate(calls)]
            if st.buf >= 0:
                made = [f"o = views[{st.buf}]"]
            else:  # new arrays, as the call would have made: C-contiguous and aligned too
                ns[f"e{k}"], ns[f"t{k}"] = st.out_specs[0]
                made = [f"o = _empty(e{k}, t{k})"] + [f"o{j} = _empty(e{k}, t{k})" for j in extra]
                for j in (0, *extra):
                    buffered[st.outs[j]] = Planned(tuple(st.out_specs[0][0]), st.out_specs[0][1])
            # (each output is the buffer or a new array, never a view: no new_outputs check;
            # outputs the node leaves unnamed are never read, see _direct_calls)
            lines.append("    " + "; ".join(made + text))
            lines.append(f"    v{st.outs[0]} = o")
            lines += [f"    v{st.outs[j]} = o{j}" for j in extra]
            lines += [f"    v{slot} = None" for slot in st.release]
            for line in range(first, len(lines) + 1):
                line_step[line] = k
            continue
        elif st.buf >= 0:
            sep = ", " if args else ""
            lines.append(f"    b = views[{st.buf}]; o = c{k}({args}{sep}out=b)")
            lines.append(f"    if o is not b: o = _into(o, b, c{k})")
        else:
            lines.append(f"    o = c{k}({args})")
        if st.new_outputs:  # the check inline: a call of _new only for a view
            views_of = " or ".join(f"(o[{j}] is not None and o[{j}].base is not None)"
                                   for j in range(len(st.outs))) if st.multi else \
                "o.base is not None"
            lines.append(f"    if {views_of}: o = _new(o, {st.multi})")
        if st.multi:
            lines += [f"    v{slot} = o[{j}]" for j, slot in enumerate(st.outs)]
        else:
            lines.append(f"    v{st.outs[0]} = o")
        lines += [f"    v{slot} = None" for slot in st.release]
        for line in range(first, len(lines) + 1):
            line_step[line] = k
    lines.append(f"    return [{', '.join(ref(s) for s in output_slots)}]")
    ns.update(consts)
    exec(compile("\n".join(lines), _NAME, "exec"), ns)  # source made of slot numbers only
    return CompiledSteps(ns["run"], line_step, consts)


def _direct_calls(st, known, planned, ref):
    """``([(kernel, [(source or None, constant)...])...], extra outputs)`` for a step whose call
    offers its kernels (``direct``) and takes what the plan proves; None keeps the call. Its
    output is its planned buffer, or a new array of its planned shape (``Step.out_specs``)
    where it has none; an op's other outputs the node names must each be written by the
    kernels (``Output(index=j)``, new arrays of the first's shape and dtype), the "extra"
    outputs. An argument's source is the expression the line passes (an input's slot, the
    output ``o`` or ``o1``..., a reshape of either); None means the constant beside it, passed
    as a global of the function."""
    offer = getattr(st.call, "direct", None)
    if offer is None or st.outs[0] == _UNNAMED:
        return None
    if 0 <= st.buf < len(planned):
        shape, dtype = planned[st.buf]
    elif st.buf < 0 and st.out_specs and st.out_specs[0] is not None:
        shape, dtype = st.out_specs[0]  # no buffer: a new array at each run
    else:
        return None
    try:
        got = offer(tuple(known(i) for i in st.ins), Planned(tuple(shape), dtype))
    except Exception as exc:  # a plugin's bug: name the node, never a bare error from run
        raise OneModelError(f"{st.label}: the direct form of its kernel failed: "
                            f"{type(exc).__name__}: {exc}") from exc
    if got is None:
        return None
    calls, extra = [], set()
    for direct in (got if isinstance(got, tuple) else (got,)):
        arguments = []
        for a in direct.arguments:
            if type(a) is Input:
                source = ref(st.ins[a.index])
            elif type(a) is Output:
                j = a.index
                if j and (st.buf >= 0 or j >= len(st.outs) or st.outs[j] == _UNNAMED or
                          j >= len(st.out_specs) or st.out_specs[j] != st.out_specs[0]):
                    return None  # an output the plan has no new array of that shape for
                source = f"o{j}" if j else "o"
                if j:
                    extra.add(j)
            else:
                arguments.append((None, a))
                continue
            if a.shape is not None:
                source = f"{source}.reshape({tuple(int(d) for d in a.shape)!r})"
            arguments.append((source, None))
        calls.append((direct.run, arguments))
    if any(slot != _UNNAMED and j not in extra for j, slot in enumerate(st.outs) if j):
        return None  # a named output the kernels do not write: the call returns it
    return calls, sorted(extra)
