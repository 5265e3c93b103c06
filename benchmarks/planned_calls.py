"""The numba plugin's planned calls timed alone, one thread: the per-call cost a plan pays around
its kernels, and the weights' trip from memory. No onnxruntime here (its per-node figures come
with its own session's cost; see single_ops.py and realmodels.py for paired comparisons):

- small calls: a planned depthwise convolution, small convolution and MaxPool called with the
  same input and out= arrays each time (as a plan's buffers come) and with one of eight input
  arrays in turn (as a caller's fresh arrays come); a global average over 1x1 planes;
- 1x1: a planned 1x1 convolution (bias and Relu) over small planes;
- 3x3: planned 3x3 convolutions with 16-24 channels (Winograd's narrow rule);
- patches: a ViT's and a ConvNeXt's patch convolution;
- skinny: the numba product of few columns by weights in cache (the call repeated) and out of
  cache (64 MiB read between calls, as a model's other weights and onnxruntime's evict them);
- panels: MatMul by weights packed into 24-column panels against BLAS (numpy's matmul) and,
  on up to 32 rows, the skinny product, the weights in cache and out of cache (the real
  suite's ConvNeXt-T, Swin-T and transformer shapes, and classifier heads of 1-3 rows);
- attention: FusedAttention heads on the register tiles against the BLAS path;
- permuted LayerNorm: a LayerNormalization over a permuted (N, H, W, C) view of channels-first
  data (ConvNeXt's), planned, against a copy of the view and the row kernel;
- narrow tiles: a 16-output stem on tiles of sixteen channels against two blocks of eight.

Each figure is the median of many calls in microseconds.

    python benchmarks/planned_calls.py [--calls 400]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "ONEMODEL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from functools import partial  # noqa: E402

import numpy as np  # noqa: E402


def _median_us(fn, calls: int, before=None) -> float:
    for _ in range(min(30, calls)):
        fn()
    times = []
    for _ in range(calls):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _frozen(rng, shape):
    """Random weights read-only over immutable bytes, as a model file's constants are."""
    return np.frombuffer(rng.standard_normal(shape).astype(np.float32).tobytes(),
                         np.float32).reshape(shape)


