"""TraceError and where in the user's code it happened."""

from __future__ import annotations

import os
import sys

from onemodel.tensors import OneModelError
from onemodel.tensors.symbolic import internal_file


class TraceError(OneModelError):
    """An operation cannot be recorded in a static graph.

    ``operation`` names it, ``location`` is the user's ``file:line`` (the first frame outside
    OneModel), and the message says what to do instead."""

    def __init__(self, operation: str, reason: str, hint: str = "", location: str | None = None):
        self.operation = operation
        self.location = location or user_location()
        msg = f"{operation} cannot be traced: {reason}"
        if hint:
            msg += f"; {hint}"
        msg += f" (at {self.location})"
        super().__init__(msg)


class TraceWarning(UserWarning):
    """Tracing made a choice the user may not have meant (an ambiguous size match)."""


_ABS: dict[str, str] = {}


def user_location() -> str:
    """``file:line`` of the innermost frame outside the onemodel packages."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not internal_file(filename):
            path = _ABS.get(filename)
            if path is None:
                path = _ABS.setdefault(filename, os.path.abspath(filename))
            return f"{path}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"
