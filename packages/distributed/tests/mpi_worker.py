"""Training program the MPI tests run: under ``mpirun -n 2`` with DistributedDataParallel, or
with ``--plain`` as one ordinary process over the full batch (the oracle, no distributed code).

    python mpi_worker.py {mlp,cnn} OUT [--plain] [--die-at STEP] [--hang-at STEP] [--timeout S]

Writes OUT/rank<R>.npz: the per-step losses and the final state dict; rank 0 also writes the
checkpoint OUT/model.ckpt.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from onemodel.tensors import Generator, Tensor
from onemodel.training import (
    SGD,
    Adam,
    BatchNorm1d,
    BatchNorm2d,
    Conv2d,
    DataLoader,
    Flatten,
    Linear,
    MaxPool2d,
    ReLU,
    Sequential,
    losses,
)

ROWS, GLOBAL_BATCH, STEPS = 64, 16, 20


def build(kind: str, seed: int):
    g = Generator(seed)
    if kind == "mlp":
        return Sequential(Linear(8, 16, g), ReLU(), Linear(16, 16, g), BatchNorm1d(16), ReLU(),
                          Linear(16, 3, g))
    return Sequential(Conv2d(3, 4, 3, padding=1, bias=False, generator=g), BatchNorm2d(4), ReLU(),
                      MaxPool2d(2), Conv2d(4, 6, 3, padding=1, bias=False, generator=g), BatchNorm2d(6),
                      ReLU(), Flatten(), Linear(6 * 4 * 4, 5, g))


def data(kind: str):
    rng = np.random.default_rng(1234)
    if kind == "mlp":
        x = rng.standard_normal((ROWS, 8)).astype(np.float32)
        return x, (x @ rng.standard_normal((8, 3)).astype(np.float32)).astype(np.float32)
    x = rng.standard_normal((ROWS, 3, 8, 8)).astype(np.float32)
    return x, rng.integers(0, 5, ROWS).astype(np.int64)


def loss_fn(kind: str, out: Tensor, y: Tensor) -> Tensor:
    return losses.mse(out, y) if kind == "mlp" else losses.cross_entropy(out, y)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["mlp", "cnn"])
    ap.add_argument("out")
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--die-at", type=int, default=-1)
    ap.add_argument("--hang-at", type=int, default=-1)
    ap.add_argument("--timeout", type=float, default=None)
    ap.add_argument("--bucket-mb", type=float, default=0.001)  # several buckets even here
    args = ap.parse_args()
    out = Path(args.out)
    x, y = data(args.kind)

    if args.plain:
        from onemodel.distributed import DistributedSampler

        rank, world = 0, 1
        model = build(args.kind, 0)
        net = model
        sampler = DistributedSampler(ROWS, num_replicas=1, rank=0, seed=7)
    else:
        from onemodel.distributed import (
            DistributedDataParallel,
            DistributedSampler,
            convert_sync_batchnorm,
        )

        model = build(args.kind, 0)
        from onemodel.distributed import Communicator

        comm = Communicator(timeout=args.timeout)
        rank, world = comm.rank, comm.size
        if rank != 0:  # different initial weights: the broadcast from rank 0 must fix them
            model = build(args.kind, 100 + rank)
        model = convert_sync_batchnorm(model, comm)
        net = DistributedDataParallel(model, comm, bucket_cap_mb=args.bucket_mb)
        assert len(net.buckets) > 1, "the test wants several buckets"
        sampler = DistributedSampler(ROWS, comm=comm, seed=7)

    params = list(net.parameters())
    opt = SGD(params, lr=0.05, momentum=0.9) if args.kind == "mlp" else Adam(params, lr=0.01)
    loader = DataLoader(x, y, batch_size=GLOBAL_BATCH // world, sampler=sampler)
    step_losses = []
    epoch = 0
    while len(step_losses) < STEPS:
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            step = len(step_losses)
            if rank == 1 and step == args.die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if rank == 1 and step == args.hang_at:
                time.sleep(120)
            opt.zero_grad()
            loss = loss_fn(args.kind, net(xb), yb)
            loss.backward()
            opt.step()
            step_losses.append(loss.item() if args.plain else net.average(loss))
            if len(step_losses) == STEPS:
                break
        epoch += 1

    state = {k: v.numpy() for k, v in model.state_dict().items()}
    np.savez(out / f"rank{rank}.npz", losses=np.array(step_losses), **state)
    if not args.plain:
        net.save_checkpoint(out / "model.ckpt", opt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
