"""One thread setting for every compute library OneModel drives: the BLAS behind numpy and the
kernels of plugins (numba's workers). Two libraries each sizing their own pool make them spin
against each other, so both follow this one number.

The setting is ``ONEMODEL_NUM_THREADS`` from the environment, or what :func:`set_num_threads`
(or ``Session(..., threads=N)``) last set; by default, every CPU. It is process-wide, like
``OMP_NUM_THREADS``. Kernel plugins read :func:`num_threads` and :data:`generation` (which
changes with every new setting) and resize their pools when it moved: one int compare per call.
"""

from __future__ import annotations

import os
import threading
import warnings

from .errors import OneModelError

ENV = "ONEMODEL_NUM_THREADS"

_lock = threading.Lock()
_threads: int | None = None  # None: not yet read from the environment
generation = 0  # bumped by every change; plugins compare it with the value they applied
_blas_applied: int | None = None


def _from_env() -> int | None:
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        raise OneModelError(f"{ENV}={raw!r} is not a whole number; set it to the number of "
                            "threads to use (1 or more), or unset it to use every CPU") from None
    if n < 1:
        raise OneModelError(f"{ENV}={raw!r}: the thread count must be 1 or more")
    return n


def num_threads() -> int:
    """The number of threads compute libraries should use."""
    if _threads is None:
        configure(None)
    return _threads  # type: ignore[return-value]


def set_num_threads(n: int) -> None:
    """Use ``n`` threads (1 or more) for the BLAS and every kernel plugin, process-wide."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise OneModelError(f"threads must be a whole number of 1 or more, got {n!r}")
    configure(n)


def configure(n: int | None) -> None:
    """Apply ``n`` threads, or (``None``) the environment's setting if none is applied yet.
    With neither, every CPU is used and the BLAS is left as its own settings made it (so a
    user's ``OPENBLAS_NUM_THREADS`` still holds)."""
    global _threads, generation
    with _lock:
        explicit = n is not None
        if n is None:
            if _threads is not None:
                return
            n = _from_env()
            explicit = n is not None
            if n is None:
                n = os.cpu_count() or 1
        if n != _threads:
            _threads = n
            generation += 1
        if explicit:
            _apply_blas(n)


def _apply_blas(n: int) -> None:
    global _blas_applied
    if _blas_applied == n:
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        warnings.warn("threadpoolctl is not installed, so the BLAS thread count was not set "
                      f"to {n}; pip install threadpoolctl (onemodel-numba depends on it)",
                      RuntimeWarning, stacklevel=3)
        _blas_applied = n
        return
    threadpool_limits(limits=n, user_api="blas")
    _blas_applied = n