def _planned(kernel, inputs, attrs, consts):
    """The plan's specialized call for these inputs (constants at positions ``consts``) and the
    generic call's result."""
    from onemodel.tensors.ops.specialize import CallSite, specialize

    generic = partial(kernel, **attrs)
    want = generic(*inputs)
    site = CallSite(tuple(a.shape for a in inputs), tuple(a.dtype for a in inputs),
                    tuple(a if i in consts else None for i, a in enumerate(inputs)),
                    dict(attrs), (want.shape,), generic)
    call = specialize(kernel, site)
    return (call or generic), want


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=400)
    args = parser.parse_args(argv)
    from onemodel.numba import conv, pool
    from onemodel.tensors import threads

    threads.set_num_threads(1)
    rng = np.random.default_rng(0)
    calls = args.calls

    print("small calls: the same arrays each call / another input array each call (us)")
    cases = [
        ("depthwise 2x48x8x8 3x3", conv.fused_conv, (2, 48, 8, 8), (48, 1, 3, 3),
         dict(activation="Relu", group=48, pads=(1, 1, 1, 1))),
        ("depthwise 2x144x2x2 3x3", conv.fused_conv, (2, 144, 2, 2), (144, 1, 3, 3),
         dict(activation="Relu", group=144, pads=(1, 1, 1, 1))),
        ("small conv 2x96x2x2 -> 16", conv.conv, (2, 96, 2, 2), (16, 96, 1, 1), {}),
        ("small conv 2x48x4x4 -> 8", conv.conv, (2, 48, 4, 4), (8, 48, 1, 1), {}),
    ]
    for label, kernel, xs, ws, attrs in cases:
        x = rng.standard_normal(xs).astype(np.float32)
        w, b = _frozen(rng, ws), _frozen(rng, (ws[0],))
        call, want = _planned(kernel, [x, w, b], attrs, (1, 2))
        out = np.empty_like(want)
        fresh = [x.copy() for _ in range(8)]
        k = [0]

        def new_input(call=call, w=w, b=b, out=out, fresh=fresh, k=k):
            k[0] = (k[0] + 1) % len(fresh)
            call(fresh[k[0]], w, b, out=out)
        same = _median_us(partial(call, x, w, b, out=out), calls)
        print(f"  {label:34s} {same:7.2f} / {_median_us(new_input, calls):7.2f}")
    x = rng.standard_normal((2, 64, 31, 31)).astype(np.float32)
    mp = dict(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1)
    call, want = _planned(pool.max_pool, [x], mp, ())
    out = np.empty_like(want)
    fresh = [x.copy() for _ in range(8)]
    k = [0]

    def new_pool_input():
        k[0] = (k[0] + 1) % len(fresh)
        call(fresh[k[0]], out=out)
    same = _median_us(partial(call, x, out=out), calls)
    print(f"  {'MaxPool 2x64x31x31 3x3/2':34s} {same:7.2f} / {_median_us(new_pool_input, calls):7.2f}")

    x = rng.standard_normal((2, 1280, 1, 1)).astype(np.float32)
    call, want = _planned(pool.global_average_pool, [x], {}, ())
    out = np.empty_like(want)
    print(f"  {'GlobalAveragePool 2x1280x1x1':34s} {_median_us(partial(call, x, out=out), calls):7.2f}")

    print("1x1 convolution, bias and Relu, planned (us)")
    for xs, ws in (((2, 16, 32, 32), (16, 16, 1, 1)), ((2, 24, 16, 16), (72, 24, 1, 1)),
                   ((2, 40, 8, 8), (120, 40, 1, 1)), ((2, 80, 4, 4), (480, 80, 1, 1))):
        x = rng.standard_normal(xs).astype(np.float32)
        w, b = _frozen(rng, ws), _frozen(rng, (ws[0],))
        call, want = _planned(conv.fused_conv, [x, w, b], dict(activation="Relu"), (1, 2))
        out = np.empty_like(want)
        label = f"{'x'.join(map(str, xs))} -> {ws[0]}"
        print(f"  {label:34s} {_median_us(partial(call, x, w, b, out=out), calls):7.2f}")

    print("3x3 convolutions, bias and Relu, planned (us)")
    for xs, ws in (((1, 16, 54, 54), (64, 16, 3, 3)), ((1, 16, 56, 56), (16, 16, 3, 3)),
                   ((2, 16, 32, 32), (64, 16, 3, 3)), ((1, 16, 13, 13), (64, 16, 3, 3)),
                   ((2, 24, 16, 16), (48, 24, 3, 3))):
        x = rng.standard_normal(xs).astype(np.float32)
        w, b = _frozen(rng, ws), _frozen(rng, (ws[0],))
        call, want = _planned(conv.fused_conv, [x, w, b],
                              dict(activation="Relu", pads=(1, 1, 1, 1)), (1, 2))
        out = np.empty_like(want)
        label = f"{'x'.join(map(str, xs))} -> {ws[0]}"
        print(f"  {label:34s} {_median_us(partial(call, x, w, b, out=out), calls):7.2f}")

    print("patch convolutions, planned (us)")
    for xs, ws in (((2, 3, 32, 32), (32, 3, 8, 8)), ((2, 3, 64, 64), (96, 3, 4, 4))):
        x = rng.standard_normal(xs).astype(np.float32)
        w, b = _frozen(rng, ws), _frozen(rng, (ws[0],))
        k = ws[2]
        attrs = dict(kernel_shape=(k, k), strides=(k, k))
        call, want = _planned(conv.conv, [x, w, b], attrs, (1, 2))
        out = np.empty_like(want)
        label = f"{'x'.join(map(str, xs))} {k}x{k}/{k} -> {ws[0]}"
        print(f"  {label:34s} {_median_us(partial(call, x, w, b, out=out), calls):7.2f}")

    print("skinny product, weights in cache / out of cache (us)")
    sweep = np.ones(16 << 20, np.float32)  # 64 MiB: more than the last-level cache
    product = conv._skinny_gemm.serial
    for m, kk, n, dtype in ((1280, 320, 8, np.float32), (1152, 192, 8, np.float32),
                            (192, 1152, 8, np.float32), (1152, 192, 8, np.float64),
                            (768, 768, 10, np.float32)):
        w = rng.standard_normal((m, kk)).astype(dtype)
        xt = rng.standard_normal((n, kk)).astype(dtype)
        res = np.empty(m * n, dtype)
        product(w, xt, res, n, 1)
        assert np.allclose(res.reshape(m, n), w @ xt.T, rtol=1e-3, atol=1e-3)
        hot = _median_us(partial(product, w, xt, res, n, 1), calls)
        cold = _median_us(partial(product, w, xt, res, n, 1), max(20, calls // 8), sweep.sum)
        label = f"{m} x {kk} by {n} {np.dtype(dtype).name}"
        print(f"  {label:34s} {hot:7.1f} / {cold:7.1f}")
    _panels(rng, calls, sweep)
    _attention(rng, calls)
    _permuted_layer_norm(rng, calls)
    _narrow_tiles(rng, calls)
    return 0


def _attention(rng, calls: int) -> None:
    from onemodel.numba import attention

    print("FusedAttention heads (B, H, S, D): lanes / BLAS path (us)")
    for b, h, sq, d in ((2, 2, 17, 16), (2, 4, 5, 8), (2, 2, 24, 16), (2, 2, 32, 16),
                        (2, 2, 32, 32), (2, 12, 7, 64)):
        qkv = rng.standard_normal((b, sq, 3, h, d)).astype(np.float32)  # a merged projection
        q, v = qkv[:, :, 0].transpose(0, 2, 1, 3), qkv[:, :, 2].transpose(0, 2, 1, 3)
        kt = qkv[:, :, 1].transpose(0, 2, 3, 1)
        mask = attention._NO_MASK[np.dtype(np.float32)]
        outs = [np.empty((b, h, sq, d), np.float32) for _ in range(2)]
        scale = np.float32(d ** -0.5)
        fns = [partial(attention._run, q, kt, v, mask, False, scale, out, path)
               for out, path in zip(outs, ("lanes", "blas"))]
        times = [_median_us(fn, calls) for fn in fns]
        assert np.abs(outs[0] - outs[1]).max() <= 1e-5
        taken = attention._path(q.shape, kt.shape, v.shape, np.float32)
        label = f"{b}x{h}x{sq}x{d} (takes {taken})"
        print(f"  {label:34s} {times[0]:7.2f} / {times[1]:7.2f}")


def _permuted_layer_norm(rng, calls: int) -> None:
    from onemodel.numba import norm
    from onemodel.tensors.ops.specialize import CallSite, specialize

    print("LayerNorm of a permuted channels-first view: planned / copy and rows (us)")
    for shape in ((2, 96, 16, 16), (2, 192, 8, 8), (2, 8, 8, 8)):
        c = shape[1]
        view = rng.standard_normal(shape).astype(np.float32).transpose(0, 2, 3, 1)
        scale, bias = _frozen(rng, (c,)), _frozen(rng, (c,))
        site = CallSite((view.shape, (c,), (c,)), (view.dtype,) * 3, (None, scale, bias), {},
                        (view.shape, None, None), norm.layer_normalization)
        call = specialize(norm.layer_normalization, site)  # a node naming Y alone
        want = norm.layer_normalization(np.ascontiguousarray(view), scale, bias)[0]
        assert np.abs(call(view, scale, bias)[0] - want).max() <= 1e-5
        def rows(view=view, scale=scale, bias=bias):
            return norm.layer_normalization(np.ascontiguousarray(view), scale, bias)
        label = "x".join(map(str, view.shape))
        print(f"  {label:34s} {_median_us(partial(call, view, scale, bias), calls):7.2f} / "
              f"{_median_us(rows, calls):7.2f}")


def _narrow_tiles(rng, calls: int) -> None:
    from onemodel.numba import conv, tiled

    print("a 16-output stem 2x3x64x64 3x3/2: tiles of sixteen / two blocks of eight (us)")
    xs, ws, attrs = (2, 3, 64, 64), (16, 3, 3, 3), dict(pads=(1, 1, 1, 1), strides=(2, 2))
    x = rng.standard_normal(xs).astype(np.float32)
    w, b = _frozen(rng, ws), _frozen(rng, (16,))
    want = conv.conv(x, w, b, **attrs)
    prepared = tiled.Tiled(w, conv._plan(xs, ws, 4, None, conv._key(attrs["strides"]),
                                         conv._key(attrs["pads"]), None, "NOTSET", 1, True),
                           xs)
    assert prepared.kernel is tiled._tiles16
    eights = tiled.weights(np.asarray(w), tiled.NARROW_BLOCK)
    y = np.empty_like(want)
    args = (prepared.xoff, prepared.pix_in, np.asarray(b), True, 0, 1, 1, prepared.hp,
            prepared.wq, y)
    tiled._tiles8(x, eights, *args)
    assert np.abs(y - want).max() <= 1e-4
    sixteen = _median_us(partial(tiled._tiles16, x, prepared.wp, *args), calls)
    eight = _median_us(partial(tiled._tiles8, x, eights, *args), calls)
    print(f"  {'2x3x64x64 -> 16':34s} {sixteen:7.2f} / {eight:7.2f}")


def _panels(rng, calls: int, sweep) -> None:
    from onemodel.numba import _jit, conv, panels

    print("MatMul rows x K x N: panels / BLAS / skinny, weights in cache ; out of cache (us)")
    for m, k, n in ((512, 96, 384), (512, 384, 96), (128, 192, 768), (128, 768, 192),
                    (32, 384, 1536), (32, 1536, 384), (8, 768, 3072), (8, 3072, 768),
                    (4, 768, 768), (394, 768, 192), (2048, 768, 3072), (1000, 32, 8),
                    (1, 576, 1024), (2, 576, 1024), (3, 576, 1024), (1, 2048, 1000)):
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        bp, bt = panels.pack(b), np.ascontiguousarray(b.T)
        ys = [np.empty((m, n), np.float32) for _ in range(3)]
        cp = panels.pack_row(None, n)
        run = _jit.entry(panels.product, (a, bp, n, ys[0], cp, False))
        fns = [partial(run, a, bp, n, ys[0], cp, False), partial(np.matmul, a, b, out=ys[1])]
        if m <= 32:
            fns.append(partial(conv._skinny_gemm.serial, bt, a, ys[2].reshape(-1), 1, n))
        reps = max(5, min(calls, int(2e8 // (m * k * n))))
        hot = [_median_us(fn, reps) for fn in fns]
        cold = [_median_us(fn, max(5, reps // 8), sweep.sum) for fn in fns]
        want = a.astype(np.float64) @ b
        assert np.abs(ys[0] - want).max() <= 1e-4 * np.abs(want).max()
        label = f"{m} x {k} x {n}{'' if panels.fits(m, k, n) else ' (not taken)'}"
        print(f"  {label:34s} {' / '.join(f'{t:7.1f}' for t in hot)} ; "
              f"{' / '.join(f'{t:7.1f}' for t in cold)}   panels/BLAS {hot[0] / hot[1]:4.2f} "
              f"; {cold[0] / cold[1]:4.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
