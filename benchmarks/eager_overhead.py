"""Eager overhead of a small op: Add of two 4-element F32 tensors, with and without autograd.

Prints the time per call of onemodel, PyTorch and raw numpy, measured in one run on the same
inputs, and the ratios. The cases are timed interleaved, and each ratio is the median of the
per-repeat ratios (the machine is noisy).

    python benchmarks/eager_overhead.py [--repeats 15] [--number 20000]
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--number", type=int, default=20000)
    args = parser.parse_args()

    from onemodel.tensors import Tensor

    a_np = np.arange(4, dtype=np.float32)
    b_np = np.ones(4, dtype=np.float32)
    a, b = Tensor.from_numpy(a_np.copy()), Tensor.from_numpy(b_np.copy())
    ag = Tensor.from_numpy(a_np.copy()).requires_grad_()
    cases = {
        "numpy np.add": lambda: np.add(a_np, b_np),
        "onemodel a + b": lambda: a + b,
        "onemodel a + b (a requires grad)": lambda: ag + b,
    }
    try:
        import torch

        torch.set_num_threads(1)
        ta, tb = torch.from_numpy(a_np.copy()), torch.from_numpy(b_np.copy())
        tag = torch.from_numpy(a_np.copy()).requires_grad_()
        cases["torch a + b"] = lambda: ta + tb
        cases["torch a + b (a requires grad)"] = lambda: tag + tb
    except ImportError:
        print("PyTorch is not installed: only numpy ratios are printed")

    # interleaved: each repeat times every case once, so drift on a noisy machine hits all alike
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.repeats):
        for name, fn in cases.items():
            times[name].append(timeit.timeit(fn, number=args.number) / args.number * 1e6)
    for name, ts in times.items():
        print(f"{name:36s} {statistics.median(ts):7.3f} us")
    print()

    def ratio(x: str, y: str) -> float:  # median of the per-repeat ratios
        return statistics.median(p / q for p, q in zip(times[x], times[y]))

    print(f"onemodel / numpy (no grad):   {ratio('onemodel a + b', 'numpy np.add'):.2f}x")
    if "torch a + b" in times:
        print(f"onemodel / torch (no grad):   {ratio('onemodel a + b', 'torch a + b'):.2f}x")
        print("onemodel / torch (with grad): "
              f"{ratio('onemodel a + b (a requires grad)', 'torch a + b (a requires grad)'):.2f}x")


if __name__ == "__main__":
    main()
