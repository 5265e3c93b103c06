"""The numba plugin's vector-register convolution kernels against the path the same convolution
takes without them and against onnxruntime's Conv, on convolutions of the real-model suite
(``benchmarks/realmodels.py``: torchvision networks at 2x3x64x64, transformers at 2x3x32x32)
with constant float32 weights. One thread; bias and Relu on every call.

- Register tiles (``tiled``) against im2col columns and a BLAS GEMM, the skinny product,
  Winograd or, for 1x1 convolutions, BLAS on the input; 1x1 rows are also timed with 64 MiB
  read before each call (their weights come from memory in a model's run).
- Depthwise convolutions in vector lanes (``depthwise_lanes``) against the kernel of the
  plan's path (the planned call with the lanes turned off).
- Small 1x1 convolutions on register tiles (``pointwise``: pixel or channel lanes) against
  the planned call without them (the columns kernel of small convolutions, or BLAS).

Each row: the medians in microseconds (the engines timed in turn, paired), the new kernel's
time over the other path's and over onnxruntime's, whether the plan takes it, and for the
tiles their arithmetic rate.

    python benchmarks/tiled_conv.py [--calls 200]
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

# (input, weights, strides, pads, dilations, a model that has it)
SHAPES = [
    ((2, 3, 32, 32), (32, 3, 8, 8), 8, 0, 1, "vit (patches)"),
    ((2, 3, 64, 64), (64, 3, 7, 7), 2, 3, 1, "tv_densenet121 (stem)"),
    ((2, 3, 64, 64), (64, 3, 3, 3), 2, 0, 1, "tv_squeezenet (stem)"),
    ((2, 3, 64, 64), (96, 3, 4, 4), 4, 0, 1, "tv_convnext_tiny (stem)"),
    ((2, 16, 15, 15), (64, 16, 3, 3), 1, 1, 1, "tv_squeezenet"),
    ((2, 32, 7, 7), (128, 32, 3, 3), 1, 1, 1, "tv_squeezenet"),
    ((2, 48, 3, 3), (192, 48, 3, 3), 1, 1, 1, "tv_squeezenet"),
    ((2, 64, 3, 3), (256, 64, 3, 3), 1, 1, 1, "tv_squeezenet"),
    ((2, 128, 16, 16), (32, 128, 3, 3), 1, 1, 1, "tv_densenet121"),
    ((2, 128, 8, 8), (32, 128, 3, 3), 1, 1, 1, "tv_densenet121"),
    ((2, 128, 4, 4), (32, 128, 3, 3), 1, 1, 1, "tv_densenet121"),
    ((2, 128, 2, 2), (32, 128, 3, 3), 1, 1, 1, "tv_densenet121"),
    ((2, 64, 16, 16), (64, 64, 3, 3), 1, 1, 1, "tv_resnet18"),
    ((2, 64, 16, 16), (128, 64, 3, 3), 2, 1, 1, "tv_resnet18"),
    ((2, 128, 8, 8), (256, 128, 3, 3), 2, 1, 1, "tv_resnet18"),
    ((2, 256, 4, 4), (256, 256, 3, 3), 1, 1, 1, "tv_resnet18"),
    ((2, 96, 16, 16), (192, 96, 2, 2), 2, 0, 1, "tv_convnext_tiny"),
    ((2, 192, 8, 8), (384, 192, 2, 2), 2, 0, 1, "tv_convnext_tiny"),
    ((2, 128, 16, 16), (128, 128, 3, 3), 2, 1, 1, "tv_fcn_resnet50"),
    ((2, 256, 8, 8), (256, 256, 3, 3), 1, 2, 2, "tv_fcn_resnet50"),
    ((2, 512, 8, 8), (512, 512, 3, 3), 1, 4, 4, "tv_fcn_resnet50"),
    ((2, 192, 2, 2), (1152, 192, 1, 1), 1, 0, 1, "tv_efficientnet_b0"),
    ((2, 1152, 2, 2), (320, 1152, 1, 1), 1, 0, 1, "tv_efficientnet_b0"),
    ((2, 1024, 2, 2), (128, 1024, 1, 1), 1, 0, 1, "tv_densenet121"),
    ((2, 112, 4, 4), (672, 112, 1, 1), 1, 0, 1, "tv_efficientnet_b0"),
]
# (input, output channels, a model that has it): 1x1 convolutions
POINTWISE = [
    ((2, 8, 8, 8), 48, "mobilenet_v2 (transformers)"),
    ((2, 8, 4, 4), 48, "mobilenet_v2 (transformers)"),
    ((2, 144, 2, 2), 24, "mobilenet_v2 (transformers)"),
    ((2, 24, 2, 2), 144, "mobilenet_v2 (transformers)"),
    ((2, 240, 1, 1), 40, "mobilenet_v2 (transformers)"),
    ((2, 40, 1, 1), 240, "mobilenet_v2 (transformers)"),
    ((2, 8, 16, 16), 48, "mobilenet_v2 (transformers)"),
    ((2, 672, 1, 1), 28, "tv_efficientnet_b0 (SE)"),
    ((2, 48, 3, 3), 192, "tv_squeezenet"),
    ((2, 96, 4, 4), 40, "tv_mobilenet_v3_small"),
    ((2, 24, 16, 16), 16, "tv_mnasnet"),
    ((2, 576, 4, 4), 128, "tv_densenet121"),
    ((2, 960, 4, 4), 160, "tv_lraspp_mobilenet_v3"),
    ((2, 128, 8, 8), 128, "tv_densenet121"),
    ((2, 24, 16, 16), 144, "tv_efficientnet_b0"),
    ((2, 96, 2, 2), 576, "tv_mnasnet"),
    ((1, 240, 1, 1), 64, "batch 1 (SE)"),
]
# (input, window, stride, a model that has it): depthwise, pads k // 2
DEPTHWISE = [
    ((2, 24, 32, 32), 3, 2, "tv_mnasnet"),
    ((2, 96, 32, 32), 3, 2, "tv_efficientnet_b0"),
    ((2, 144, 16, 16), 5, 2, "tv_efficientnet_b0"),
    ((2, 48, 16, 16), 5, 2, "tv_mnasnet"),
    ((2, 72, 16, 16), 5, 1, "tv_mobilenet_v3_small"),
    ((2, 240, 8, 8), 5, 1, "tv_efficientnet_b0"),
    ((2, 96, 8, 8), 3, 1, "tv_lraspp_mobilenet_v3"),
    ((2, 480, 4, 4), 3, 1, "tv_efficientnet_b0"),
    ((2, 672, 4, 4), 5, 1, "tv_efficientnet_b0"),
    ((2, 32, 32, 32), 3, 1, "tv_efficientnet_b0"),
    ((2, 144, 16, 16), 3, 1, "tv_efficientnet_b0"),
    ((1, 96, 112, 112), 3, 2, "MobileNetV2 at 224"),
    ((1, 32, 112, 112), 3, 1, "MobileNetV2 at 224"),
    ((1, 960, 7, 7), 3, 1, "MobileNetV2 at 224"),
]


def _onnxruntime(x, w, b, s, p, d, group=1):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[p] * 4, strides=[s, s],
                              dilations=[d, d], group=group),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), opts,
                                   providers=["CPUExecutionProvider"])
    return lambda: session.run(None, {"x": x})[0]


def _paired_us(fns, calls: int, before=None) -> list[float]:
    for fn in fns:
        for _ in range(10):
            fn()
    times = [[] for _ in fns]
    for _ in range(calls):
        for fn, ts in zip(fns, times):
            if before is not None:
                before()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) * 1e6 for ts in times]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    from onemodel.numba import conv, tiled, winograd
    from onemodel.tensors import threads

    threads.set_num_threads(1)
    if not tiled.host_has_fma():
        print("this CPU has no AVX2/FMA: the tiles are never chosen")
        return 0
    rng = np.random.default_rng(0)
    sweep = np.ones(16 << 20, np.float32)  # 64 MiB: more than the last-level cache
    print(f"{'input':18s} {'weights':18s} s d  {'model':24s} {'other':>6s} {'us':>8s} "
          f"{'tiles':>8s} {'ORT':>8s}  {'/other':>6s} {'/ORT':>5s} taken GMAC/s")
    for xs, ws, s, p, d, model in SHAPES:
        x = rng.standard_normal(xs).astype(np.float32)
        w = np.frombuffer(rng.standard_normal(ws).astype(np.float32).tobytes(),
                          np.float32).reshape(ws)
        b = rng.standard_normal(ws[0]).astype(np.float32)
        plan = conv._plan(xs, ws, 4, ws[2:], (s, s), (p,) * 4, (d, d), "NOTSET", 1, True)
        is_winograd = plan[0] in (conv._BY_IMAGE, conv._ONE_GEMM) and \
            winograd.fits(plan, xs, ws, 1)
        taken = isinstance(conv._prepared_weights(plan, xs, w), tiled.Tiled)
        other = conv._Winograd(winograd.weights(w), winograd.run) if is_winograd else None
        tiles = tiled.Tiled(w, plan, xs)
        y_other, y_tiles = np.empty(plan[1], np.float32), np.empty(plan[1], np.float32)
        ort_call = _onnxruntime(x, np.asarray(w), b, s, p, d)
        t_other, t_tiles, t_ort = _paired_us(
            [partial(conv._run, x, w, b, True, 1, 1, plan, y_other, other),
             partial(tiles.run, x, b, True, 1, plan, y_tiles), ort_call], args.calls)
        want = ort_call()
        scale = max(float(np.abs(want).max()), 1.0)
        assert float(np.abs(y_tiles - want).max()) <= 1e-5 * scale, (xs, ws)
        n, m, oh, ow = plan[1]
        macs = n * m * oh * ow * xs[1] * ws[2] * ws[3]
        name = "wino" if is_winograd else {conv._SKINNY: "skinny", conv._DIRECT: "BLAS"}.get(
            plan[0], "cols")
        print(f"{xs!s:18s} {ws!s:18s} {s} {d}  {model:24s} {name:>6s} {t_other:8.1f} "
              f"{t_tiles:8.1f} {t_ort:8.1f}  {t_tiles / t_other:6.2f} {t_tiles / t_ort:5.2f} "
              f"{'yes' if taken else 'no':5s} {macs / t_tiles / 1e3:6.1f}")
        if ws[2:] == (1, 1):
            t_other, t_tiles, t_ort = _paired_us(
                [partial(conv._run, x, w, b, True, 1, 1, plan, y_other, other),
                 partial(tiles.run, x, b, True, 1, plan, y_tiles), ort_call],
                max(10, args.calls // 10), sweep.sum)
            print(f"{'':18s} {'':18s}      {'(weights from memory)':24s} {'':>6s} "
                  f"{t_other:8.1f} {t_tiles:8.1f} {t_ort:8.1f}  {t_tiles / t_other:6.2f} "
                  f"{t_tiles / t_ort:5.2f}")
    _depthwise(args.calls, rng)
    _pointwise(args.calls, rng)
    return 0


def _pointwise(calls: int, rng) -> None:
    from onemodel.numba import conv, pointwise
    from onemodel.tensors.ops.specialize import CallSite, specialize

    print(f"\n{'1x1 input':18s} {'M':>5s}  {'model':28s} {'kernel':>7s} {'other':>8s} "
          f"{'tiles':>8s} {'ORT':>8s}  {'/other':>6s} {'/ORT':>5s} taken")
    real_fits, real_kernel = pointwise.fits, pointwise.kernel
    for xs, m, model in POINTWISE:
        x = rng.standard_normal(xs).astype(np.float32)
        w = np.frombuffer(rng.standard_normal((m, xs[1], 1, 1)).astype(np.float32).tobytes(),
                          np.float32).reshape(m, xs[1], 1, 1)
        b = np.frombuffer(rng.standard_normal(m).astype(np.float32).tobytes(), np.float32)
        attrs = dict(activation="Relu")
        generic = partial(conv.fused_conv, **attrs)
        want = generic(x, w, b)
        site = CallSite((x.shape, w.shape, b.shape), (x.dtype,) * 3, (None, w, b), attrs,
                        (want.shape,), generic)
        plan = conv._plan(xs, w.shape, 4, None, None, None, None, "NOTSET", 1, True)
        taken = real_fits(plan, xs, w.shape, 1)
        # the rule's kernel, or where the rule takes neither, the one for this plane's size
        chosen = real_kernel(plan, xs, 1) or (
            pointwise.channel_lanes if (xs[2] * xs[3]) % 8 else pointwise.pixel_lanes)
        try:  # the plan's own kernel, then the tiles, whatever fits says
            pointwise.fits = lambda *a: False
            other = specialize(conv.fused_conv, site)
            pointwise.fits = lambda *a: True
            pointwise.kernel = lambda *a, _chosen=chosen: _chosen
            tiles = specialize(conv.fused_conv, site)
            assert tiles.__name__ == "pointwise_at", xs
        finally:
            pointwise.fits, pointwise.kernel = real_fits, real_kernel
        y_other, y_tiles = np.empty(want.shape, np.float32), np.empty(want.shape, np.float32)
        ort_call = _onnxruntime(x, np.asarray(w), np.asarray(b), 1, 0, 1)
        t_other, t_tiles, t_ort = _paired_us(
            [partial(other, x, w, b, out=y_other), partial(tiles, x, w, b, out=y_tiles),
             ort_call], calls)
        assert float(np.abs(y_tiles - want).max()) <= 1e-5 * max(float(np.abs(want).max()), 1)
        name = chosen.__name__.split("_")[0]
        print(f"{xs!s:18s} {m:5d}  {model:28s} {name:>7s} {t_other:8.1f} {t_tiles:8.1f} "
              f"{t_ort:8.1f}  {t_tiles / t_other:6.2f} {t_tiles / t_ort:5.2f} "
              f"{'yes' if taken else 'no'}")


def _depthwise(calls: int, rng) -> None:
    from onemodel.numba import conv, depthwise_lanes
    from onemodel.tensors.ops.specialize import CallSite, specialize

    print(f"\n{'depthwise input':18s} {'k':>3s} s  {'model':24s} {'other':>6s} {'us':>8s} "
          f"{'lanes':>8s} {'ORT':>8s}  {'/other':>6s} {'/ORT':>5s} taken")
    real_fits = depthwise_lanes.fits
    for xs, k, s, model in DEPTHWISE:
        c, p = xs[1], k // 2
        x = rng.standard_normal(xs).astype(np.float32)
        w = np.frombuffer(rng.standard_normal((c, 1, k, k)).astype(np.float32).tobytes(),
                          np.float32).reshape(c, 1, k, k)
        b = np.frombuffer(rng.standard_normal(c).astype(np.float32).tobytes(), np.float32)
        attrs = dict(group=c, pads=(p,) * 4, strides=(s, s), activation="Relu")
        generic = partial(conv.fused_conv, **attrs)
        want = generic(x, w, b)
        site = CallSite((x.shape, w.shape, b.shape), (x.dtype,) * 3, (None, w, b), attrs,
                        (want.shape,), generic)
        plan = conv._plan(xs, w.shape, 4, None, (s, s), (p,) * 4, None, "NOTSET", c, True)
        taken = real_fits(plan, xs, np.float32, c)
        try:  # the plan's own kernel, then the lanes, whatever fits says
            depthwise_lanes.fits = lambda *a: False
            other = specialize(conv.fused_conv, site)
            depthwise_lanes.fits = lambda *a: True
            lanes = specialize(conv.fused_conv, site)
        finally:
            depthwise_lanes.fits = real_fits
        y_other, y_lanes = np.empty(want.shape, np.float32), np.empty(want.shape, np.float32)
        ort_call = _onnxruntime(x, np.asarray(w), np.asarray(b), s, p, 1, group=c)
        t_other, t_lanes, t_ort = _paired_us(
            [partial(other, x, w, b, out=y_other), partial(lanes, x, w, b, out=y_lanes),
             ort_call], calls)
        assert float(np.abs(y_lanes - want).max()) <= 1e-5 * max(float(np.abs(want).max()), 1)
        name = {conv._DW_NHWC: "nhwc", conv._DW_FLAT: "flat", conv._DW_TAPS: "taps",
                conv._DW_TABLE: "table"}.get(plan[0], "other")
        print(f"{xs!s:18s} {k:3d} {s}  {model:24s} {name:>6s} {t_other:8.1f} {t_lanes:8.1f} "
              f"{t_ort:8.1f}  {t_lanes / t_other:6.2f} {t_lanes / t_ort:5.2f} "
              f"{'yes' if taken else 'no'}")


if __name__ == "__main__":
    raise SystemExit(main())
