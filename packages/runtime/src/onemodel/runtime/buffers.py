"""Planned output buffers: memory a plan reuses from run to run for kernels that write ``out=``.

A kernel registered with ``writes_out=True`` (see the ``onemodel_register_kernels`` hookspec)
fills a given C-contiguous ``out`` of exactly its output's shape and dtype. For each step with
such a kernel the planner asks :func:`assign` for a buffer: a view of a byte arena that later
values reuse once the value held there is dead. So a steady-state run at the same shapes makes
no new large arrays for those steps.

Aliasing is judged conservatively, because reuse must never change a result:

- A step whose kernel does not write into a planned buffer may return views of its inputs
  (Reshape, Transpose, Slice, Identity, a Loop that runs no iteration...). Its outputs join the
  alias group of every input. A group lives from the step that writes its buffer to the last
  step that reads or writes any member; only after that is the arena free for another value.
- A group that holds a graph output outlives the run: it gets no planned buffer. Its writing
  step is still given ``out=``, a new array at each run (:func:`fresh_out`), so its output is
  known not to be a view of its inputs either, and the groups before it keep their buffers.

Several threads may run one plan at once: each run checks out a :class:`BufferSet` from the
plan's :class:`BufferPool` (made on demand, up to ``MAX_SETS`` kept) and gives it back at the
end, also on error. ``ONEMODEL_PLANNED_BUFFERS=0`` turns planned buffers off (for comparison,
or to rule them out when looking for a problem).
"""

from __future__ import annotations

import heapq
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from onemodel.tensors import OneModelError

ENV = "ONEMODEL_PLANNED_BUFFERS"
ALIGN = 64  # bytes: each arena starts on a cache line, so vector loads and stores line up
MAX_SETS = 8  # buffer sets a plan keeps for runs in parallel; more runs get temporary ones


def enabled(option: bool | None = None) -> bool:
    """Whether plans reuse output buffers: ``option`` when given, else ``ONEMODEL_PLANNED_BUFFERS``
    (default on; ``0``, ``false``, ``no``, ``off`` turn it off)."""
    if option is not None:
        return bool(option)
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class Slot:
    """One planned buffer: the step that writes it, its arena, and the view's shape and dtype."""

    step: int
    arena: int
    shape: tuple[int, ...]
    dtype: np.dtype
    nbytes: int


@dataclass(frozen=True)
class Layout:
    """Where each buffered step's output lives: ``slots[i]`` is buffer ``i``; ``arenas`` the
    arena sizes in bytes; ``escaping`` the steps whose kernel writes ``out=`` but whose output
    outlives the run (they get a new ``out`` at each run, see :func:`fresh_out`)."""

    slots: tuple[Slot, ...]
    arenas: tuple[int, ...]
    escaping: frozenset[int] = frozenset()

    @property
    def nbytes(self) -> int:
        """Bytes one buffer set holds."""
        return sum(size + ALIGN for size in self.arenas)


