"""Control flow: If, Loop, Scan and SequenceMap, whose attributes hold subgraphs.

The ops are defined here, like every op, but their subgraphs are runtime ``Graph`` objects and
running one needs the runtime's planner and executor: ``onemodel.runtime`` installs the
function that does it (:func:`set_subgraph_runner`) when it is imported. This module only
relies on what a subgraph offers: ``infer(specs)`` (its output specs for these input specs),
``inputs`` and ``outputs`` (with ``dtype``).

Outer-scope values: a subgraph reads nothing implicitly. Every value it reads from an enclosing
graph is an explicit input of the node (the last ``num_captures`` inputs) and an input of the
subgraph (its last inputs, in the same order), so passes that rename or remove values in the
outer graph see every use, and a subgraph is an ordinary graph with ordinary inputs.

Subgraph inputs, per op:

- ``If(cond, *captures)``: each branch takes ``captures``.
- ``Loop(M, cond, *carried, *captures)``: the body takes ``(iteration, cond, *carried,
  *captures)`` and gives ``(cond, *carried, *scan_outputs)``.
- ``Scan(*states, *scan_inputs, *captures)``: the body takes ``(*states, *slices, *captures)``
  and gives ``(*states, *scan_output_slices)``.
- ``SequenceMap(sequence, *additional, *captures)``: the body takes one element of each
  sequence (a tensor input as it is) and the captures, and gives one element of each output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..dtype import DType
from ..errors import OneModelError, ShapeError
from .base import TensorSpec, UnknownValueError, defop
from .dynamic import fresh_dim
from .sequence import SequenceSpec, merge_specs, spec_of_value

_RUNNER: list[Callable | None] = [None]


def set_subgraph_runner(run: Callable[[object, Sequence], list]) -> None:
    """Install ``run(graph, values) -> outputs``, the executor of subgraphs (the runtime's)."""
    _RUNNER[0] = run


def run_graph(graph, values: Sequence) -> list:
    """Run subgraph ``graph`` on ``values`` (one per input, in order)."""
    run = _RUNNER[0]
    if run is None:
        raise OneModelError("running a subgraph (If, Loop, Scan, SequenceMap) needs "
                            "onemodel-runtime: install it and import onemodel.runtime")
    return run(graph, values)


def _graph_attr(g, what: str):
    if not (hasattr(g, "infer") and hasattr(g, "outputs")):
        raise ShapeError(f"{what} must be a graph, got {type(g).__name__}")
    return g


def _accepts_values(op):
    op.accepts_values = True
    return op


def _split(items: Sequence, num_captures: int, what: str):
    if not 0 <= num_captures <= len(items):
        raise ShapeError(f"{what}: num_captures={num_captures} but only {len(items)} inputs")
    cut = len(items) - num_captures
    return list(items[:cut]), list(items[cut:])


def _as_bool(value, what: str) -> bool:
    arr = np.asarray(value)
    if arr.size != 1:
        raise OneModelError(f"{what} must hold one element, it has shape {list(arr.shape)}")
    return bool(arr.reshape(-1)[0])


# If --------------------------------------------------------------------------------------------

def _if_shape(specs, *, then_branch=None, else_branch=None, num_captures=0):
    then_g = _graph_attr(then_branch, "then_branch")
    else_g = _graph_attr(else_branch, "else_branch")
    cond, caps = specs[0], list(specs[1:])
    if cond.value is not None and len(cond.value) == 1 and isinstance(cond.value[0], int):
        return (then_g if cond.value[0] else else_g).infer(caps)
    # a branch whose shape rules fail for these inputs cannot be the one that runs without
    # failing: the other one says what the node gives (and if it runs, it fails, naming it)
    try:
        a = then_g.infer(caps)
    except UnknownValueError:
        raise
    except OneModelError:
        return else_g.infer(caps)
    try:
        b = else_g.infer(caps)
    except UnknownValueError:
        raise
    except OneModelError:
        return a
    if len(a) != len(b):
        raise ShapeError(f"the branches give {len(a)} and {len(b)} outputs")
    return [merge_specs(x, y) for x, y in zip(a, b)]


@_accepts_values
@defop("If", shape=_if_shape, outputs=("outputs...",))
def if_(cond, *captures, then_branch=None, else_branch=None, num_captures=0):
    """Run ``then_branch`` or ``else_branch`` (subgraphs over the captured outer values) as
    ``cond`` says, and give that branch's outputs."""
    branch = then_branch if _as_bool(cond, "If's condition") else else_branch
    return tuple(run_graph(branch, list(captures)))


# Loop ------------------------------------------------------------------------------------------

_I64 = TensorSpec((), DType.I64)
_BOOL = TensorSpec((), DType.BOOL)


def _loop_shape(specs, *, body=None, num_captures=0):
    body = _graph_attr(body, "body")
    trip, rest = specs[0], specs[2:]
    carried, caps = _split(rest, num_captures, "Loop")
    outs = body.infer([_I64, _BOOL, *carried, *caps])
    n = len(carried)
    if len(outs) < 1 + n:
        raise ShapeError(f"the body gives {len(outs)} outputs, it must give the condition and "
                         f"{n} loop-carried values")
    final = [merge_specs(a, b) for a, b in zip(carried, outs[1:1 + n])]
    changes = any(f != a for f, a in zip(final, carried))
    count = None
    if specs[1] is None and trip is not None and trip.value is not None \
            and isinstance(trip.value[0], int):
        count = max(trip.value[0], 0)
    scans = []
    for s in outs[1 + n:]:
        if not isinstance(s, TensorSpec):
            raise ShapeError(f"a scan output of the body must be a tensor, got {s}")
        elem = tuple(fresh_dim("loop") for _ in s.shape) if changes else s.shape
        scans.append(TensorSpec((fresh_dim("trips") if count is None else count, *elem),
                                s.dtype))
    return final + scans


@_accepts_values
@defop("Loop", shape=_loop_shape, outputs=("outputs...",))
def loop(M=None, cond=None, *inputs, body=None, num_captures=0):
    """Run ``body`` while the iteration count is below ``M`` (when given) and the condition
    holds (the input, then the body's first output); give the final loop-carried values and
    each scan output stacked over the iterations."""
    carried, caps = _split(inputs, num_captures, "Loop")
    n = len(carried)
    trips = None if M is None else int(np.asarray(M).reshape(-1)[0])
    keep = True if cond is None else _as_bool(cond, "Loop's condition")
    scans: list[list] = [[] for _ in range(len(body.outputs) - 1 - n)]
    it_dtype = np.int64 if M is None else np.asarray(M).dtype
    i = 0
    while keep and (trips is None or i < trips):
        outs = run_graph(body, [np.array(i, it_dtype), np.array(keep), *carried, *caps])
        keep = _as_bool(outs[0], "the condition the Loop body gives")
        carried = outs[1:1 + n]
        for k, v in enumerate(outs[1 + n:]):
            scans[k].append(v)
        i += 1
    stacked = []
    for k, vals in enumerate(scans):
        if vals:
            stacked.append(np.stack(vals))
        else:
            stacked.append(_no_iterations(body, 1 + n + k, [
                np.zeros((), it_dtype), np.array(keep), *carried, *caps]))
    return (*carried, *stacked)


def _no_iterations(body, index: int, values) -> np.ndarray:
    """The stacked scan output ``index`` of a loop that ran no iteration: ``[0, *element]``
    when the body's shape rules give the element's shape, else ``[0]``."""
    dtype = body.outputs[index].dtype.numpy
    try:
        spec = body.infer([spec_of_value(v) for v in values])[index]
        shape = tuple(int(d) for d in spec.shape)
        return np.zeros((0, *shape), spec.dtype.numpy)
    except (OneModelError, TypeError, ValueError):
        return np.zeros((0,), dtype)


# Scan ------------------------------------------------------------------------------------------

def _scan_layout(n_inputs, num_scan_inputs, num_captures, scan_input_axes,
                 scan_input_directions):
    n_states = n_inputs - num_scan_inputs - num_captures
    if n_states < 0 or num_scan_inputs < 1:
        raise ShapeError(f"{n_inputs} inputs cannot hold {num_scan_inputs} scan inputs and "
                         f"{num_captures} captured values")
    axes = list(scan_input_axes) if scan_input_axes is not None else [0] * num_scan_inputs
    dirs = list(scan_input_directions) if scan_input_directions is not None \
        else [0] * num_scan_inputs
    if len(axes) != num_scan_inputs or len(dirs) != num_scan_inputs:
        raise ShapeError("scan_input_axes and scan_input_directions need one entry per scan "
                         "input")
    return n_states, axes, dirs


def _scan_shape(specs, *, body=None, num_scan_inputs=1, scan_input_axes=None,
                scan_input_directions=None, scan_output_axes=None, scan_output_directions=None,
                num_captures=0, batched=0):
    if batched:  # Scan-8: each state and scan input has a leading batch axis
        n_io = len(specs) - num_captures
        batch = specs[0].shape[0]
        inner = [TensorSpec(tuple(s.shape[1:]), s.dtype) for s in specs[:n_io]]
        outs = _scan_shape(inner + list(specs[n_io:]), body=body,
                           num_scan_inputs=num_scan_inputs, scan_input_axes=scan_input_axes,
                           scan_input_directions=scan_input_directions,
                           scan_output_axes=scan_output_axes,
                           scan_output_directions=scan_output_directions,
                           num_captures=num_captures)
        return [TensorSpec((batch, *o.shape), o.dtype) for o in outs]
    body = _graph_attr(body, "body")
    n_states, axes, _ = _scan_layout(len(specs), num_scan_inputs, num_captures,
                                     scan_input_axes, scan_input_directions)
    states = specs[:n_states]
    scan_in = specs[n_states:n_states + num_scan_inputs]
    caps = specs[n_states + num_scan_inputs:]
    slices, length = [], None
    for s, ax in zip(scan_in, axes):
        a = ax % len(s.shape)
        slices.append(TensorSpec(s.shape[:a] + s.shape[a + 1:], s.dtype))
        length = s.shape[a] if length is None else length
    outs = body.infer([*states, *slices, *caps])
    final = [merge_specs(a, b) for a, b in zip(states, outs[:n_states])]
    changes = any(f != a for f, a in zip(final, states))
    out_axes = list(scan_output_axes) if scan_output_axes is not None \
        else [0] * (len(outs) - n_states)
    scans = []
    for s, ax in zip(outs[n_states:], out_axes):
        elem = tuple(fresh_dim("scan") for _ in s.shape) if changes else tuple(s.shape)
        a = ax % (len(elem) + 1)
        scans.append(TensorSpec(elem[:a] + (length,) + elem[a:], s.dtype))
    return final + scans


@_accepts_values
@defop("Scan", shape=_scan_shape, outputs=("outputs...",))
def scan(*inputs, body=None, num_scan_inputs=1, scan_input_axes=None,
         scan_input_directions=None, scan_output_axes=None, scan_output_directions=None,
         num_captures=0, batched=0):
    """Run ``body`` once per slice of the scan inputs along their scan axes (backwards where
    a direction is 1), threading the state values through; give the final states and the
    per-iteration outputs stacked along each output's scan axis. ``batched=1`` is ONNX's
    Scan-8 form: every state and scan input has a leading batch axis, and each batch entry is
    scanned on its own."""
    options = {"body": body, "num_scan_inputs": num_scan_inputs,
               "scan_input_axes": scan_input_axes,
               "scan_input_directions": scan_input_directions,
               "scan_output_axes": scan_output_axes,
               "scan_output_directions": scan_output_directions, "num_captures": num_captures}
    if not batched:
        return _scan_one(inputs, **options)
    n_io = len(inputs) - num_captures
    caps = list(inputs[n_io:])
    count = inputs[0].shape[0]
    if count == 0:
        raise OneModelError("Scan (batched): the batch is empty")
    per = [_scan_one([x[b] for x in inputs[:n_io]] + caps, **options) for b in range(count)]
    return tuple(np.stack([p[k] for p in per]) for k in range(len(per[0])))


def _scan_one(inputs, *, body, num_scan_inputs, scan_input_axes, scan_input_directions,
              scan_output_axes, scan_output_directions, num_captures):
    n_states, axes, dirs = _scan_layout(len(inputs), num_scan_inputs, num_captures,
                                        scan_input_axes, scan_input_directions)
    states = list(inputs[:n_states])
    scan_in = inputs[n_states:n_states + num_scan_inputs]
    caps = list(inputs[n_states + num_scan_inputs:])
    axes = [ax % x.ndim for ax, x in zip(axes, scan_in)]
    lengths = {x.shape[a] for x, a in zip(scan_in, axes)}
    if len(lengths) != 1:
        raise OneModelError(f"Scan: the scan inputs differ in length along their scan axes "
                            f"({sorted(lengths)})")
    (length,) = lengths
    n_out = len(body.outputs) - n_states
    collected: list[list] = [[] for _ in range(n_out)]
    for t in range(length):
        slices = [np.take(x, length - 1 - t if d else t, axis=a)
                  for x, a, d in zip(scan_in, axes, dirs)]
        outs = run_graph(body, [*states, *slices, *caps])
        states = outs[:n_states]
        for k, v in enumerate(outs[n_states:]):
            collected[k].append(v)
    out_axes = list(scan_output_axes) if scan_output_axes is not None else [0] * n_out
    out_dirs = list(scan_output_directions) if scan_output_directions is not None \
        else [0] * n_out
    results = []
    for k, vals in enumerate(collected):
        if not vals:
            results.append(np.zeros((0,), body.outputs[n_states + k].dtype.numpy))
            continue
        if out_dirs[k] if k < len(out_dirs) else 0:
            vals = vals[::-1]
        stacked = np.stack(vals)
        ax = out_axes[k] % stacked.ndim if k < len(out_axes) else 0
        results.append(np.moveaxis(stacked, 0, ax) if ax else stacked)
    return (*states, *results)


# SequenceMap -----------------------------------------------------------------------------------

def _sequence_map_shape(specs, *, body=None, num_captures=0):
    body = _graph_attr(body, "body")
    seqs, caps = _split(specs, num_captures, "SequenceMap")
    elems = []
    for s in seqs:
        if isinstance(s, SequenceSpec):
            if not s.elems:
                raise UnknownValueError("a sequence's elements are known only at run time")
            e = s.elems[0]
            for other in s.elems[1:]:
                e = merge_specs(e, other)
            elems.append(e)
        else:
            elems.append(s)
    outs = body.infer([*elems, *caps])
    return [SequenceSpec(o.dtype, None) for o in outs]


@_accepts_values
@defop("SequenceMap", shape=_sequence_map_shape, outputs=("out_sequence...",))
def sequence_map(input_sequence, *additional_inputs, body=None, num_captures=0):
    """Run ``body`` on each element of the input sequences (a tensor input is given whole to
    every call) and give each of its outputs as a sequence."""
    extra, caps = _split(additional_inputs, num_captures, "SequenceMap")
    n = len(input_sequence)
    for x in extra:
        if isinstance(x, list) and len(x) != n:
            raise OneModelError(f"SequenceMap: the sequences differ in length ({n} and "
                                f"{len(x)})")
    outs: list[list] = [[] for _ in body.outputs]
    for i in range(n):
        args = [input_sequence[i], *(x[i] if isinstance(x, list) else x for x in extra), *caps]
        for k, v in enumerate(run_graph(body, args)):
            outs[k].append(v)
    return tuple(outs)

