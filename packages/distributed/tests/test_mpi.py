"""Data-parallel training on 2 MPI ranks (started here with mpirun on this machine) against one
ordinary process over the full batch: the oracle uses no distributed code at all."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mpi4py")

from onemodel.distributed import launch

WORKER = str(Path(__file__).with_name("mpi_worker.py"))
# the reference kernels only: the numba plugin's compile time is not what these tests measure
ENV = {**os.environ, "ONEMODEL_DISABLE_PLUGIN_AUTOLOAD": "1"}


def _mpirun(args, timeout=120):
    try:
        launch.mpirun_path()
    except Exception as exc:  # the mpi extra without its launcher
        pytest.skip(str(exc))
    return launch.run(2, [WORKER, *args], timeout=timeout, capture=True, env=ENV)


def _plain(args):
    return subprocess.run([sys.executable, WORKER, *args, "--plain"], env=ENV, capture_output=True,
                          text=True, timeout=120)


def _close(got: np.ndarray, want: np.ndarray) -> float:
    got, want = got.astype(np.float64), want.astype(np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_two_ranks_train_like_one_process_with_the_full_batch(kind, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    plain = _plain([kind, str(one)])
    assert plain.returncode == 0, plain.stderr
    run = _mpirun([kind, str(two), "--timeout", "60"])
    assert run.returncode == 0, run.stdout + run.stderr
    want = np.load(one / "rank0.npz")
    rank0, rank1 = np.load(two / "rank0.npz"), np.load(two / "rank1.npz")
    assert sorted(want.files) == sorted(rank0.files)
    assert len(want["losses"]) == 20
    for key in want.files:
        assert np.array_equal(rank0[key], rank1[key]), f"replicas differ in {key}"
        assert _close(rank0[key], want[key]) < 1e-5, (key, rank0[key], want[key])
    assert want["losses"][-1] < want["losses"][0]  # it did train

    # rank 0's checkpoint loads into a fresh model and gives the trained weights
    sys.path.insert(0, str(Path(WORKER).parent))
    try:
        import mpi_worker
    finally:
        sys.path.pop(0)
    from onemodel.training import SGD, Adam, Checkpoint

    fresh = mpi_worker.build(kind, 42)
    opt = (SGD if kind == "mlp" else Adam)(list(fresh.parameters()), lr=0.1)
    meta = Checkpoint.load(two / "model.ckpt", fresh, opt)
    assert meta["optimizer"] == type(opt).__name__
    for key, value in fresh.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), rank0[key])
    assert not list(two.glob("*.tmp*")), "the atomic write left a temporary file"


@pytest.mark.slow
def test_killed_rank_ends_the_job_with_an_error(tmp_path):
    start = time.monotonic()
    run = _mpirun(["mlp", str(tmp_path), "--timeout", "10", "--die-at", "3"], timeout=60)
    took = time.monotonic() - start
    assert run.returncode != 0
    assert took < 30, f"the job took {took:.0f} s to end"
    out = run.stdout + run.stderr
    assert "rank 1" in out and ("signal 9" in out or "CollectiveTimeoutError" in out), out
    assert not (tmp_path / "rank0.npz").exists()


@pytest.mark.slow
def test_hung_rank_times_out_with_a_clear_error(tmp_path):
    start = time.monotonic()
    run = _mpirun(["mlp", str(tmp_path), "--timeout", "4", "--hang-at", "3"], timeout=60)
    took = time.monotonic() - start
    assert run.returncode != 0
    assert took < 40, f"the job took {took:.0f} s to end (rank 1 sleeps 120 s)"
    out = run.stdout + run.stderr
    assert "CollectiveTimeoutError: rank 0 of 2:" in out, out
    assert "did not complete within 4 s" in out
