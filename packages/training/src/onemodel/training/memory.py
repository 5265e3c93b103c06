"""Freed memory kept in the process while it trains (glibc's malloc; elsewhere nothing changes).

An eager training step allocates its activations, gradients and kernel scratch anew and frees
them together when the step ends. glibc then hands the top of its heap back to the system (its
trim threshold follows the largest block freed so far, a few MiB), so the next step faults every
page in again, each a zeroed page: ``benchmarks/training_step.py``'s CNN took 3,324 page faults
a step, 22 ms against 15 ms without them (docs/benchmarks.md, "Eleventh round").

So the first optimizer made in a process raises glibc's trim threshold to 256 MiB (freed memory
is kept for the next step, up to that much above the heap's use) and sets its mmap threshold to
32 MiB, glibc's own upper bound for it (setting either switches off glibc's moving thresholds,
which would otherwise keep blocks of a few MiB in their own mappings, faulted in on each use).
Blocks above 32 MiB still get their own mappings. A user's own ``MALLOC_*`` settings or
``GLIBC_TUNABLES`` win, and ``ONEMODEL_KEEP_FREED_MEMORY=0`` leaves malloc as it is.
"""

from __future__ import annotations

import ctypes
import os
import sys

_M_TRIM_THRESHOLD = -1  # mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD = 256 << 20
MMAP_THRESHOLD = 32 << 20
_USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_",
                  "GLIBC_TUNABLES")

_applied: bool | None = None  # None: not tried yet in this process


def keep_freed_memory() -> bool:
    """Set glibc's thresholds as the module docstring says, once per process; whether they are
    set (False: not glibc, switched off, or the user's own settings)."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _apply() -> bool:
    if os.environ.get("ONEMODEL_KEEP_FREED_MEMORY", "1").strip() == "0" or \
            not sys.platform.startswith("linux") or any(v in os.environ for v in _USER_SETTINGS):
        return False
    try:
        libc = ctypes.CDLL(None)  # the C library this process already runs on
        mallopt = libc.mallopt
        is_glibc = hasattr(libc, "gnu_get_libc_version")  # musl's mallopt does nothing
    except (OSError, AttributeError):
        return False
    if not is_glibc:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
