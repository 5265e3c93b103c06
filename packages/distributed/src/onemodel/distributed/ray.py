"""Batch inference of a saved graph over Ray: one ``Session`` per actor, loaded once.

``map_batches(dataset, "model.onemodel")`` runs the graph over a Ray Dataset with Ray Data's own
``map_batches`` and an actor pool, and returns the dataset with the graph's outputs appended as
columns (in order). ``run_batches(batches, "model.onemodel")`` does the same for any iterable of
numpy batches (dicts of column -> array), yielding results in input order. Each actor loads the
file itself (``.onemodel`` files are memory-mapped by their loader, so actors on one machine
share the weights' pages), so the path must be readable where the actors run.

A row that does not fit the graph (wrong shape or dtype) fails the job with a
:class:`~onemodel.tensors.OneModelError` naming the input, its column, the row and its batch.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from onemodel.tensors import OneModelError

from .errors import DistributedError

try:
    import ray
    import ray.data
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise DistributedError(f"onemodel.distributed.ray needs Ray Data ({_exc}); install it with "
                           "pip install 'onemodel-distributed[ray]'") from None


class SessionPredictor:
    """The per-actor callable: loads the graph once, then maps one numpy batch to its outputs.

    ``columns`` maps graph inputs to batch columns and ``output_columns`` graph outputs to the
    new columns (both default to the same names). ``index_column``, when given, is a column of
    global row numbers that errors quote."""

    def __init__(self, model: str | os.PathLike, columns: Mapping[str, str] | None = None,
                 output_columns: Mapping[str, str] | None = None,
                 index_column: str | None = None):
        from onemodel.runtime import Session

        self.session = Session.load(model)
        self.inputs = self.session.inputs
        self.columns = {i.name: (columns or {}).get(i.name, i.name) for i in self.inputs}
        names = [o.name for o in self.session.outputs]
        self.output_columns = {n: (output_columns or {}).get(n, n) for n in names}
        self.index_column = index_column
        self.batches = 0

    def __call__(self, batch: Mapping[str, np.ndarray], where: str | None = None) -> dict:
        self.batches += 1
        rows = _row_count(batch)
        if where is None:
            where = _describe_batch(batch, rows, self.index_column, self.batches)
        feeds = {i.name: _feed(batch, i, self.columns[i.name], where, rows, self.index_column)
                 for i in self.inputs}
        results = self.session.run(feeds)
        out = dict(batch)
        for name, value in results.items():
            arr = value.numpy()
            if arr.ndim == 0 or arr.shape[0] != rows:
                raise OneModelError(f"output {name!r} has shape {list(arr.shape)}, which cannot be "
                                    f"a column of a {rows}-row batch ({where}): its first axis "
                                    "must be the batch axis")
            out[self.output_columns[name]] = arr
        return out


def map_batches(dataset: ray.data.Dataset, model: str | os.PathLike, *, batch_size: int = 1024,
                num_actors: int = 2, columns: Mapping[str, str] | None = None,
                output_columns: Mapping[str, str] | None = None, index_column: str | None = None,
                num_cpus: float = 1.0) -> ray.data.Dataset:
    """``dataset`` with the outputs of the graph in ``model`` appended as columns, computed by
    ``num_actors`` actors, ``batch_size`` rows at a time (lazy, like every Ray Dataset: the work
    runs when the result is consumed; its row order is kept)."""
    _check_counts(batch_size, num_actors)
    model = os.fspath(model)
    _check_file(model)
    # outputs in input order: a Dataset keeps the DataContext it was created with (a copy), so
    # the option goes on this dataset's own context, which map_batches' result inherits
    dataset.context.execution_options.preserve_order = True
    return dataset.map_batches(
        SessionPredictor, fn_constructor_args=(model, columns, output_columns, index_column),
        batch_size=batch_size, batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=num_actors), num_cpus=num_cpus)


def run_batches(batches: Iterable[Mapping[str, np.ndarray]], model: str | os.PathLike, *,
                num_actors: int = 2, columns: Mapping[str, str] | None = None,
                output_columns: Mapping[str, str] | None = None, num_cpus: float = 1.0,
                timeout: float | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Run the graph over an iterable of numpy batches on ``num_actors`` Ray actors; yields
    each batch with the outputs added, in input order (at most two batches per actor in
    flight, so a long iterable streams). ``timeout``: seconds to wait for one batch (actors
    that cannot be placed, for want of free CPUs, would otherwise wait forever)."""
    _check_counts(1, num_actors)
    model = os.fspath(model)
    _check_file(model)
    actor = ray.remote(num_cpus=num_cpus)(SessionPredictor)
    pool = [actor.remote(model, columns, output_columns) for _ in range(num_actors)]
    pending: deque = deque()
    offset = 0
    try:
        for k, batch in enumerate(batches):
            if not isinstance(batch, Mapping):
                raise OneModelError(f"batch {k} is a {type(batch).__name__}; run_batches wants "
                                    "dicts of column name -> numpy array")
            rows = _row_count(batch)
            where = f"batch {k}, rows {offset}..{offset + rows - 1}"
            pending.append((pool[k % num_actors].__call__.remote(dict(batch), where), where))
            offset += rows
            if len(pending) >= 2 * num_actors:
                yield _result(*pending.popleft(), timeout)
        while pending:
            yield _result(*pending.popleft(), timeout)
    finally:
        for a in pool:
            ray.kill(a)


