"""Opening a model file as a Session with the command's options."""

from __future__ import annotations

import inspect

from onemodel.tensors import OneModelError

from ..session import Session


def open_session(path: str, threads: int | None = None) -> Session:
    options = {}
    if threads is not None:
        if threads < 1:
            raise OneModelError(f"--threads must be at least 1, got {threads}")
        if "threads" not in inspect.signature(Session.load).parameters:
            raise OneModelError("this onemodel-runtime has no thread setting")
        options["threads"] = threads
    return Session.load(path, **options)
