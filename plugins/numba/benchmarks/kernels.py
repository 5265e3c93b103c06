"""Kernel-level timings: each numba kernel against the reference kernel of its op on the same
arrays, paired and interleaved (reference, numba, reference, ...), medians of per-call CPU time
of this thread (``time.thread_time``), so that other jobs on a loaded machine inflate both
sides alike instead of whichever call they preempted. Shapes: the training benchmark's CNN
pooling, the model zoo's global pooling and ShuffleNet's depthwise convolutions, the real-model
suite's convolutions on small planes, softmax over classifier and attention rows.

    ONEMODEL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python plugins/numba/benchmarks/kernels.py [--reps 21]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from onemodel.numba import conv, pool, softmax
from onemodel.tensors.ops import OPS


def paired(ref, ours, args, attrs, reps):
    """(reference ms, numba ms): medians of paired, interleaved per-call CPU times."""
    want, got = ref(*args, **attrs), ours(*args, **attrs)
    tol = 2e-5 if want.dtype == np.float32 else 1e-11
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    r, o = [], []
    for _ in range(reps):
        t0 = time.thread_time()
        ref(*args, **attrs)
        t1 = time.thread_time()
        ours(*args, **attrs)
        t2 = time.thread_time()
        r.append(t1 - t0)
        o.append(t2 - t1)
    return statistics.median(r) * 1e3, statistics.median(o) * 1e3


def cases(rng):
    f32 = np.float32
    for shape, attrs in (((32, 16, 28, 28), dict(kernel_shape=(2, 2), strides=(2, 2))),
                         ((32, 32, 14, 14), dict(kernel_shape=(2, 2), strides=(2, 2))),
                         ((8, 64, 56, 56), dict(kernel_shape=(3, 3), strides=(2, 2),
                                                pads=(1, 1, 1, 1)))):
        x = rng.standard_normal(shape).astype(f32)
        for fwd, grad, fn in (("MaxPool", "MaxPoolGrad", pool.max_pool_grad),
                              ("AveragePool", "AveragePoolGrad", pool.average_pool_grad)):
            dy = rng.standard_normal(OPS[fwd].kernel(x, **attrs).shape).astype(f32)
            k = attrs["kernel_shape"]
            yield f"{grad} {shape} {k[0]}x{k[1]}/{attrs['strides'][0]}", OPS[grad].kernel, fn, \
                (x, dy), attrs
    for shape in ((1, 1024, 7, 7), (1, 2048, 7, 7), (1, 544, 7, 7), (32, 64, 8, 8)):
        yield f"GlobalAveragePool {shape}", OPS["GlobalAveragePool"].kernel, \
            pool.global_average_pool, (rng.standard_normal(shape).astype(f32),), {}
    for shape in ((1, 1000), (64, 1000), (8, 12, 128, 128), (256, 30)):
        x = (rng.standard_normal(shape) * 3).astype(f32)
        for op, fn in (("Softmax", softmax.softmax), ("LogSoftmax", softmax.log_softmax)):
            yield f"{op} {shape} f32", OPS[op].kernel, fn, (x,), {}
    for shape, stride in (((1, 112, 56, 56), 2), ((1, 136, 28, 28), 1), ((1, 136, 28, 28), 2),
                          ((1, 272, 14, 14), 1), ((1, 272, 14, 14), 2), ((1, 544, 7, 7), 1),
                          ((8, 96, 28, 28), 1)):
        c = shape[1]
        x = rng.standard_normal(shape).astype(f32)
        w = rng.standard_normal((c, 1, 3, 3)).astype(f32)
        b = rng.standard_normal(c).astype(f32)
        yield f"Conv depthwise 3x3/{stride} {shape} +bias", OPS["Conv"].kernel, conv.conv, \
            (x, w, b), dict(group=c, strides=(stride, stride), pads=(1, 1, 1, 1))
    # the real-model suite's small planes (batch 2, 64x64 inputs): MobileNetV3's depthwise 5x5
    # (stride 2, and stride 1 on 2x2 planes), LR-ASPP's dilated 5x5 on 4x4 planes, ResNet-18's
    # last 3x3 convolutions (skinny per-image GEMMs) and a 1x1 on 4x4 planes
    for xs, ws, attrs in (((2, 288, 4, 4), (288, 1, 5, 5), dict(group=288, strides=(2, 2),
                                                                 pads=(2, 2, 2, 2))),
                          ((2, 576, 2, 2), (576, 1, 5, 5), dict(group=576, pads=(2, 2, 2, 2))),
                          ((2, 960, 4, 4), (960, 1, 5, 5), dict(group=960, pads=(4, 4, 4, 4),
                                                                 dilations=(2, 2))),
                          ((2, 512, 2, 2), (512, 512, 3, 3), dict(pads=(1, 1, 1, 1))),
                          ((2, 256, 4, 4), (256, 256, 3, 3), dict(pads=(1, 1, 1, 1))),
                          ((2, 160, 4, 4), (960, 160, 1, 1), {})):
        x = rng.standard_normal(xs).astype(f32)
        w = (rng.standard_normal(ws) * 0.1).astype(f32)
        b = rng.standard_normal(ws[0]).astype(f32)
        yield f"Conv {xs} w{ws[0]}x{ws[1]}x{ws[2]}x{ws[3]} +bias", OPS["Conv"].kernel, \
            conv.conv, (x, w, b), attrs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=21)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    for name, ref, ours, arrays, attrs in cases(rng):
        r, o = paired(ref, ours, arrays, attrs, args.reps)
        print(f"{name:50s} reference {r:8.3f} ms  numba {o:8.3f} ms  {r / o:5.2f}x", flush=True)


if __name__ == "__main__":
    main()
