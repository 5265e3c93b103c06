"""Release of intermediate tensors: the mechanism under ``onemodel.training.ActivationScope``.

While a :class:`TensorScope` is open, every tensor that eager dispatch creates is remembered;
when it closes, those tensors drop their data and their gradient-tape node, so memory held by
activations goes back at once even if the program still references the tensors. Using a released
tensor raises :class:`~onemodel.tensors.errors.ReleasedTensorError`. Tensors made outside dispatch
(parameters, gradients, optimizer state, data) are never touched, and ``keep(t)`` spares one.
"""

from __future__ import annotations

import threading

from . import dispatch as _dispatch
from .errors import ReleasedTensorError


class _Released:
    """Stands in for the array of a released tensor; any use raises a clear error."""

    __slots__ = ()

    def __getattr__(self, name):
        raise ReleasedTensorError(
            "this tensor was released when its ActivationScope ended; keep what you need with "
            "scope.keep(tensor), or read values (loss.item()) inside the block"
        )

    def __array__(self, *args, **kwargs):
        self.__getattr__("__array__")

    def __len__(self):
        self.__getattr__("__len__")


RELEASED = _Released()


class _Stack(threading.local):
    def __init__(self):
        self.scopes: list[TensorScope] = []


_stack = _Stack()


class TensorScope:
    """``with TensorScope() as scope:`` releases the tensors dispatch created inside the block."""

    def __init__(self):
        self._created: list = []
        self._kept: set[int] = set()
        self._thread = threading.get_ident()

    def keep(self, *tensors):
        """Spare these tensors when the scope ends; returns the first for convenience."""
        for t in tensors:
            self._kept.add(id(t))
        return tensors[0] if tensors else None

    def _remember(self, result) -> None:
        if threading.get_ident() != self._thread:
            return  # another thread's tensors are not this scope's
        if isinstance(result, tuple):
            self._created.extend(result)
        else:
            self._created.append(result)

    def __enter__(self) -> TensorScope:
        self._thread = threading.get_ident()
        _stack.scopes.append(self)
        _dispatch.set_observer(self._remember)
        return self

    def __exit__(self, *exc) -> bool:
        _stack.scopes.pop()
        _dispatch.set_observer(_stack.scopes[-1]._remember if _stack.scopes else None)
        outer = _stack.scopes[-1] if _stack.scopes else None
        for t in self._created:
            if id(t) in self._kept:
                if outer is not None:
                    outer._created.append(t)
                continue
            t._data = RELEASED
            t._node = None
            t.grad = None
        self._created.clear()
        return False
