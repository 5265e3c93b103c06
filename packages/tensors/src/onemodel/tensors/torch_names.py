"""PyTorch's argument names (``dim``, ``keepdim``) next to numpy's (``axis``, ``keepdims``).

One mechanism for every method and function: :func:`accept_torch_names` wraps each function of a
class or module whose signature names ``axis``/``keepdims`` (or ``dim``/``keepdim``) so that the
other spelling is accepted too. Users coming from either library write what they know.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from .errors import OneModelError

_ALIASES = {"axis": "dim", "keepdims": "keepdim", "dim": "axis", "keepdim": "keepdims"}


def _renames(fn: Callable) -> dict[str, str]:
    """{accepted alias: the parameter name fn really has}."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    return {_ALIASES[p]: p for p in params if p in _ALIASES and _ALIASES[p] not in params}


def _wrap(fn: Callable, renames: dict[str, str]) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any):
        if kwargs:
            for alias, real in renames.items():
                if alias in kwargs:
                    if real in kwargs:
                        raise OneModelError(
                            f"{fn.__qualname__}: got both {alias}= and {real}= (the same "
                            f"argument in PyTorch's and numpy's spelling); pass one")
                    kwargs[real] = kwargs.pop(alias)
        return fn(*args, **kwargs)

    wrapper._torch_names = True  # type: ignore[attr-defined]
    return wrapper


def accept_torch_names(namespace: Any, names: list[str] | None = None) -> None:
    """Wrap, in place, each function of ``namespace`` (a class or a module) that has an axis or
    keepdims parameter; ``names`` limits it to those attributes (a module's own functions)."""
    if names is None and inspect.ismodule(namespace):  # the module's own functions only
        names = [n for n, v in vars(namespace).items()
                 if inspect.isfunction(v) and v.__module__ == namespace.__name__]
    items = vars(namespace) if names is None else {n: getattr(namespace, n) for n in names}
    for name, value in list(items.items()):
        fn = value
        if isinstance(value, (staticmethod, classmethod)):
            fn = value.__func__
        if not inspect.isfunction(fn) or getattr(fn, "_torch_names", False):
            continue
        renames = _renames(fn)
        if not renames:
            continue
        wrapped = _wrap(fn, renames)
        if isinstance(value, staticmethod):
            wrapped = staticmethod(wrapped)
        elif isinstance(value, classmethod):
            wrapped = classmethod(wrapped)
        setattr(namespace, name, wrapped)
