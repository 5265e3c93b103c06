"""Session latency of a hand-built MLP 784-256-256-10 at batch 1 and 64, against eager forward
(the same layers through onemodel.training) and onnxruntime on the same graph, one thread each;
the small CNN of the runtime tests (Conv, BatchNorm, ReLU, pooling, Gemm) at batch 8 against
onnxruntime; plus the executor's per-node overhead (a chain of 200 Adds on one-element tensors).

Each figure is the median of several repeats; the three engines are timed interleaved.

    python benchmarks/session_latency.py [--repeats 7] [--number 200]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "ONEMODEL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import timeit  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "packages/runtime/tests"))
from runtime_graphs import conv_net, mlp  # noqa: E402

from onemodel.runtime import GraphBuilder, Session  # noqa: E402
from onemodel.tensors import DType, Tensor  # noqa: E402


def to_onnx(graph):
    """The hand-built graph as an ONNX model (MatMul, Add, Relu and Identity only)."""
    from onnx import TensorProto, helper, numpy_helper

    def vi(v):
        return helper.make_tensor_value_info(
            v.name, TensorProto.FLOAT, [d if isinstance(d, int) else str(d) for d in v.shape])

    nodes = [helper.make_node(n.op, n.inputs, n.outputs, name=n.name) for n in graph.nodes]
    inits = [numpy_helper.from_array(np.asarray(a), k) for k, a in graph.initializers.items()]
    g = helper.make_graph(nodes, graph.name, [vi(v) for v in graph.inputs],
                          [vi(v) for v in graph.outputs], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def median_us(fn, number, repeats):
    return statistics.median(timeit.repeat(fn, number=number, repeat=repeats)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--number", type=int, default=200)
    args = parser.parse_args()

    from onemodel import training as T

    graph = mlp()
    session = Session(graph)
    eager = T.Sequential(T.Linear(784, 256), T.ReLU(), T.Linear(256, 256), T.ReLU(),
                         T.Linear(256, 10)).eval()
    init = graph.initializers
    eager.load_state_dict({f"{i * 2}.weight": np.array(init[f"fc{i}.weight"]).T.copy()
                           for i in range(3)} | {f"{i * 2}.bias": np.array(init[f"fc{i}.bias"])
                                                 for i in range(3)})
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        ort_session = ort.InferenceSession(to_onnx(graph), opts, providers=["CPUExecutionProvider"])
    except ImportError:
        ort_session = None
        print("onnxruntime is not installed: its column is skipped")

    print(f"{'batch':>5s} {'session us':>11s} {'eager us':>9s} {'ort us':>8s} "
          f"{'vs eager':>9s} {'vs ort':>7s}")
    for batch in (1, 64):
        x = np.random.default_rng(batch).standard_normal((batch, 784)).astype(np.float32)
        xt = Tensor.from_numpy(x)
        ref = session.run({"input": x})["output"].numpy()
        np.testing.assert_allclose(eager(xt).numpy(), ref, rtol=1e-4, atol=1e-4)
        s_times, e_times, o_times = [], [], []
        for _ in range(args.repeats):
            s_times.append(median_us(lambda x=x: session.run({"input": x}), args.number, 1))
            e_times.append(median_us(lambda xt=xt: eager(xt), args.number, 1))
            if ort_session is not None:
                o_times.append(median_us(lambda x=x: ort_session.run(None, {"input": x}),
                                         args.number, 1))
        s, e = statistics.median(s_times), statistics.median(e_times)
        o = statistics.median(o_times) if o_times else float("nan")
        print(f"{batch:5d} {s:11.1f} {e:9.1f} {o:8.1f} {s / e:8.2f}x {s / o:6.2f}x")

    if ort_session is not None:
        from onemodel.onnx.export import to_model

        cnn = conv_net()
        cnn_session = Session(cnn)
        cnn_ort = ort.InferenceSession(to_model(cnn).SerializeToString(), opts,
                                       providers=["CPUExecutionProvider"])
        x = np.random.default_rng(8).standard_normal((8, 3, 16, 16)).astype(np.float32)
        name = cnn.inputs[0].name
        np.testing.assert_allclose(cnn_session.run({name: x})[cnn.outputs[0].name].numpy(),
                                   cnn_ort.run(None, {name: x})[0], rtol=1e-4, atol=1e-4)
        ratios = []
        for _ in range(args.repeats):
            s_us = median_us(lambda x=x: cnn_session.run({name: x}), args.number // 4, 1)
            o_us = median_us(lambda x=x: cnn_ort.run(None, {name: x}), args.number // 4, 1)
            ratios.append((s_us, o_us, s_us / o_us))
        s_us, o_us, r = (statistics.median(v) for v in zip(*ratios))
        print(f"\nCNN batch 8: session {s_us:.1f} us, ort {o_us:.1f} us, {r:.2f}x "
              "(median of paired ratios)")

    b = GraphBuilder("chain")
    v = b.input("x", DType.F32, (1,))
    one = b.const(np.ones(1, np.float32))
    for _ in range(200):
        v = b.op("Add", v, one)
    b.output(v, "y")
    chain = Session(b.build(), optimize=False)
    x1 = np.zeros(1, np.float32)
    per_run = median_us(lambda: chain.run({"x": x1}), args.number, args.repeats)
    kernel = median_us(lambda: np.add(x1, x1), args.number * 50, args.repeats)
    print(f"\nper-node overhead: {per_run / 200:.2f} us per node including the kernel "
          f"(numpy add alone: {kernel:.2f} us), {(per_run / 200) - kernel:.2f} us of executor")


if __name__ == "__main__":
    main()
