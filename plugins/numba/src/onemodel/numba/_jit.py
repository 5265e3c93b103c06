"""The numba side shared by every kernel module: the decorator (on-disk cache on, compiled
lazily per dtype signature), serial or parallel per call, and the thread count kept in step with
``onemodel.tensors.threads``. Importing this module imports numba; the plugin's hook module
never does."""

from __future__ import annotations

import os

# numba's OpenMP workers must sleep, not spin, between kernels: the BLAS runs its own threads
# on the same cores. libgomp reads this once, when it is loaded (numba's import can load it),
# so it is set here, unless the user set it; it also applies to other OpenMP users in the
# process (PyTorch), which is why the training benchmark sets its own value first.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numba
from onemodel.tensors import threads

_applied = -1
_launched = False  # numba's thread pool started (by a setting above one thread)
_parallel = False  # more than one thread: parallel variants are worth their start-up
# bytes touched below which a kernel runs serially even with threads to spare
PARALLEL_MIN_BYTES = 1 << 18


def jit(parallel: bool = False, fastmath=False):
    """``numba.njit`` with the on-disk cache (``NUMBA_CACHE_DIR``) and the GIL released. With
    ``parallel``, a serial and a parallel (``prange``) variant, chosen per call by size.
    ``fastmath`` (a set of LLVM flags, e.g. ``{"reassoc"}``) lets a float reduction run in
    vector lanes; kernels pass only flags that keep NaN and infinity semantics."""
    def wrap(fn):
        opts = dict(cache=True, nogil=True, error_model="numpy", fastmath=fastmath)
        serial = numba.njit(**opts)(fn)
        if not parallel:
            return serial
        return _Dual(serial, numba.njit(parallel=True, **opts)(fn))
    return wrap


class _Dual:
    """A kernel compiled twice: serially for small calls and one thread, in parallel else."""

    def __init__(self, serial, parallel):
        self.serial = serial
        self.parallel = parallel
        self.py_func = serial.py_func

    def __call__(self, *args):
        if _parallel:
            size = 0
            for a in args:
                size += getattr(a, "nbytes", 0)
            if size >= PARALLEL_MIN_BYTES:
                return self.parallel(*args)
        return self.serial(*args)


def sync_threads() -> None:
    """Size numba's pool to the process's thread setting, when that setting changed. With one
    thread only serial variants run, so the pool is not even started."""
    global _applied, _parallel, _launched
    if _applied != threads.generation or _applied < 0:
        n = min(threads.num_threads(), numba.config.NUMBA_NUM_THREADS)
        if n > 1:
            numba.set_num_threads(n)
            _launched = True
        elif _launched:
            numba.set_num_threads(1)
        _parallel = n > 1
        _applied = threads.generation
