"""Eager overhead of a small op: Add of two 4-element F32 tensors, with and without autograd.

Prints the time per call of onemodel, PyTorch and raw numpy, measured in one run on the same
inputs, and the ratios. Each figure is the median of several repeats (the machine is noisy).

    python benchmarks/eager_overhead.py [--repeats 15] [--number 20000]
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import numpy as np


def median_us(stmt, number: int, repeats: int) -> float:
    times = timeit.repeat(stmt, number=number, repeat=repeats)
    return statistics.median(times) / number * 1e6


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
    rows = {
        "numpy np.add": median_us(lambda: np.add(a_np, b_np), args.number, args.repeats),
        "onemodel a + b": median_us(lambda: a + b, args.number, args.repeats),
        "onemodel a + b (a requires grad)": median_us(lambda: ag + b, args.number, args.repeats),
    }
    try:
        import torch

        torch.set_num_threads(1)
        ta, tb = torch.from_numpy(a_np.copy()), torch.from_numpy(b_np.copy())
        tag = torch.from_numpy(a_np.copy()).requires_grad_()
        rows["torch a + b"] = median_us(lambda: ta + tb, args.number, args.repeats)
        rows["torch a + b (a requires grad)"] = median_us(lambda: tag + tb, args.number,
                                                          args.repeats)
    except ImportError:
        print("PyTorch is not installed: only numpy ratios are printed")

    for name, us in rows.items():
        print(f"{name:36s} {us:7.3f} us")
    print()
    print(f"onemodel / numpy (no grad):   {rows['onemodel a + b'] / rows['numpy np.add']:.2f}x")
    if "torch a + b" in rows:
        print(f"onemodel / torch (no grad):   {rows['onemodel a + b'] / rows['torch a + b']:.2f}x")
        print("onemodel / torch (with grad): "
              f"{rows['onemodel a + b (a requires grad)'] / rows['torch a + b (a requires grad)']:.2f}x")


if __name__ == "__main__":
    main()
