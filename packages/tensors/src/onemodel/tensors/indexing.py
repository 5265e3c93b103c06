"""``tensor[index]`` as ops: basic indexing becomes Slice, Squeeze and Unsqueeze; one integer-array
(or boolean) index becomes Gather, so indexing is differentiable and traceable."""

from __future__ import annotations

import numpy as np

from . import trace_state
from .errors import OneModelError, ShapeError
from .symbolic import SymInt
from .tensor import Tensor, _call, _const

_BIG = np.iinfo(np.int64).max


def _is_array_index(item) -> bool:
    return isinstance(item, (Tensor, np.ndarray, list))


def numpy_index(index):
    """The same index with Tensors replaced by numpy arrays (for ``__setitem__``)."""
    if isinstance(index, tuple):
        return tuple(numpy_index(i) for i in index)
    if isinstance(index, Tensor):
        return index._data
    return index


def getitem(x: Tensor, index) -> Tensor:
    items = list(index) if isinstance(index, tuple) else [index]
    n_real = sum(1 for i in items if i is not None and i is not Ellipsis)
    if sum(1 for i in items if i is Ellipsis) > 1:
        raise OneModelError("an index can hold only one Ellipsis (...)")
    if any(i is Ellipsis for i in items):
        at = next(k for k, i in enumerate(items) if i is Ellipsis)
        items[at : at + 1] = [slice(None)] * (x.ndim - n_real)
    elif n_real < x.ndim:
        items += [slice(None)] * (x.ndim - n_real)
    if n_real > x.ndim:
        raise ShapeError(f"too many indices ({n_real}) for a tensor of rank {x.ndim}")
    arrays = [i for i in items if _is_array_index(i)]
    if len(arrays) > 1:
        raise OneModelError(
            "only one integer-array index per indexing expression is supported; "
            "index one axis at a time"
        )

    # numpy (and PyTorch): when integers and an array index are separated by a slice, the
    # array's axes go first in the result
    advanced = [k for k, i in enumerate(items)
                if _is_array_index(i) or (arrays and isinstance(i, (int, np.integer)))]
    to_front = bool(arrays) and advanced[-1] - advanced[0] + 1 != len(advanced)
    if to_front and any(i is None for i in items):
        raise OneModelError("None cannot be combined with separated integer and array indices")

    starts, ends, axes, steps = [], [], [], []
    squeeze, unsqueeze, gather = [], [], None
    dim = 0  # axis of x (and of the sliced tensor) the next item indexes
    out = 0  # axis of the final result the next item produces
    for item in items:
        if item is None:
            unsqueeze.append(out)
            out += 1
            continue
        size = x.shape[dim]
        if isinstance(item, slice):
            if isinstance(size, SymInt):
                # a symbolic axis: keep the slice's own numbers; Slice clamps when it runs
                step = 1 if item.step is None else int(item.step)
                start = item.start if item.start is not None else (0 if step > 0 else -1)
                stop = item.stop if item.stop is not None else (_BIG if step > 0 else -_BIG)
                if (int(start), int(stop), step) != (0, _BIG, 1):
                    starts.append(start)
                    ends.append(stop)
                    axes.append(dim)
                    steps.append(step)
                out += 1
                dim += 1
                continue
            start, stop, step = item.indices(size)
            if (start, stop, step) != (0, size, 1):
                starts.append(start)
                if step < 0 and stop < 0:
                    stop = -_BIG  # slice through the first element backwards
                ends.append(stop)
                axes.append(dim)
                steps.append(step)
            out += 1
        elif _is_array_index(item):
            idx = item._data if isinstance(item, Tensor) else np.asarray(item)
            if idx.dtype == bool:
                if idx.ndim != 1 or idx.shape[0] != size:
                    raise ShapeError(
                        f"a boolean index must be 1-D with the axis size {size}, got shape "
                        f"{list(idx.shape)}"
                    )
                idx = np.nonzero(idx)[0]
            if idx.dtype.kind not in "iu":
                raise OneModelError(f"array indices must be integers or booleans, not {idx.dtype}")
            gather = (dim, idx.astype(np.int64))
            out += idx.ndim
        else:
            i = int(item)
            if not -size <= i < size:
                raise ShapeError(f"index {i} is out of range for axis {dim} of size {size}")
            if isinstance(size, SymInt) and i < 0:
                starts.append(i)  # counted from the end of the axis when the graph runs
                ends.append(i + 1 if i < -1 else _BIG)
            else:
                i %= size
                starts.append(i)
                ends.append(i + 1)
            axes.append(dim)
            steps.append(1)
            squeeze.append(dim)
        dim += 1

    y = x
    if axes:
        y = _call("Slice", y, trace_state.shape_operand(starts, sizes=False),
                  trace_state.shape_operand(ends, sizes=False), _const(axes), _const(steps))
    if gather is not None:
        at, idx = gather
        y = _call("Gather", y, Tensor._wrap(idx), axis=at)
        squeeze = [a + idx.ndim - 1 if a > at else a for a in squeeze]
    if squeeze:
        y = _call("Squeeze", y, _const(squeeze))
    if to_front:
        at = gather[0] - sum(1 for s in squeeze if s < gather[0])
        n = gather[1].ndim
        rest = [a for a in range(y.ndim) if not at <= a < at + n]
        y = _call("Transpose", y, perm=tuple(range(at, at + n)) + tuple(rest))
    if unsqueeze:
        y = _call("Unsqueeze", y, _const(unsqueeze))
    return y
