"""TracedModel: a traced graph, ready to save, run, report and check against eager."""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from onemodel.runtime import Graph, Session
from onemodel.runtime import save as save_graph
from onemodel.runtime.guards import failed_guard
from onemodel.runtime.session import IOInfo, io_info
from onemodel.tensors import DimExpr, OneModelError, Tensor


@dataclass
class CheckReport:
    """What :meth:`TracedModel.check` found: the largest difference at each combination of sizes
    tried, and the combinations skipped because they break one of the graph's guards."""

    differences: dict[str, float] = field(default_factory=dict)  # "batch=3" -> max |eager - graph|
    tolerance: float = 0.0
    skipped: dict[str, str] = field(default_factory=dict)  # "batch=1" -> the guard it breaks

    @property
    def largest(self) -> float:
        return max(self.differences.values(), default=0.0)

    @property
    def ok(self) -> bool:
        return self.largest <= self.tolerance

    def __str__(self) -> str:
        lines = [f"{k}: largest difference {v:.3g}" for k, v in self.differences.items()]
        lines += [f"{k}: skipped, breaks the guard {g}" for k, g in self.skipped.items()]
        verdict = "OK" if self.ok else "MISMATCH"
        lines.append(f"{verdict}: largest difference {self.largest:.3g} over "
                     f"{len(self.differences)} size combinations (tolerance {self.tolerance:.3g})")
        return "\n".join(lines)


MAX_COMBINATIONS = 64  # check() samples beyond this many combinations of sizes (see its doc)


def size_combinations(per_axis: Mapping[str, Sequence[int]], examples: Mapping[str, int],
                      limit: int = MAX_COMBINATIONS) -> list[dict[str, int]]:
    """Every combination of the sizes of each axis, or, when there are more than ``limit``, a
    sample: each size of each axis with the other axes at their example sizes, plus the two
    corners where every axis is at its smallest and at its largest size."""
    axes = list(per_axis)
    combos = [dict(zip(axes, c)) for c in itertools.product(*(per_axis[a] for a in axes))]
    if len(combos) <= limit:
        return combos
    sample = [{**{a: examples[a] for a in axes}, axis: size}
              for axis in axes for size in per_axis[axis]]
    sample += [{a: min(per_axis[a]) for a in axes}, {a: max(per_axis[a]) for a in axes}]
    unique = {tuple(sorted(c.items())): c for c in sample}
    return list(unique.values())


