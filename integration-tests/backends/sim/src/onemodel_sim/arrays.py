"""``SimArray``: the "device memory" of the sim backend, a host array in a wrapper.

It behaves like a GPU array library's arrays (CuPy's): numpy functions and operators work on
SimArrays and return SimArrays, Python and numpy scalars mix in freely, but a host array (an
``np.ndarray`` with dimensions) mixed into a computation, or an implicit conversion to one
(``np.asarray(sim_array)``), raises ``TypeError``: a forgotten transfer cannot pass unnoticed.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class SimArray(np.lib.mixins.NDArrayOperatorsMixin):
    __slots__ = ("_a",)

    def __init__(self, host: np.ndarray):
        if not isinstance(host, np.ndarray):
            raise TypeError(f"SimArray wraps a numpy array, not {type(host).__name__}")
        self._a = host

    # what array code reads
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: SimArray(self._a.T))

    def __array__(self, dtype=None, copy=None):
        raise TypeError("a sim device array cannot become a host array implicitly; "
                        "move it with to_host()")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if "out" in kwargs:
            kwargs["out"] = tuple(_unwrap(o) for o in kwargs["out"])
        result = getattr(ufunc, method)(*(_unwrap(x) for x in inputs), **kwargs)
        return _wrap(result)

    def __array_function__(self, func, types, args, kwargs):
        return _wrap(func(*_unwrap(args), **_unwrap(kwargs)))

    def __getitem__(self, index):
        return _wrap(self._a[_unwrap(index)])

    def __setitem__(self, index, value):
        self._a[_unwrap(index)] = _unwrap(value)

    def __len__(self) -> int:
        return len(self._a)

    def __float__(self) -> float:
        return float(self._a)

    def __int__(self) -> int:
        return int(self._a)

    def __index__(self) -> int:
        return self._a.__index__()

    def __bool__(self) -> bool:
        return bool(self._a)

    def __getattr__(self, name: str) -> Any:  # astype, reshape, copy, sum, transpose, ...
        if name.startswith("__"):  # no __array_interface__ & co.: numpy must not see the host
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if callable(attr):
            return lambda *a, **k: _wrap(attr(*_unwrap(a), **_unwrap(k)))
        return _wrap(attr)

    def __repr__(self) -> str:
        return f"SimArray({self._a!r})"


def _unwrap(x):
    if isinstance(x, SimArray):
        return x._a
    if isinstance(x, np.ndarray) and x.ndim:
        raise TypeError(f"a host array of shape {list(x.shape)} was mixed with sim device "
                        "arrays; move it to the device first")
    if isinstance(x, (tuple, list)):
        return type(x)(_unwrap(v) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def _wrap(x):
    if isinstance(x, np.ndarray):
        return SimArray(x)
    if isinstance(x, np.generic):
        return SimArray(np.asarray(x))
    if isinstance(x, (tuple, list)):
        return type(x)(_wrap(v) for v in x)
    return x


def to_sim(host: np.ndarray) -> SimArray:
    """Host -> "device": a copy, as a real transfer would be."""
    return SimArray(np.array(host, copy=True))


def to_host(array: SimArray) -> np.ndarray:
    if not isinstance(array, SimArray):
        raise TypeError(f"to_host expects a SimArray, got {type(array).__name__}")
    return np.array(array._a, copy=True)


def synchronize() -> None:
    """Nothing is queued on the sim device."""
