"""The model-zoo networks that ship inside the ``onnx`` package (``backend/test/data/light``):
their files, the input ONNX's own runner feeds them, and a seeded random-weights variant."""

from __future__ import annotations

import glob
import os

import numpy as np

NAMES = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
         "squeezenet", "vgg19", "zfnet512"]


def light_dir() -> str:
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def available() -> list[str]:
    found = {os.path.basename(f)[6:-5] for f in glob.glob(os.path.join(light_dir(), "light_*.onnx"))}
    return [n for n in NAMES if n in found]


def load(name: str):
    import onnx

    return onnx.load(os.path.join(light_dir(), f"light_{name}.onnx"))


def shipped_output(name: str) -> np.ndarray:
    import onnx
    from onnx import numpy_helper

    return numpy_helper.to_array(onnx.load_tensor(
        os.path.join(light_dir(), f"light_{name}_output_0.pb")))


def data_input(model) -> tuple[str, np.ndarray]:
    """The input ONNX's runner gives these models: arange(n) / n in the input's shape."""
    inits = {i.name for i in model.graph.initializer}
    x = next(i for i in model.graph.input if i.name not in inits)
    shape = tuple(d.dim_value or 1 for d in x.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return x.name, (np.arange(n).reshape(shape) / n).astype(np.float32)


def randomized(model, seed: int = 0):
    """A copy whose weights (ConstantOfShape outputs and float initializers) are seeded random:
    He-scaled normals for weights of rank 2 and more, uniform [0.5, 1.5] for vectors (biases,
    BatchNorm scales, means and variances, which must stay positive)."""
    import onnx
    from onnx import numpy_helper

    rng = np.random.default_rng(seed)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}

    def draw(shape):
        if len(shape) >= 2:
            fan_in = int(np.prod(shape[1:]))
            return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)

    keep = []
    for node in g.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in consts:
            shape = tuple(int(d) for d in consts[node.input[0]].reshape(-1))
            g.initializer.append(numpy_helper.from_array(draw(shape), node.output[0]))
        else:
            keep.append(node)
    del g.node[:]
    g.node.extend(keep)
    for i, t in enumerate(g.initializer):
        arr = numpy_helper.to_array(t)
        if arr.dtype == np.float32 and t.name in consts:
            g.initializer[i].CopyFrom(numpy_helper.from_array(draw(arr.shape), t.name))
    return m
