"""Opening a model file as a Session with the command's options."""

from __future__ import annotations

from onemodel.tensors import OneModelError

from ..session import Session


def open_session(path: str, threads: int | None = None, *, level: str = "all",
                 profile: bool = False) -> Session:
    if threads is not None and threads < 1:
        raise OneModelError(f"--threads must be at least 1, got {threads}")
    return Session.load(path, threads=threads, optimization_level=level, profile=profile)
