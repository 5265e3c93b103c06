"""Inputs for the commands: symbol sizes from ``--shape``, feeds from files or random data."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from onemodel.tensors import DimExpr, OneModelError

from ..graph import Graph, ValueInfo

MAX_COMBINATIONS = 24  # check() tries at most this many combinations of sizes


def parse_sizes(items: Iterable[str], *, many: bool = False) -> dict[str, list[int]]:
    """``["batch=8", "seq=3,17"]`` -> ``{"batch": [8], "seq": [3, 17]}``."""
    out: dict[str, list[int]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        try:
            sizes = [int(v) for v in values.split(",")] if sep else []
        except ValueError:
            sizes = []
        if not name or not sizes or any(s < 0 for s in sizes) or (len(sizes) > 1 and not many):
            example = "batch=1,3,17" if many else "batch=8"
            raise OneModelError(f"{item!r} is not AXIS=SIZE{'[,SIZE...]' if many else ''} "
                                f"(for example {example})")
        out[name] = sizes
    return out


def graph_symbols(graph: Graph) -> list[str]:
    found: set[str] = set()
    for v in graph.inputs:
        for d in v.shape:
            if isinstance(d, DimExpr):
                found |= d.symbols()
    return sorted(found)


def check_known(graph: Graph, sizes: Mapping[str, object]) -> None:
    symbols = graph_symbols(graph)
    unknown = sorted(set(sizes) - set(symbols))
    if unknown:
        raise OneModelError(f"{unknown[0]!r} is not a symbolic axis of this model; its symbolic "
                            f"axes are: {', '.join(symbols) or 'none'}")


def input_shape(v: ValueInfo, bindings: Mapping[str, int]) -> tuple[int, ...]:
    shape = []
    for d in v.shape:
        if isinstance(d, DimExpr):
            missing = d.symbols() - set(bindings)
            if missing:
                raise OneModelError(f"input {v.name!r} needs a size for axis "
                                    f"{sorted(missing)[0]!r}: pass --shape {sorted(missing)[0]}=N")
            shape.append(d.evaluate(bindings))
        else:
            shape.append(int(d))
    return tuple(shape)


def random_feeds(values: Sequence[ValueInfo], bindings: Mapping[str, int],
                 rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Standard-normal floats; integers in [0, 2) and booleans, so index inputs stay in range."""
    feeds = {}
    for v in values:
        shape = input_shape(v, bindings)
        if v.dtype.is_floating:
            feeds[v.name] = rng.standard_normal(shape).astype(v.dtype.numpy)
        else:
            feeds[v.name] = rng.integers(0, 2, shape).astype(v.dtype.numpy)
    return feeds


def bind_from_feeds(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Sizes of the symbolic axes that given arrays fix (axes written as a plain symbol)."""
    bindings: dict[str, int] = {}
    for v in graph.inputs:
        arr = feeds.get(v.name)
        if arr is None or np.ndim(arr) != len(v.shape):
            continue  # the session reports the mismatch with the input's name
        for d, size in zip(v.shape, np.shape(arr)):
            if isinstance(d, DimExpr) and d.kind == "sym":
                bindings.setdefault(d.args[0], int(size))
    return bindings


def file_feeds(paths: Sequence[str]) -> dict[str, np.ndarray]:
    """Feeds from ``.npz`` files (every array, by its name) and ``NAME=file.npy`` items."""
    feeds: dict[str, np.ndarray] = {}
    for item in paths:
        name, sep, file = item.partition("=")
        if sep:
            feeds[name] = _load_npy(Path(file))
        elif item.endswith(".npz"):
            with np.load(item, allow_pickle=False) as npz:
                feeds.update({k: npz[k] for k in npz.files})
        else:
            raise OneModelError(f"--input {item!r}: give a .npz file or NAME=file.npy")
    return feeds


def _load_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise OneModelError(f"{path}: no such file") from None
    except ValueError as exc:
        raise OneModelError(f"{path}: not a numpy array file without objects ({exc})") from None


def size_combinations(sizes: Mapping[str, Sequence[int]]) -> list[dict[str, int]]:
    """Every combination of the sizes given per axis, or an even sample of
    ``MAX_COMBINATIONS`` of them (always including the first and the last) when there are more."""
    names = sorted(sizes)
    combos = [dict(zip(names, c)) for c in itertools.product(*(sizes[n] for n in names))]
    if len(combos) <= MAX_COMBINATIONS:
        return combos
    picks = np.linspace(0, len(combos) - 1, MAX_COMBINATIONS).round().astype(int)
    return [combos[i] for i in sorted(set(picks.tolist()))]