class TracedModel:
    """The result of a trace: ``graph``, ``inputs``/``outputs``, ``save``, ``save_onnx``,
    ``session()``, ``report()`` and ``check(sizes=...)``."""

    def __init__(self, graph: Graph, *, source=None, example_inputs=None, axes=None):
        self.graph = graph
        self._source = source
        self._examples = example_inputs or {}
        self._axes = axes or {}
        self._session: Session | None = None

    @property
    def inputs(self) -> list[IOInfo]:
        return [io_info(v) for v in self.graph.inputs]

    @property
    def outputs(self) -> list[IOInfo]:
        return [io_info(v) for v in self.graph.outputs]

    def save(self, path: str | os.PathLike, format: str | None = None, **options) -> None:
        """Save in the format the extension names (``.onemodel``: onemodel-native, ``.onnx``:
        onemodel-onnx, or any installed format), or in ``format``. An unknown extension is an
        error that lists the installed formats."""
        save_graph(self.graph, path, format=format, **options)

    def save_onnx(self, path: str | os.PathLike, opset: int | None = None) -> None:
        """Save as ONNX (needs onemodel-onnx)."""
        options = {} if opset is None else {"opset": opset}
        save_graph(self.graph, path, format="onnx", **options)

    def session(self, *, optimize: bool = True) -> Session:
        """An in-memory inference session over the graph."""
        if self._session is None or not optimize:
            s = Session(self.graph, optimize=optimize)
            if not optimize:
                return s
            self._session = s
        return self._session

    def run(self, feeds: Mapping[str, Tensor | np.ndarray]) -> dict[str, Tensor]:
        return self.session().run(feeds)

    def report(self) -> str:
        """Every node with its symbolic output shapes, then the guards: the conditions on sizes
        that Python decisions in forward assumed (each with its source line)."""
        return str(self.graph)

    __str__ = report

    def check(self, sizes: Mapping[str, Sequence[int]] | None = None, *, rtol: float = 1e-5,
              atol: float = 1e-5, seed: int = 0) -> CheckReport:
        """Run eager forward (in eval mode) and the graph side by side on random inputs and report
        the largest difference at each combination of sizes tried.

        ``sizes`` maps an axis name to the sizes to try (default for every symbolic axis: 1, the
        example size and 2x+1 of it); axes it leaves out stay at their example sizes. Every
        combination of the axes' sizes is tried; beyond 64 combinations, a sample (see
        :func:`size_combinations`). Combinations that break a guard of the graph are skipped and
        listed in the report, since the Session refuses them."""
        if self._source is None:
            raise OneModelError("check() needs the traced module or function; this TracedModel "
                                "was loaded without it")
        symbols = sorted({str(d) for v in self.graph.inputs for d in v.shape
                          if isinstance(d, DimExpr)})
        examples = {}
        for name, t in self._examples.items():
            for axis, sym in enumerate(self._axes.get(name, ())):
                if sym is not None:
                    examples[sym] = t.shape[axis]
        sizes = dict(sizes or {s: [1, examples[s], 2 * examples[s] + 1] for s in symbols})
        unknown = set(sizes) - set(symbols)
        if unknown:
            raise OneModelError(f"check(): {sorted(unknown)} are not symbolic axes of this graph "
                                f"({symbols})")
        per_axis = {s: list(dict.fromkeys(int(v) for v in sizes.get(s, [examples[s]])))
                    for s in symbols}
        rng = np.random.default_rng(seed)
        report = CheckReport(tolerance=atol)
        session = self.session()
        modes = ([(m, m.training) for m in self._source.modules()]
                 if hasattr(self._source, "modules") else [])
        try:
            if modes:
                self._source.eval()
            for bound in size_combinations(per_axis, examples):
                label = ", ".join(f"{s}={bound[s]}" for s in symbols)
                broken = failed_guard(self.graph.guards, bound)
                if broken is not None:
                    report.skipped[label] = f"'{broken.condition}' (made at {broken.location})"
                    continue
                report.differences[label] = self._difference(session, bound, label, rng, rtol)
        finally:
            for m, training in modes:
                object.__setattr__(m, "training", training)
        return report

    def _difference(self, session: Session, bound: dict[str, int], label: str, rng,
                    rtol: float) -> float:
        feeds = {}
        for v in self.graph.inputs:
            shape = tuple(bound[str(d)] if isinstance(d, DimExpr) else int(d) for d in v.shape)
            ex = self._examples[v.name].numpy()
            if v.dtype.is_floating:
                arr = rng.standard_normal(shape).astype(v.dtype.numpy)
            else:  # integer inputs (indices): draw below the example's largest value
                arr = rng.integers(0, max(int(ex.max()) + 1, 1), shape).astype(v.dtype.numpy)
            feeds[v.name] = arr
        graph_out = session.run(feeds)
        fn = self._source.forward if hasattr(self._source, "forward") else self._source
        eager = _outputs(fn(*[Tensor.from_numpy(a) for a in feeds.values()]),
                         [o.name for o in self.graph.outputs])
        diff = 0.0
        for name, g in graph_out.items():
            e = eager[name]
            if g.shape != e.shape:
                raise OneModelError(f"check(): output {name!r} at {label} has shape "
                                    f"{list(g.shape)} in the graph, {list(e.shape)} eager")
            scale = rtol * np.abs(e).astype(np.float64)
            err = np.abs(g.numpy().astype(np.float64) - e.astype(np.float64)) - scale
            diff = max(diff, float(np.max(err, initial=0.0)))
        return diff


def _outputs(result, names) -> dict[str, np.ndarray]:
    if isinstance(result, Mapping):
        values = list(result.values())
    elif isinstance(result, (tuple, list)):
        values = list(result)
    else:
        values = [result]
    return {n: v.numpy() for n, v in zip(names, values)}


__all__ = ["MAX_COMBINATIONS", "CheckReport", "TracedModel", "size_combinations"]
