"""Time to trace and save the tracing tests' models (MLP, CNN with BatchNorm and Dropout,
transformer encoder layer) at batch 4, against torch.jit.trace + torch.jit.save of the same
architectures; and what the structural check costs (the second trace at other sizes of the
symbolic axes that catches size-dependent Python control flow), as a ratio to torch.jit.trace.
Each repeat runs the three in turn (paired); medians of the times and of the per-repeat ratios.

    python benchmarks/trace_time.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "packages/tracing/tests"))
from models import cnn, encoder, mlp

from onemodel.tensors import Tensor
from onemodel.tracing import trace_module


def once_ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def torch_models():
    import torch
    from torch import nn

    return {
        "mlp": (nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 32),
                              nn.ReLU(), nn.Linear(32, 5)), (4, 12)),
        "cnn": (nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                              nn.MaxPool2d(2), nn.Dropout(0.3), nn.Conv2d(8, 8, 3, padding=1),
                              nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                              nn.Linear(32, 4)), (4, 3, 8, 8)),
        "encoder": (nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True),
                    (4, 6, 16)),
    }, torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    ours = {"mlp": (mlp(), (4, 12), ("batch", None)),
            "cnn": (cnn(), (4, 3, 8, 8), ("batch", None, None, None)),
            "encoder": (encoder(), (4, 6, 16), ("batch", None, None))}
    try:
        theirs, torch = torch_models()
        torch.set_num_threads(1)
    except ImportError:
        theirs, torch = {}, None
        print("PyTorch is not installed: only onemodel's times are printed")
    tmp = Path(tempfile.mkdtemp())
    print(f"{'model':8s} {'onemodel ms':>12s} {'unchecked ms':>13s} {'torch.jit ms':>13s} "
          f"{'ratio':>6s} {'check/jit':>10s}")
    for name, (model, shape, axes) in ours.items():
        example = Tensor.randn(*shape)

        def ours_fn(model=model, example=example, axes=axes, name=name):
            model.trace(example, *axes).save(tmp / f"{name}.onemodel")

        def unchecked_fn(model=model, example=example, axes=axes, name=name):
            trace_module(model, example, *axes, verify=False).save(tmp / f"{name}.onemodel")

        fns = [ours_fn, unchecked_fn]
        if name in theirs:
            tmodel, tshape = theirs[name]
            tmodel.eval()
            tx = torch.randn(*tshape)

            def theirs_fn(tmodel=tmodel, tx=tx):
                traced = torch.jit.trace(tmodel, tx, check_trace=False)
                torch.jit.save(traced, io.BytesIO())

            fns.append(theirs_fn)
        for fn in fns:  # warm up
            fn()
        runs = [[once_ms(fn) for fn in fns] for _ in range(args.repeats)]
        o, u = (statistics.median(r[i] for r in runs) for i in (0, 1))
        if len(fns) == 3:
            t = statistics.median(r[2] for r in runs)
            ratio = statistics.median(r[0] / r[2] for r in runs)
            check = statistics.median((r[0] - r[1]) / r[2] for r in runs)
            print(f"{name:8s} {o:12.2f} {u:13.2f} {t:13.2f} {ratio:5.2f}x {check:9.2f}x")
        else:
            print(f"{name:8s} {o:12.2f} {u:13.2f}")


if __name__ == "__main__":
    main()
