"""Plan-time specialization of kernels: the work a kernel call does that depends only on shapes,
dtypes, attributes and constant inputs (a Reshape target's list, a Slice's index tuple, a fused
chain's broadcast plan) is done once when a plan is made, not on every run.

Onnxruntime constructs each kernel once per session for the same reason. A plan is made for
concrete input sizes, so the planner knows every node's shapes: it hands a kernel's specializer
a :class:`CallSite` and uses the callable it returns as the step's call.

The contract (tested for every specializer): the callable takes what the generic call takes
(the node's inputs, and ``out=`` when the kernel writes out) and returns the same result. It
checks the shapes it is given and takes the generic path for any other, so a shape rule and a
kernel that disagree never make a specialized kernel read past an array.

A callable that only calls a method of its first input (a reshape, a transpose) may say so in
an ``as_method`` attribute, ``(method name, argument, input shape or None)``: the compiled plan
(runtime/codegen.py) then writes that method call in place of the call, guarded by the input
shape when one is given (the callable itself for any other shape).

A callable that checks its arrays and then runs one machine-code kernel may also offer that
kernel to the compiled plan: a ``direct(known, out)`` attribute, called once when the plan is
compiled. ``known`` says what the plan proves of each input at every run (:class:`Planned`, a
:class:`Constant`, or None: nothing), ``out`` what it proves of the output buffer (a
:class:`Planned`). Where the proofs cover every check the callable makes, ``direct`` returns a
:class:`Direct` (or a tuple of them, run in order: a product, then its epilogue over the
output), and the plan calls each ``Direct.run`` itself with its arguments: no Python frame,
no checks, about 0.9 us less a step on the small convolutions of mobile networks. Else it
returns None and the plan calls the callable."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class CallSite:
    """One node as a plan knows it while it is being made."""

    shapes: tuple[tuple[int, ...] | None, ...]  # each input's shape (None: omitted)
    dtypes: tuple[np.dtype | None, ...]
    values: tuple[np.ndarray | None, ...]  # inputs known while planning (constants), else None
    attrs: Mapping[str, Any]  # the node's attributes as the generic call gets them
    out_shapes: tuple[tuple[int, ...] | None, ...]  # None: an output the node leaves unnamed
    generic: Callable  # the kernel with the node's attributes: the fallback for other shapes


Specializer = Callable[[CallSite], "Callable | None"]


@dataclass(frozen=True)
class Planned:
    """What a compiled plan proves of an array at every run: a planned buffer, so C-contiguous,
    aligned and writeable, of exactly this shape and dtype."""

    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass(frozen=True)
class Constant:
    """An input that is the same object at every run (a weight; None for an omitted input)."""

    value: Any


@dataclass(frozen=True)
class Input:
    """In :attr:`Direct.arguments`: the call's input ``index``, reshaped to ``shape`` if given."""

    index: int
    shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Output:
    """In :attr:`Direct.arguments`: the step's output buffer, reshaped to ``shape`` if given.
    ``index`` 1 and on: another output of the node, of the first one's planned shape and dtype
    (SkipLayerNormalization's sum): a new array, only for a step without a planned buffer
    whose node names that output with that shape and dtype; else the plan keeps the call."""

    shape: tuple[int, ...] | None = None
    index: int = 0


@dataclass(frozen=True)
class Direct:
    """A specialized call as the compiled plan makes it: ``run(*arguments)``, with each
    :class:`Input` and :class:`Output` replaced by that array and anything else passed as it
    is. ``run`` fills the output buffer; what it returns is ignored."""

    run: Callable
    arguments: tuple


def planned(fact, shape: tuple[int, ...], dtype) -> bool:
    """Whether ``fact`` (one of ``direct``'s ``known``) proves an array of ``shape`` and
    ``dtype`` that is a planned buffer."""
    return type(fact) is Planned and fact.shape == tuple(shape) and fact.dtype == dtype


def constant(fact, value) -> bool:
    """Whether ``fact`` proves the input is ``value`` itself at every run."""
    return type(fact) is Constant and fact.value is value


def constant_at(known: tuple, index: int, value) -> bool:
    """Whether input ``index`` is ``value`` itself at every run, where ``value`` None means
    an omitted input (given as None, or past the node's last input)."""
    if index >= len(known):
        return value is None
    return constant(known[index], value)


def contiguous(fact, shape: tuple[int, ...], dtype) -> bool:
    """Whether ``fact`` proves a C-contiguous, aligned array of ``shape`` and ``dtype`` at
    every run: a planned buffer, or a constant nothing can change in place (:func:`is_frozen`)
    laid out so."""
    if type(fact) is Planned:
        return planned(fact, shape, dtype)
    value = fact.value if type(fact) is Constant else None
    return isinstance(value, np.ndarray) and value.shape == tuple(shape) and \
        value.dtype == dtype and value.flags.c_contiguous and value.flags.aligned and \
        is_frozen(value)


def is_frozen(value) -> bool:
    """Whether nothing can change a constant in place: read-only views down to immutable
    ``bytes`` (a file's constants, a session's own copies). A specializer may lay out such a
    constant once (packed, transposed) and the copy cannot go stale; any other constant it must
    read as it is at each call."""
    while isinstance(value, np.ndarray):
        if value.flags.writeable:
            return False
        value = value.base
    return isinstance(value, bytes)


def specializer(kernel: Callable) -> Callable[[Specializer], Specializer]:
    """Decorator: make ``fn(site) -> callable | None`` the plan-time specializer of
    ``kernel`` (a reference kernel or a plugin's). None keeps the generic call."""
    def wrap(fn: Specializer) -> Specializer:
        kernel.specialize = fn
        return fn
    return wrap


def specialize(kernel: Callable, site: CallSite) -> Callable | None:
    """``kernel``'s specialized call for ``site``, or None when it has no specializer or
    declines."""
    fn = getattr(kernel, "specialize", None)
    return fn(site) if fn is not None else None