def _result(ref, where: str, timeout: float | None) -> dict:
    try:
        return ray.get(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise OneModelError(f"{where} took more than {timeout:g} s: are there free CPUs for the "
                            f"actors? (ray.available_resources() says "
                            f"{ray.available_resources()})") from None
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, OneModelError):
            raise type(cause)(str(cause)) from None
        raise


# checks ------------------------------------------------------------------------------------------

def _check_counts(batch_size: int, num_actors: int) -> None:
    if batch_size < 1:
        raise OneModelError(f"batch_size must be at least 1, got {batch_size}")
    if num_actors < 1:
        raise OneModelError(f"num_actors must be at least 1, got {num_actors}")


def _check_file(model: str) -> None:
    if not os.path.isfile(model):
        raise OneModelError(f"{model}: no such model file (each actor loads it by this path, so "
                            "it must exist where the actors run)")


def _row_count(batch: Mapping[str, Any]) -> int:
    counts = {k: len(v) for k, v in batch.items()}
    if not counts:
        raise OneModelError("an empty batch (no columns)")
    if len(set(counts.values())) != 1:
        raise OneModelError("the columns of a batch differ in length: "
                            + ", ".join(f"{k}={n}" for k, n in counts.items()))
    return next(iter(counts.values()))


def _describe_batch(batch, rows: int, index_column: str | None, seq: int) -> str:
    if index_column is not None and index_column in batch and rows:
        index = batch[index_column]
        return f"the batch of rows {index[0]}..{index[-1]}"
    return f"batch {seq} of this actor ({rows} rows; pass index_column= to name rows globally)"


def _feed(batch, info, column: str, where: str, rows: int, index_column: str | None) -> np.ndarray:
    if column not in batch:
        raise OneModelError(f"input {info.name!r} reads column {column!r}, which the batch lacks "
                            f"({where}); its columns are {sorted(batch)}: map inputs to columns "
                            "with columns={...}")
    arr = batch[column]
    want_row = info.shape[1:]
    want = f"{info.dtype.name}[{', '.join(str(d) for d in want_row)}]"

    def bad(i: int, got: str) -> OneModelError:
        row = f"row {i} of {where}"
        if index_column is not None and index_column in batch:
            row = f"row {batch[index_column][i]} ({where})"
        return OneModelError(f"input {info.name!r} (column {column!r}): {row} is {got}; the graph "
                             f"wants rows of {want}")

    if arr.dtype == object:  # rows of different shapes: name the first that does not fit
        shapes = [np.asarray(item).shape for item in arr]
        for i, shape in enumerate(shapes):
            if not _fits(shape, want_row):
                raise bad(i, f"of shape {list(shape)}")
            if shape != shapes[0]:
                raise bad(i, f"of shape {list(shape)} while row 0 of its batch is "
                             f"{list(shapes[0])} (one batch needs one size per axis)")
        arr = np.stack([np.asarray(item) for item in arr])
    if arr.ndim != len(info.shape) or not _fits(arr.shape[1:], want_row):
        raise bad(0, f"of shape {list(arr.shape[1:])} (every row of this batch)")
    if arr.dtype != info.dtype.numpy:
        raise bad(0, f"of dtype {arr.dtype} (the whole column); cast the column first")
    return np.ascontiguousarray(arr)


def _fits(shape: tuple, want: tuple) -> bool:
    return len(shape) == len(want) and all(
        not isinstance(w, int) or int(s) == w for s, w in zip(shape, want))


__all__ = ["SessionPredictor", "map_batches", "run_batches"]