def assign(io: Sequence[tuple[tuple[int, ...], tuple[int, ...], bool]],
           candidates: Mapping[int, tuple[tuple[int, ...], np.dtype]],
           escaping: set[int]) -> Layout | None:
    """The buffers of a plan's steps, or None when no step gets one.

    ``io[k]`` is step ``k``'s (input slots, output slots, fresh): ``fresh`` steps return arrays
    that share no memory with their inputs (a continuation, whose outputs its own plan owns, or
    an op declared ``new_outputs``).
    ``candidates`` maps the steps whose kernel writes ``out=`` to their single output's shape
    and dtype; ``escaping`` holds the slots that outlive the run (the graph's outputs). Slots 0
    and 1 (an omitted input, unnamed outputs) carry nothing and join no group.

    Every candidate's output is known to be new memory (a planned buffer, or a new ``out``
    when it escapes), so candidates join no input's group."""
    find = _groups(io, candidates)
    dead = {find(s) for s in escaping if s > 1}
    out_of_run = frozenset(k for k in candidates if find(io[k][1][0]) in dead)
    cands = {k: v for k, v in candidates.items() if k not in out_of_run}
    if not cands:
        return None
    end: dict[int, int] = {}
    for k, (ins, outs, _) in enumerate(io):
        for s in ins + outs:
            if s > 1:
                g = find(s)
                end[g] = k  # steps run in order: the last seen is the last use
    slots = []
    sizes: list[int] = []
    free: list[int] = []
    busy: list[tuple[int, int]] = []  # (last step using the arena's value, arena)
    for k in sorted(cands):
        while busy and busy[0][0] < k:
            free.append(heapq.heappop(busy)[1])
        shape, dtype = cands[k]
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        need = -(-nbytes // ALIGN) * ALIGN
        arena = _best_fit(free, sizes, need)
        if arena is None:
            arena = len(sizes)
            sizes.append(need)
        else:
            free.remove(arena)
            sizes[arena] = max(sizes[arena], need)
        heapq.heappush(busy, (end[find(io[k][1][0])], arena))
        slots.append(Slot(k, arena, tuple(shape), dtype, nbytes))
    return Layout(tuple(slots), tuple(sizes), out_of_run)


def fresh_out(call, shape: tuple[int, ...], dtype: np.dtype):
    """``call`` (a kernel that writes ``out=``) given a new output array at each call, so what
    it returns is never a view of its inputs."""

    def run(*args):
        out = np.empty(shape, dtype)
        return into(call(*args, out=out), out, call)

    return run


def new_arrays(got, multi: bool):
    """What a kernel of an op declared ``new_outputs`` returned (a tuple with ``multi``), with
    any output that is a view (of an input, maybe a planned buffer a later step overwrites)
    copied: the plan keeps such a step's outputs out of its inputs' groups on that promise."""
    if not multi:
        return got.copy() if got.base is not None else got
    return tuple(r if r is None or r.base is None else r.copy() for r in got)


def into(got, out: np.ndarray, kernel) -> np.ndarray:
    """``out`` holding what a kernel given ``out=`` returned. A kernel that kept the contract
    returned ``out`` itself; one that returned another array of the same shape and dtype is
    copied in (still right); anything else is an error, never a broadcast into the buffer."""
    if got is out:
        return out
    if getattr(got, "shape", None) != out.shape or getattr(got, "dtype", None) != out.dtype:
        name = getattr(kernel, "__qualname__", None) or getattr(
            getattr(kernel, "func", None), "__qualname__", repr(kernel))
        raise OneModelError(
            f"kernel {name} was given out= of {out.dtype}{list(out.shape)} and returned "
            f"{getattr(got, 'dtype', type(got).__name__)}{list(np.shape(got))}: a kernel "
            "registered with writes_out=True must fill out and return it")
    out[...] = got
    return out


def _groups(io, cands):
    """Union-find over slots: the outputs of each step that is neither buffered nor fresh join
    its inputs' groups. Returns the ``find`` function."""
    parent: dict[int, int] = {}

    def find(s: int) -> int:
        root = s
        while parent.get(root, root) != root:
            root = parent[root]
        while s != root:  # path compression
            parent[s], s = root, parent.get(s, s)
        return root

    for k, (ins, outs, fresh) in enumerate(io):
        if fresh or k in cands:
            continue
        for o in outs:
            if o <= 1:
                continue
            for i in ins:
                if i > 1:
                    a, b = find(o), find(i)
                    if a != b:
                        parent[a] = b
    return find


def _best_fit(free: list[int], sizes: list[int], need: int) -> int | None:
    """The smallest free arena that holds ``need`` bytes, else the largest (it grows), else
    None (a new arena)."""
    if not free:
        return None
    fits = [a for a in free if sizes[a] >= need]
    if fits:
        return min(fits, key=sizes.__getitem__)
    return max(free, key=sizes.__getitem__)


class BufferSet:
    """One run's buffers: ``views[i]`` is buffer ``i`` as an array of its planned shape and
    dtype; ``roots`` the ids of the arenas (an output on one is copied)."""

    __slots__ = ("arenas", "kept", "roots", "views")

    def __init__(self, layout: Layout, kept: bool):
        self.arenas = [np.empty(size + ALIGN, np.uint8) for size in layout.arenas]
        starts = [(-a.ctypes.data) % ALIGN for a in self.arenas]
        self.views = [self.arenas[s.arena][starts[s.arena]:starts[s.arena] + s.nbytes]
                      .view(s.dtype).reshape(s.shape) for s in layout.slots]
        self.roots = frozenset(id(a) for a in self.arenas)
        self.kept = kept


class BufferPool:
    """The buffer sets of one plan: a run checks one out and gives it back. Sets are made on
    demand; up to ``max_sets`` are kept, and any beyond (more runs at once) are dropped when
    given back."""

    def __init__(self, layout: Layout, max_sets: int = MAX_SETS):
        self.layout = layout
        self.max_sets = max_sets
        self.lock = threading.Lock()
        self._free: list[BufferSet] = []
        self.kept = 0  # sets this pool owns (free or checked out)
        self.made = 0  # sets made, kept or not (tests and benchmarks read it)

    @property
    def set_nbytes(self) -> int:
        return self.layout.nbytes

    def checkout(self) -> tuple[BufferSet, bool]:
        """A free set, or a new one; the flag says whether the pool now keeps one more set
        than the first (the plan's ``nbytes`` counts the first from the start)."""
        try:  # list.pop and list.append are atomic: no lock on the common path
            return self._free.pop(), False
        except IndexError:
            pass
        with self.lock:
            keep = self.kept < self.max_sets
            if keep:
                self.kept += 1
            self.made += 1
            grew = keep and self.kept > 1
        return BufferSet(self.layout, keep), grew

    def checkin(self, bufs: BufferSet) -> None:
        if bufs.kept:
            self._free.append(bufs)
