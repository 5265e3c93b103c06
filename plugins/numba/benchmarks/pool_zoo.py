"""Per zoo network: the MaxPool/AveragePool calls of one session run, each timed with the
reference kernel and with the numba kernel on the same input (medians of 9 paired calls), summed
per network. The evidence for registering the numba pooling kernels.

    ONEMODEL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python plugins/numba/benchmarks/pool_zoo.py [network ...]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "integration-tests" / "onnx"))
import zoo

from onemodel.numba import pool
from onemodel.onnx.importer import from_model
from onemodel.runtime import Session
from onemodel.tensors.ops import OPS

NUMBA = {"MaxPool": pool.max_pool, "AveragePool": pool.average_pool}


def record(calls: list, op: str):
    def kernel(X, **attrs):
        calls.append((op, np.array(X), attrs))
        return NUMBA[op](X, **attrs)
    return kernel


def timed(fn, X, attrs) -> float:
    t = time.perf_counter()
    fn(X, **attrs)
    return time.perf_counter() - t


def main() -> None:
    calls: list = []
    pool.max_pool, pool.average_pool = record(calls, "MaxPool"), record(calls, "AveragePool")
    for name in sys.argv[1:] or zoo.available():
        calls.clear()
        model = zoo.randomized(zoo.load(name), seed=1)
        key, x = zoo.data_input(model)
        session = Session(from_model(model), threads=1)
        session.run({key: np.random.default_rng(2).standard_normal(x.shape).astype(np.float32)})
        ref_ms = numba_ms = 0.0
        for op, X, attrs in calls:
            ref, fast = OPS[op].kernel, NUMBA[op]
            ref(X, **attrs)
            fast(X, **attrs)
            pairs = [(timed(ref, X, attrs), timed(fast, X, attrs)) for _ in range(9)]
            ref_ms += statistics.median(p[0] for p in pairs) * 1e3
            numba_ms += statistics.median(p[1] for p in pairs) * 1e3
        ratio = ref_ms / numba_ms if numba_ms else float("nan")
        print(f"{name:14s} {len(calls):2d} pooling calls: reference {ref_ms:6.2f} ms, "
              f"numba {numba_ms:6.2f} ms ({ratio:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
