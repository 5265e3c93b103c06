"""``Communicator``: the few MPI collectives data-parallel training needs, each with a deadline.

MPI's blocking collectives wait forever for a rank that died or hangs. Every collective here is
started non-blocking and polled until a deadline, so a missing rank becomes a
:class:`CollectiveTimeoutError` that names the collective, this rank and the timeout.
mpi4py is imported when a communicator is first made, never at package import.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from typing import Any

import numpy as np

from .errors import CollectiveTimeoutError, DistributedError

ENV_TIMEOUT = "ONEMODEL_DIST_TIMEOUT"
DEFAULT_TIMEOUT = 300.0


def default_timeout() -> float:
    """Seconds a collective may wait: ``$ONEMODEL_DIST_TIMEOUT`` or 300."""
    raw = os.environ.get(ENV_TIMEOUT)
    if raw is None:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        raise DistributedError(f"{ENV_TIMEOUT}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise DistributedError(f"{ENV_TIMEOUT} must be positive, got {raw}")
    return value


def import_mpi():
    """mpi4py's ``MPI`` module, or an error that says how to install it."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise DistributedError(
            f"data-parallel training needs mpi4py and an MPI library ({exc}); install them with "
            "pip install 'onemodel-distributed[mpi]'"
        ) from None
    return MPI


class Communicator:
    """An MPI communicator with timed collectives on numpy buffers.

    ``Communicator()`` wraps ``MPI.COMM_WORLD``; ``Communicator(comm)`` any mpi4py
    communicator. A plain ``python train.py`` (no launcher) is a world of one rank."""

    def __init__(self, comm: Any = None, *, timeout: float | None = None):
        self.MPI = import_mpi()
        self.comm = self.MPI.COMM_WORLD if comm is None else comm
        if not isinstance(self.comm, self.MPI.Comm):
            raise DistributedError(f"comm must be an mpi4py communicator (MPI.Comm), not "
                                   f"{type(self.comm).__name__}")
        self.timeout = default_timeout() if timeout is None else float(timeout)
        if self.timeout <= 0:
            raise DistributedError(f"timeout must be a positive number of seconds, got {timeout}")
        self.rank: int = self.comm.Get_rank()
        self.size: int = self.comm.Get_size()

    @classmethod
    def wrap(cls, comm: Any = None, *, timeout: float | None = None) -> Communicator:
        if isinstance(comm, Communicator):
            if timeout is not None and timeout != comm.timeout:
                return cls(comm.comm, timeout=timeout)
            return comm
        return cls(comm, timeout=timeout)

    def dup(self) -> Communicator:
        """A communicator over the same ranks whose collectives never interleave with ours."""
        return Communicator(self.comm.Dup(), timeout=self.timeout)

    # non-blocking starts ----------------------------------------------------------------------
    def iallreduce(self, buf: np.ndarray):
        """Start an in-place sum of ``buf`` over all ranks; returns the request."""
        return self.comm.Iallreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)

    def wait(self, request, what: str) -> None:
        """Wait for ``request`` until the deadline; then raise naming ``what`` was waited for."""
        if request.Test():
            return
        now = time.monotonic()
        deadline, spin_until = now + self.timeout, now + 5e-4
        delay = 0.0  # poll without sleeping first: most waits end within microseconds
        while not request.Test():
            now = time.monotonic()
            if now > spin_until:
                delay = min(delay * 2 or 1e-5, 1e-4)  # then sleep, briefly: it is every step
                time.sleep(delay)
            if now > deadline:
                _abort_at_exit(self)
                raise CollectiveTimeoutError(
                    f"rank {self.rank} of {self.size}: {what} did not complete within "
                    f"{self.timeout:g} s: another rank has died, hangs, or runs different code. "
                    f"Look at the other ranks' output; raise the limit with timeout= or "
                    f"${ENV_TIMEOUT} if a step is legitimately that slow"
                )

    # blocking, timed ---------------------------------------------------------------------------
    def allreduce_(self, buf: np.ndarray, what: str = "allreduce") -> np.ndarray:
        """Sum ``buf`` over all ranks in place and return it."""
        if self.size > 1:
            self.wait(self.iallreduce(buf), what)
        return buf

    def bcast_(self, buf: np.ndarray, root: int = 0, what: str = "broadcast") -> np.ndarray:
        """Overwrite ``buf`` with rank ``root``'s values and return it."""
        if self.size > 1:
            self.wait(self.comm.Ibcast(buf, root=root), what)
        return buf

    def barrier(self, what: str = "barrier") -> None:
        if self.size > 1:
            self.wait(self.comm.Ibarrier(), what)

    def abort(self, code: int = 1) -> None:
        """End every rank of the job now (after an error that the others cannot see)."""
        self.comm.Abort(code)


_timed_out: list[Communicator] = []


def _abort_at_exit(comm: Communicator) -> None:
    """After a timed-out collective MPI cannot finalize (it would wait for the missing rank
    forever), so at exit this process aborts the job instead: the error is printed first, then
    the launcher ends every rank."""
    if not _timed_out:
        atexit.register(_abort_timed_out)
    _timed_out.append(comm)


def _abort_timed_out() -> None:
    if _timed_out:
        sys.stderr.flush()
        _timed_out[0].abort(1)
