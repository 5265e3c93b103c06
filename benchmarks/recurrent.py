"""Recurrent layers: PyTorch's LSTM and GRU (one layer, random weights) exported to ONNX by
PyTorch, run by OneModel's Session, onnxruntime and PyTorch eager on the same inputs, one thread
each. Timed in pairs (the three in turn, the order rotating); printed: each engine's median and
the median of the per-run ratios against onnxruntime and PyTorch.

    python benchmarks/recurrent.py [--runs 101]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "ONEMODEL_NUM_THREADS"):
    os.environ[_var] = "1"
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

# (cell, steps, batch, inputs, hidden, bidirectional)
CASES = [("LSTM", 50, 2, 32, 64, False), ("GRU", 50, 2, 32, 64, False),
         ("LSTM", 50, 1, 64, 128, False), ("GRU", 50, 1, 64, 128, False),
         ("LSTM", 100, 4, 40, 64, True), ("GRU", 100, 4, 40, 64, True),
         ("LSTM", 20, 8, 128, 256, False), ("GRU", 20, 8, 128, 256, False)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=101)
    args = parser.parse_args(argv)
    import numpy as np
    import onnxruntime as ort
    import torch

    from onemodel.runtime import Session

    torch.set_num_threads(1)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    print(f"one thread, median of {args.runs} runs each, timed in turn")
    print(f"{'layer':34s} {'ORT us':>8s} {'torch us':>9s} {'ours us':>8s} {'/ORT':>6s} "
          f"{'/torch':>7s} {'max diff':>9s}")
    with tempfile.TemporaryDirectory() as tmp:
        for cell, steps, batch, inputs, hidden, both in CASES:
            torch.manual_seed(0)
            kind = torch.nn.LSTM if cell == "LSTM" else torch.nn.GRU
            net = kind(inputs, hidden, bidirectional=both).eval()
            x = torch.randn(steps, batch, inputs)
            path = Path(tmp) / f"{cell}_{steps}_{batch}_{hidden}.onnx"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(net, (x,), str(path), dynamo=False, input_names=["x"],
                                  output_names=["y"], opset_version=17)
            feed = x.numpy()
            ours = Session.load(path, threads=1)
            theirs = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            got = ours.run({"x": feed}, return_numpy=True)["y"]
            want = theirs.run(None, {"x": feed})[0]
            diff = float(np.max(np.abs(got - want)))
            def eager(net=net, x=x):
                with torch.no_grad():
                    net(x)
            engines = [lambda s=theirs, f=feed: s.run(None, {"x": f}), eager,
                       lambda s=ours, f=feed: s.run({"x": f})]
            times: list[list[float]] = [[], [], []]
            for fn in engines:
                fn()
            for k in range(args.runs):
                for j in range(3):
                    i = (j + k) % 3
                    t0 = time.perf_counter()
                    engines[i]()
                    times[i].append(time.perf_counter() - t0)
            med = [statistics.median(t) * 1e6 for t in times]
            r_ort = statistics.median(o / t for o, t in zip(times[2], times[0]))
            r_torch = statistics.median(o / t for o, t in zip(times[2], times[1]))
            label = f"{cell} T{steps} N{batch} I{inputs} H{hidden}" + (" bi" if both else "")
            print(f"{label:34s} {med[0]:8.1f} {med[1]:9.1f} {med[2]:8.1f} {r_ort:5.2f}x "
                  f"{r_torch:6.2f}x {diff:9.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
