"""Training-step time against PyTorch eager on CPU, one thread each, same shapes and data.

MLP 784-256-256-10 at batch 64 and 256, and a CNN (conv 3x3 32 ch, relu, maxpool, conv 3x3
64 ch, relu, maxpool, linear) at batch 32 on 28x28, each with SGD(momentum=0.9) and cross
entropy. Prints the median step time of each library over several repeats and the ratio.

    python benchmarks/training_step.py [--steps 20] [--repeats 5]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "ONEMODEL_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy loads its BLAS; ONEMODEL_: numba kernels too
# onemodel-numba sets OMP_WAIT_POLICY=PASSIVE for its OpenMP workers unless it is set; PyTorch
# shares libgomp and ran up to 2x slower under it, so pin libgomp's active policy for both (at
# one thread numba starts no workers at all)
os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def build(lib, kind):
    if kind == "mlp":
        return lib.Sequential(lib.Linear(784, 256), lib.ReLU(), lib.Linear(256, 256), lib.ReLU(),
                              lib.Linear(256, 10))
    return lib.Sequential(lib.Conv2d(1, 32, 3, padding=1), lib.ReLU(), lib.MaxPool2d(2),
                          lib.Conv2d(32, 64, 3, padding=1), lib.ReLU(), lib.MaxPool2d(2),
                          lib.Flatten(), lib.Linear(64 * 7 * 7, 10))


def time_steps(step, steps: int, repeats: int) -> float:
    step()  # warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - t0) / steps)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import torch

    from onemodel import training as T
    from onemodel.tensors import Tensor

    torch.set_num_threads(1)
    cases = [("MLP 784-256-256-10", "mlp", (64, 784)), ("MLP 784-256-256-10", "mlp", (256, 784)),
             ("CNN 28x28", "cnn", (32, 1, 28, 28))]
    print(f"{'model':22s} {'batch':>5s} {'onemodel ms':>12s} {'torch ms':>9s} {'ratio':>6s}")
    for name, kind, shape in cases:
        rng = np.random.default_rng(0)
        x = rng.standard_normal(shape).astype(np.float32)
        y = rng.integers(0, 10, shape[0]).astype(np.int64)
        theirs = build(torch.nn, kind)
        ours = build(T, kind)
        ours.load_state_dict({k: v.detach().numpy().copy() for k, v in theirs.state_dict().items()})
        t_opt = torch.optim.SGD(theirs.parameters(), 0.01, momentum=0.9)
        o_opt = T.SGD(ours.parameters(), 0.01, momentum=0.9)
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
        ox, oy = Tensor.from_numpy(x), Tensor.from_numpy(y)

        def t_step(model=theirs, opt=t_opt, x=tx, y=ty):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

        def o_step(model=ours, opt=o_opt, x=ox, y=oy):
            with T.ActivationScope():
                opt.zero_grad()
                T.losses.cross_entropy(model(x), y).backward()
                opt.step()

        # interleave the two so drift on a noisy machine hits both alike
        o_times, t_times = [], []
        for _ in range(args.repeats):
            o_times.append(time_steps(o_step, args.steps, 1))
            t_times.append(time_steps(t_step, args.steps, 1))
        o_ms, t_ms = statistics.median(o_times) * 1e3, statistics.median(t_times) * 1e3
        print(f"{name:22s} {shape[0]:5d} {o_ms:12.2f} {t_ms:9.2f} {o_ms / t_ms:5.2f}x")


if __name__ == "__main__":
    main()
