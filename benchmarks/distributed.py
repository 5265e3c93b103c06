"""Scaling out on this machine: data-parallel training throughput on 1 and 2 MPI processes, and
batch inference over Ray against one local Session.

    python benchmarks/distributed.py [--repeats 3] [--steps 30] [--rows 200000]

Training: an MLP 784-256-256-10 with SGD, 128 samples per rank per step (so 2 ranks do twice the
work per step), one BLAS thread per process so each rank has one core. Samples per second count
every rank's samples; scaling efficiency = samples/s on 2 ranks / (2 x samples/s on 1). The 1-
and 2-rank runs alternate, and the figures are medians.

Inference: the same MLP traced and saved as .onemodel, run over ``--rows`` rows in batches of
1024 by ``onemodel.distributed.ray.map_batches`` with 2 actors on ``ray.init(num_cpus=2)``
(loopback only), against one local Session over the same batches in this process. The first Ray
figure includes starting the actors and loading the model in each (what a job pays); the second
counts from the first result on (the actors' running rate).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

THREADS = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
PER_RANK = 128


def _mlp(seed: int = 0):
    from onemodel.tensors import Generator
    from onemodel.training import Linear, ReLU, Sequential

    g = Generator(seed)
    return Sequential(Linear(784, 256, g), ReLU(), Linear(256, 256, g), ReLU(), Linear(256, 10, g))


def worker(steps: int, alone: bool) -> None:
    """One rank's training loop (run under mpirun by the parent). ``alone``: each rank trains
    by itself (a world of one), which measures what the two cores give without communication."""
    from mpi4py import MPI

    from onemodel.distributed import Communicator, DistributedDataParallel
    from onemodel.tensors import Tensor
    from onemodel.training import SGD, losses

    world = Communicator(timeout=120)
    comm = Communicator(MPI.COMM_SELF, timeout=120) if alone else world
    net = DistributedDataParallel(_mlp(), comm, bucket_cap_mb=1.0)
    opt = SGD(list(net.parameters()), lr=0.01)
    rng = np.random.default_rng(comm.rank)
    x = Tensor.from_numpy(rng.standard_normal((PER_RANK, 784)).astype(np.float32))
    y = Tensor.from_numpy(rng.integers(0, 10, PER_RANK).astype(np.int64))

    def step():
        opt.zero_grad()
        losses.cross_entropy(net(x), y).backward()
        opt.step()

    for _ in range(5):
        step()
    world.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    world.barrier()
    took = time.perf_counter() - start
    if world.rank == 0:
        print(json.dumps({"samples_per_s": steps * PER_RANK * world.size / took}), flush=True)


def training(repeats: int, steps: int) -> dict[str, float]:
    from onemodel.distributed import launch

    env = {**os.environ, **THREADS}
    configs = {"1": (1, []), "2": (2, []), "2 alone": (2, ["--alone"])}
    runs: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(repeats):
        for key, (n, extra) in configs.items():
            out = launch.run(n, [__file__, "--worker", "--steps", str(steps), *extra],
                             capture=True, env=env, timeout=600)
            if out.returncode:
                sys.exit(f"mpirun -n {n} failed:\n{out.stdout}\n{out.stderr}")
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1]
            runs[key].append(json.loads(line)["samples_per_s"])
    return {n: statistics.median(v) for n, v in runs.items()}


def inference(rows: int, repeats: int) -> tuple[float, float, float]:
    """Medians over ``repeats`` alternating runs: local Session, Ray (rows/s), Ray after its
    first result (rows/s)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only
    import ray
    import ray.data

    from onemodel.distributed.ray import map_batches
    from onemodel.runtime import Session
    from onemodel.tensors import Tensor

    folder = Path(tempfile.mkdtemp())
    path = folder / "mlp.onemodel"
    _mlp().eval().trace(Tensor.from_numpy(np.zeros((8, 784), np.float32)), "batch",
                        None).save(path)
    x = np.random.default_rng(0).standard_normal((rows, 784)).astype(np.float32)
    session = Session.load(path)
    name = session.inputs[0].name

    def local_pass() -> float:
        start = time.perf_counter()
        for i in range(0, rows, 1024):
            session.run({name: x[i:i + 1024]})
        return rows / (time.perf_counter() - start)

    local_pass()  # plans and any kernel compilation
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1", configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    results: list[tuple[float, float, float]] = []
    try:
        block = 5 * 1024
        ds = ray.data.from_numpy([x[i:i + block] for i in range(0, rows, block)])
        ds = ds.materialize()  # the data in the object store before the clock starts
        for _ in range(repeats):
            local = local_pass()
            start = time.perf_counter()
            out = map_batches(ds, path, batch_size=1024, num_actors=2, columns={name: "data"})
            count, first, first_rows = 0, None, 0
            for b in out.iter_batches(batch_size=None, batch_format="numpy"):
                count += len(b["data"])
                if first is None:  # the actors are up and the model loaded
                    first, first_rows = time.perf_counter(), count
            end = time.perf_counter()
            results.append((local, count / (end - start), (count - first_rows) / (end - first)))
    finally:
        ray.shutdown()
    local, remote, steady = (statistics.median(r[k] for r in results) for k in range(3))
    return local, remote, steady


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--alone", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rows", type=int, default=200_000)
    args = ap.parse_args()
    if args.worker:
        worker(args.steps, args.alone)
        return 0
    os.environ.update(THREADS)
    os.environ.setdefault("NUMBA_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".numba_cache"))
    tput = training(args.repeats, args.steps)
    print(f"training, MLP 784-256-256-10, {PER_RANK} samples per rank per step, 1 BLAS thread "
          f"per process (median of {args.repeats}):")
    print(f"  1 process                 : {tput['1']:8.0f} samples/s")
    print(f"  2 processes, DDP          : {tput['2']:8.0f} samples/s  scaling efficiency "
          f"{tput['2'] / (2 * tput['1']):.2f} on {os.cpu_count()} cores")
    print(f"  2 processes, no exchange  : {tput['2 alone']:8.0f} samples/s  (what the cores "
          f"allow: efficiency {tput['2 alone'] / (2 * tput['1']):.2f}; DDP reaches "
          f"{tput['2'] / tput['2 alone']:.2f} of it)")
    local, remote, steady = inference(args.rows, args.repeats)
    print(f"inference, same MLP, {args.rows} rows in batches of 1024 (median of "
          f"{args.repeats}):")
    print(f"  one local Session         : {local:9.0f} rows/s")
    print(f"  Ray, 2 actors             : {remote:9.0f} rows/s  ({remote / local:.2f}x, actor start "
          "and model load included)")
    print(f"  Ray, after the first batch: {steady:9.0f} rows/s  ({steady / local:.2f}x, once the "
          "actors are running)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
