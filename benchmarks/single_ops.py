"""Single ONNX ops whose kernels numpy alone runs poorly (normalizations over planes, Einsum,
ConvTranspose, TopK over long rows, Pad): each a one-node ONNX model run by OneModel's Session
and onnxruntime on the same inputs, one thread, timed in turn. Printed: both medians, the median
of the per-run ratios and the largest difference. An Identity model shows the per-run cost of
the two sessions themselves.

    python benchmarks/single_ops.py [--runs 201]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "ONEMODEL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402


def _cases(rng):
    """(label, node as (op, inputs, outputs, attributes), feeds, initializers, opset)."""
    def f32(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def i64(*values):
        return np.array(values, np.int64)

    yield "Identity 2x4", ("Identity", ["x"], ["y"], {}), {"x": f32(2, 4)}, {}, 17
    for shape in ((2, 16, 32, 32), (1, 64, 64, 64)):
        c = shape[1]
        yield (f"InstanceNormalization {'x'.join(map(str, shape))}",
               ("InstanceNormalization", ["x", "s", "b"], ["y"], {}), {"x": f32(*shape)},
               {"s": f32(c), "b": f32(c)}, 17)
    yield ("GroupNormalization 2x32x16x16, 8 groups",
           ("GroupNormalization", ["x", "s", "b"], ["y"], {"num_groups": 8}),
           {"x": f32(2, 32, 16, 16)}, {"s": f32(32), "b": f32(32)}, 21)
    yield ("Einsum bij,bjk->bik 8x32x32", ("Einsum", ["a", "b"], ["y"],
                                          {"equation": "bij,bjk->bik"}),
           {"a": f32(8, 32, 32), "b": f32(8, 32, 32)}, {}, 17)
    for x, w, attrs in (((2, 16, 16, 16), (16, 8, 4, 4), {"strides": (2, 2), "pads": (1, 1, 1, 1)}),
                        ((1, 64, 32, 32), (64, 32, 4, 4), {"strides": (2, 2), "pads": (1, 1, 1, 1)}),
                        ((2, 256, 8, 8), (256, 128, 2, 2), {"strides": (2, 2)})):
        yield (f"ConvTranspose {'x'.join(map(str, x))} k{w[2]} s2 -> {w[1]}",
               ("ConvTranspose", ["x", "w", "b"], ["y"], attrs), {"x": f32(*x)},
               {"w": f32(*w), "b": f32(w[1])}, 17)
    for shape, k in (((2, 1000), 5), ((1, 25200), 100), ((2, 8400), 300), ((1, 100000), 100)):
        yield (f"TopK k={k} of {'x'.join(map(str, shape))}",
               ("TopK", ["x", "k"], ["y", "i"], {}), {"x": f32(*shape)}, {"k": i64(k)}, 17)
    pad1 = i64(0, 0, 1, 1, 0, 0, 1, 1)
    yield ("Pad constant 2x16x32x32 by 1", ("Pad", ["x", "p"], ["y"], {}),
           {"x": f32(2, 16, 32, 32)}, {"p": pad1}, 17)
    for mode, shape, pads in (("reflect", (2, 16, 32, 32), pad1),
                              ("reflect", (1, 64, 64, 64), i64(0, 0, 3, 3, 0, 0, 3, 3)),
                              ("edge", (2, 16, 32, 32), pad1)):
        yield (f"Pad {mode} {'x'.join(map(str, shape))} by {pads[2]}",
               ("Pad", ["x", "p"], ["y"], {"mode": mode}), {"x": f32(*shape)}, {"p": pads}, 17)


def _model(node, feeds, inits, opset):
    from onnx import TensorProto, helper, numpy_helper

    op, inputs, outputs, attrs = node
    graph = helper.make_graph(
        [helper.make_node(op, inputs, outputs, **attrs)], "single",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in feeds.items()],
        [helper.make_tensor_value_info(o, TensorProto.INT64 if o == "i" else TensorProto.FLOAT,
                                       None) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 21 else 8
    return model.SerializeToString()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=201)
    args = parser.parse_args(argv)
    import onnxruntime as ort

    from onemodel.runtime import Session

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    print(f"one thread, median of {args.runs} runs each, timed in turn")
    print(f"{'op':44s} {'ORT us':>9s} {'ours us':>9s} {'ratio':>7s} {'max diff':>9s}")
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for k, (label, node, feeds, inits, opset) in enumerate(_cases(rng)):
            path = Path(tmp) / f"op{k}.onnx"
            path.write_bytes(_model(node, feeds, inits, opset))
            ours = Session.load(path, threads=1)
            try:
                theirs = ort.InferenceSession(str(path), opts,
                                              providers=["CPUExecutionProvider"])
            except Exception as exc:  # an onnxruntime without the op at this opset
                print(f"{label:44s} onnxruntime: {str(exc).splitlines()[0][:60]}")
                continue
            got = ours.run(feeds, return_numpy=True)[node[2][0]]
            want = theirs.run(None, feeds)[0]
            diff = float(np.max(np.abs(np.asarray(got, np.float64) - want))) if want.size else 0.0
            engines = (lambda s=theirs, f=feeds: s.run(None, f),
                       lambda s=ours, f=feeds: s.run(f))
            for fn in engines:
                fn()
            times: tuple[list[float], list[float]] = ([], [])
            for r in range(args.runs):
                for j in ((0, 1) if r % 2 == 0 else (1, 0)):
                    t0 = time.perf_counter()
                    engines[j]()
                    times[j].append(time.perf_counter() - t0)
            ratio = statistics.median(o / t for o, t in zip(times[1], times[0]))
            print(f"{label:44s} {statistics.median(times[0]) * 1e6:9.1f} "
                  f"{statistics.median(times[1]) * 1e6:9.1f} {ratio:6.2f}x {diff:9.1e}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
