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
shape when one is given (the callable itself for any other shape)."""

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
