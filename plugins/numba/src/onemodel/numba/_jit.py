"""The numba side shared by every kernel module: the decorator (on-disk cache on, compiled
lazily per dtype signature) and the thread count, kept in step with ``onemodel.tensors.threads``.
Importing this module imports numba; the plugin's hook module never does."""

from __future__ import annotations

import numba
from onemodel.tensors import threads

_applied = -1


def jit(parallel: bool = False):
    """``numba.njit`` with the on-disk cache (``NUMBA_CACHE_DIR``) and the GIL released."""
    return numba.njit(cache=True, nogil=True, parallel=parallel, error_model="numpy")


def sync_threads() -> None:
    """Size numba's pool to the process's thread setting, when that setting changed."""
    global _applied
    if _applied != threads.generation or _applied < 0:
        n = min(threads.num_threads(), numba.config.NUMBA_NUM_THREADS)
        numba.set_num_threads(n)
        _applied = threads.generation
