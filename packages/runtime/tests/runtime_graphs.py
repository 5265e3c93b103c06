"""Hand-built graphs the runtime tests share, and an eager interpreter to check them against."""

from __future__ import annotations

import itertools

import numpy as np

from onemodel.runtime import GraphBuilder
from onemodel.tensors import DType, Tensor
from onemodel.tensors.dispatch import dispatch


def frozen_bytes(arr) -> bool:
    """Whether ``arr`` is a read-only view of immutable bytes (``passes.base.frozen``): what a
    pass's own copy of weights must be for kernels to lay it out once, as a file's constants."""
    while isinstance(arr, np.ndarray):
        if arr.flags.writeable:
            return False
        arr = arr.base
    return isinstance(arr, bytes)


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def mlp(seed=0, sizes=(784, 256, 256, 10)):
    """Linear layers as MatMul + Add with ReLU between: what the passes turn into FusedGemm."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("mlp")
    h = b.input("input", DType.F32, ("batch", sizes[0]))
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        w = b.initializer(f"fc{i}.weight", f32(rng, n_in, n_out, scale=1 / np.sqrt(n_in)))
        bias = b.initializer(f"fc{i}.bias", f32(rng, n_out, scale=0.1))
        h = b.op("Add", b.op("MatMul", h, w), bias)
        if i < len(sizes) - 2:
            h = b.op("Relu", h)
    b.output(h, "output")
    return b.build()


def conv_net(seed=0):
    """Conv, BatchNorm, ReLU, pooling, a symbolic Flatten through Shape, and a Gemm head."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("convnet")
    x = b.input("input", DType.F32, ("batch", 3, 16, 16))

    def bn(h, c, name):
        return b.op("BatchNormalization", h,
                    b.initializer(f"{name}.weight", rng.uniform(0.5, 1.5, c).astype(np.float32)),
                    b.initializer(f"{name}.bias", f32(rng, c, scale=0.1)),
                    b.initializer(f"{name}.mean", f32(rng, c, scale=0.1)),
                    b.initializer(f"{name}.var", rng.uniform(0.5, 1.5, c).astype(np.float32)),
                    epsilon=1e-5)

    h = b.op("Conv", x, b.initializer("c1.w", f32(rng, 8, 3, 3, 3, scale=0.2)),
             b.initializer("c1.b", f32(rng, 8, scale=0.1)), pads=(1, 1, 1, 1))
    h = b.op("Relu", bn(h, 8, "bn1"))
    h = b.op("MaxPool", h, kernel_shape=(2, 2), strides=(2, 2))
    h = b.op("Conv", h, b.initializer("c2.w", f32(rng, 16, 8, 3, 3, scale=0.2)), strides=(2, 2),
             pads=(1, 1, 1, 1))
    h = b.op("Relu", bn(h, 16, "bn2"))
    h = b.op("AveragePool", h, kernel_shape=(2, 2), strides=(2, 2))
    # flatten with a target computed from the input's shape: [batch, -1]
    batch = b.op("Gather", b.op("Shape", h), b.const([0], "I64"), axis=0)
    target = b.op("Concat", batch, b.const([-1], "I64"), axis=0)
    h = b.op("Reshape", h, target)
    h = b.op("Gemm", h, b.initializer("fc.w", f32(rng, 10, 64, scale=0.1)),
             b.initializer("fc.b", f32(rng, 10)), transB=1)
    b.output(h, "output")
    return b.build()


def attention(seed=0, d=16, heads=2):
    """Single-layer self-attention with symbolic batch and sequence axes."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("attention")
    x = b.input("input", DType.F32, ("batch", "seq", d))
    hd = d // heads

    def proj(name):
        return b.op("Add", b.op("MatMul", x, b.initializer(f"{name}.w", f32(rng, d, d, scale=0.3))),
                    b.initializer(f"{name}.b", f32(rng, d, scale=0.1)))

    shape = b.op("Shape", x)
    bs = b.op("Slice", shape, b.const([0], "I64"), b.const([2], "I64"))
    split_shape = b.op("Concat", bs, b.const([heads, hd], "I64"), axis=0)

    def heads_first(t):
        return b.op("Transpose", b.op("Reshape", t, split_shape), perm=(0, 2, 1, 3))

    q, k, v = (heads_first(proj(n)) for n in ("q", "k", "v"))
    scores = b.op("Mul", b.op("MatMul", q, b.op("Transpose", k, perm=(0, 1, 3, 2))),
                  b.const(np.float32(1 / np.sqrt(hd))))
    weights = b.op("Softmax", scores, axis=-1)
    ctx = b.op("Transpose", b.op("MatMul", weights, v), perm=(0, 2, 1, 3))
    merged = b.op("Reshape", ctx, b.op("Concat", bs, b.const([d], "I64"), axis=0))
    out = b.op("Add", b.op("LayerNormalization", b.op("Add", merged, x),
                           b.initializer("ln.w", np.ones(d, np.float32)), axis=-1), proj("o"))
    b.output(out, "output")
    return b.build()


def eager(graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the graph node by node through eager dispatch: no planner, executor or passes."""
    values = {k: Tensor.from_numpy(v) for k, v in graph.initializers.items()}
    values.update({k: Tensor.from_numpy(v) for k, v in feeds.items()})
    for n in graph.nodes:
        out = dispatch(n.op, [values[i] if i else None for i in n.inputs], n.attrs)
        outs = out if isinstance(out, tuple) else (out,)
        for name, t in zip(n.outputs, outs):
            if name:
                values[name] = t
    return {v.name: values[v.name].numpy() for v in graph.outputs}


def random_feeds(graph, bindings, seed=1):
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in graph.inputs:
        shape = tuple(bindings[str(d)] if not isinstance(d, int) else d for d in v.shape)
        feeds[v.name] = rng.standard_normal(shape).astype(v.dtype.numpy)
    return feeds
