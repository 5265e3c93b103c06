"""Time to trace and save the tracing tests' models (MLP, CNN with BatchNorm and Dropout,
transformer encoder layer) at batch 4, against torch.jit.trace + torch.jit.save of the same
architectures. Medians of several runs; same process.

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


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


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
    print(f"{'model':8s} {'onemodel ms':>12s} {'torch.jit ms':>13s} {'ratio':>6s}")
    for name, (model, shape, axes) in ours.items():
        example = Tensor.randn(*shape)

        def ours_fn(model=model, example=example, axes=axes, name=name):
            model.trace(example, *axes).save(tmp / f"{name}.onemodel")

        o = median_ms(ours_fn, args.repeats)
        if name in theirs:
            tmodel, tshape = theirs[name]
            tmodel.eval()
            tx = torch.randn(*tshape)

            def theirs_fn(tmodel=tmodel, tx=tx):
                traced = torch.jit.trace(tmodel, tx, check_trace=False)
                torch.jit.save(traced, io.BytesIO())

            t = median_ms(theirs_fn, args.repeats)
            print(f"{name:8s} {o:12.2f} {t:13.2f} {o / t:5.2f}x")
        else:
            print(f"{name:8s} {o:12.2f}")


if __name__ == "__main__":
    main()
