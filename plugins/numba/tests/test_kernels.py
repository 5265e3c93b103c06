"""The kernel table: every numba kernel against the reference kernel of its op, on random
inputs with odd shapes, strides and padding, contiguous and not, in every dtype it claims. The
reference kernels are the oracle here; they are themselves tested against PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.numba import plugin
from onemodel.tensors import registry
from onemodel.tensors.ops import OPS

DTYPES = [np.float32, np.float64]
TOL = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-11, atol=1e-11)}


CASES = [
    ("Conv", [(1, 8, 17, 13), (6, 8, 3, 3), (6,)], dict(pads=(1, 1, 1, 1))),
    ("Conv", [(2, 8, 9, 7), (6, 4, 3, 2), (6,)], dict(group=2, strides=(2, 1), pads=(1, 0, 2, 1),
                                                      dilations=(1, 2))),
    ("Conv", [(2, 6, 11, 13), (12, 1, 5, 3), (12,)], dict(group=6, strides=(2, 3),
                                                          pads=(2, 1, 0, 1), dilations=(2, 1))),
    ("Conv", [(1, 7, 10, 9), (7, 1, 3, 3)], dict(group=7, pads=(1, 1, 1, 1))),
    ("Conv", [(3, 12, 5, 6), (9, 4, 1, 1), (9,)], dict(group=3)),
    ("Conv", [(3, 5, 8, 8), (7, 5, 3, 3)], dict(auto_pad="SAME_UPPER", strides=(2, 2))),
    ("Conv", [(1, 3, 15, 15), (4, 3, 7, 7), (4,)], dict(strides=(2, 2), pads=(3, 3, 3, 3))),
    *[(grad, [x, w, ("out", "Conv", a)], a) for grad in ("ConvInputGrad", "ConvWeightGrad")
      for x, w, a in (((2, 8, 17, 13), (6, 8, 3, 3), dict(pads=(1, 1, 1, 1))),
                      ((2, 8, 9, 7), (6, 4, 3, 2), dict(group=2, strides=(2, 1), pads=(1, 0, 2, 1),
                                                        dilations=(1, 2))),
                      ((3, 6, 11, 13), (12, 1, 5, 3), dict(group=6, strides=(2, 3),
                                                           pads=(2, 1, 0, 1))),
                      ((3, 5, 8, 8), (7, 5, 3, 3), dict(auto_pad="SAME_UPPER", strides=(2, 2))),
                      ((3, 12, 5, 6), (9, 4, 1, 1), dict(group=3)))],
    *[("FusedConv", [(2, 6, 9, 9), (4, 6, 3, 3), (4,)], dict(activation=a, pads=(1, 1, 1, 1)))
      for a in ("Relu", "Sigmoid", "Tanh", "HardSwish", "Relu6", "Silu")],
    # Relu6 (Clip to 0 and 6) on the other paths: depthwise, 1x1, the small-convolution table
    ("FusedConv", [(2, 6, 9, 9), (6, 1, 3, 3), (6,)], dict(activation="Relu6", group=6,
                                                            pads=(1, 1, 1, 1))),
    ("FusedConv", [(2, 8, 6, 6), (12, 8, 1, 1), (12,)], dict(activation="Relu6")),
    ("FusedConv", [(1, 3, 5, 5), (2, 3, 3, 3), (2,)], dict(activation="Relu6")),
    ("FusedConv", [(3, 16, 6, 6), (8, 16, 3, 3), (8,)], dict(activation="Relu6",
                                                            pads=(1, 1, 1, 1))),  # one GEMM
    ("FusedConv", [(2, 8, 20, 20), (8, 8, 3, 3), (8,)], dict(activation="Relu6",
                                                              pads=(1, 1, 1, 1))),  # per image
    ("FusedConv", [(1, 6, 9, 9), (6, 1, 3, 3), (6,)], dict(activation="Relu", group=6,
                                                            strides=(2, 2))),
    # depthwise with the bias and activation applied as the rows are stored (stride 1 and not,
    # a channel multiplier of 2, dilation, no bias)
    ("FusedConv", [(2, 5, 10, 11), (10, 1, 3, 3), (10,)], dict(activation="Sigmoid", group=5,
                                                                pads=(1, 1, 1, 1))),
    ("FusedConv", [(1, 4, 9, 8), (4, 1, 5, 3), (4,)], dict(activation="Tanh", group=4,
                                                            pads=(2, 1, 2, 1), dilations=(1, 2))),
    ("FusedConv", [(1, 4, 9, 8), (4, 1, 3, 3)], dict(activation="Relu", group=4,
                                                      strides=(2, 1), pads=(0, 1, 1, 1))),
    ("Conv", [(2, 3, 7, 12), (6, 1, 3, 3), (6,)], dict(group=3, strides=(1, 2),
                                                       pads=(1, 1, 1, 1))),
    ("BatchNormalization", [(2, 5, 7, 3), (5,), (5,), (5,), ("pos", 5)], dict(epsilon=1e-3)),
    ("BatchNormalization", [(4, 6), (6,), (6,), (6,), ("pos", 6)], {}),
    ("LayerNormalization", [(3, 7, 33), (33,), (33,)], {}),
    ("LayerNormalization", [(4, 5, 6), (5, 6)], dict(axis=1, epsilon=1e-3)),
    ("LayerNormalization", [(5, 17), (17,), (17,)], dict(stash_type=0)),
    ("RMSNormalization", [(3, 7, 33), (33,)], {}),
    ("RMSNormalization", [(4, 5, 6), (5, 6)], dict(axis=-2)),
    # the residual (full, a trailing block of positions, one row) and the bias row
    ("SkipLayerNormalization", [(3, 7, 33), (3, 7, 33), (33,), (33,), (33,)], {}),
    ("SkipLayerNormalization", [(3, 7, 33), (1, 7, 33), (33,), (33,)], dict(epsilon=1e-3)),
    ("SkipLayerNormalization", [(2, 5, 17), (5, 17), (17,), None, (17,)], {}),
    ("SkipLayerNormalization", [(6, 9), (9,), (9,)], {}),
    ("ChannelLayerNormalization", [(2, 8, 5, 7), (8,), (8,)], {}),
    ("ChannelLayerNormalization", [(3, 5, 11), (5,)], dict(epsilon=1e-3)),
    ("ChannelLayerNormalization", [(1, 3, 2, 3, 4), (3,), (3,)], {}),
    # a global average written as mean (MNASNet's head), the last axis, every axis
    ("ReduceMean", [(2, 5, 4, 3), ("const", [2, 3])], dict(keepdims=0)),
    ("ReduceMean", [(2, 5, 4, 3), ("const", [-2, -1])], {}),
    ("ReduceMean", [(3, 7, 33), ("const", [2])], {}),
    ("ReduceMean", [(4, 6), None], dict(keepdims=0)),
    # ConvTranspose: stride and pads, groups with dilation and output_padding, SAME_UPPER, an
    # output_shape inside the kernels' reach and one beyond it (the reference), 1x1
    ("ConvTranspose", [(2, 16, 8, 8), (16, 8, 4, 4), (8,)], dict(strides=(2, 2),
                                                                  pads=(1, 1, 1, 1))),
    ("ConvTranspose", [(2, 6, 7, 5), (6, 2, 3, 2), (6,)],
     dict(group=3, strides=(2, 3), pads=(1, 0, 0, 1), dilations=(2, 1), output_padding=(1, 2))),
    ("ConvTranspose", [(1, 3, 4, 4), (3, 2, 3, 3)], dict(strides=(2, 2), auto_pad="SAME_UPPER")),
    ("ConvTranspose", [(1, 3, 4, 4), (3, 2, 3, 3)], dict(strides=(2, 2), output_shape=(9, 9))),
    ("ConvTranspose", [(1, 3, 4, 4), (3, 2, 3, 3)], dict(strides=(2, 2), output_shape=(12, 12))),
    ("ConvTranspose", [(2, 5, 3, 3), (5, 5, 1, 1), (5,)], {}),
    ("ConvTranspose", [(0, 3, 4, 4), (3, 2, 3, 3)], {}),
    ("InstanceNormalization", [(2, 5, 7, 3), (5,), (5,)], dict(epsilon=1e-3)),
    ("InstanceNormalization", [(3, 4, 11), (4,), (4,)], {}),
    ("GroupNormalization", [(2, 6, 5, 4), (6,), (6,)], dict(num_groups=3)),
    ("GroupNormalization", [(2, 8, 9), (8,), (8,)], dict(num_groups=8, epsilon=1e-2)),
    ("GroupNormalization", [(1, 4, 2, 3, 2), (4,), (4,)], dict(num_groups=1)),
    ("GroupNormalization", [(0, 4, 3, 3), (4,), (4,)], dict(num_groups=2)),
    ("LRN", [(2, 9, 5, 4)], dict(size=5, alpha=1e-2, beta=0.75, bias=2.0)),
    ("LRN", [(1, 4, 3, 3)], dict(size=2)),
    ("Erf", [(7, 131)], {}),
    ("Gelu", [(3, 5, 97)], {}),
    ("ReluGrad", [(3, 5, 97), (3, 5, 97)], {}),
    ("FusedElementwise", [(2, 6, 5, 7), (1, 6, 1, 1)], dict(program=["Add x0 x1", "Relu t0"])),
    ("FusedElementwise", [(3, 17), (17,), (1, 1)],
     dict(program=["Mul x0 x1", "Add t0 x2", "Clip t1 -0.5 nan", "Sigmoid t2", "Erf t3",
                   "Tanh t4", "Clip t5 nan 0.25"])),
    ("FusedElementwise", [(4, 1, 5), (3, 1)],
     dict(program=["Sub x0 x1", "Abs t0", "Sqrt t1", "Neg t2", "Exp t3", "Div t4 x1",
                   "Mul t5 t5"])),
    ("FusedElementwise", [(0, 3), (3,)], dict(program=["Add x0 x1", "Relu t0"])),
    # literals: attributes (HardSigmoid, LeakyRelu), constant exponents, infinite bounds
    ("FusedElementwise", [(2, 3, 5, 7), (1, 3, 1, 1)],
     dict(program=["Add x0 x1", "HardSigmoid t0 0.2 0.5", "Mul x0 t1"])),
    ("FusedElementwise", [(3, 29)], dict(program=["HardSwish x0"])),
    ("FusedElementwise", [(5, 13)], dict(program=["LeakyRelu x0 0.01"])),
    ("FusedElementwise", [(4, 1, 9), (9,)],
     dict(program=["Pow x0 3.0", "Mul t0 x1", "Add x0 t1", "Pow t2 2.0", "Clip t3 -inf 4.0",
                   "HardSigmoid t4 0.3 -0.1", "LeakyRelu t5 0.2"])),
    ("FusedElementwise", [(6, 7)], dict(program=["Abs x0", "Pow t0 0.5", "Pow t1 -1.5"])),
    ("MaxPool", [(2, 3, 17, 13)], dict(kernel_shape=(3, 3), strides=(2, 2))),
    ("MaxPool", [(2, 3, 17, 13)], dict(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1,
                                       pads=(1, 0, 1, 2))),
    ("MaxPool", [(1, 4, 9, 11)], dict(kernel_shape=(2, 3), strides=(1, 3), dilations=(2, 1),
                                      pads=(1, 1, 0, 1))),
    ("MaxPool", [(3, 2, 8, 7)], dict(kernel_shape=(3, 3), auto_pad="SAME_LOWER", strides=(2, 2))),
    ("MaxPool", [(1, 2, 5, 5)], dict(kernel_shape=(3, 3), strides=(3, 3), ceil_mode=1,
                                     pads=(0, 0, 2, 2))),
    ("MaxPool", [(1, 3, 6, 9)], dict(kernel_shape=(3, 2), strides=(1, 1), pads=(1, 1, 1, 1),
                                     dilations=(1, 2))),
    ("MaxPool", [(2, 3, 8, 10)], dict(kernel_shape=(2, 2), strides=(2, 2))),
    ("MaxPool", [(2, 3, 9, 7)], dict(kernel_shape=(2, 2), strides=(2, 2))),
    ("MaxPool", [(2, 3, 9, 7)], dict(kernel_shape=(2, 2), strides=(2, 2), ceil_mode=1)),
    ("MaxPool", [(2, 3, 8, 8)], dict(kernel_shape=(2, 2), strides=(2, 2), pads=(1, 1, 1, 1))),
    ("MaxPool", [(2, 3, 8, 8)], dict(kernel_shape=(2, 2), strides=(2, 1))),
    ("AveragePool", [(2, 3, 17, 13)], dict(kernel_shape=(3, 3), strides=(2, 2),
                                           pads=(1, 1, 1, 1))),
    ("AveragePool", [(2, 3, 17, 13)], dict(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1,
                                           pads=(1, 0, 1, 2), count_include_pad=1)),
    ("AveragePool", [(1, 4, 9, 11)], dict(kernel_shape=(2, 3), strides=(1, 3), dilations=(2, 1),
                                          pads=(1, 1, 0, 1))),
    ("AveragePool", [(3, 2, 8, 7)], dict(kernel_shape=(3, 3), auto_pad="SAME_UPPER",
                                         strides=(2, 2), count_include_pad=1)),
    ("AveragePool", [(1, 5, 7, 7)], dict(kernel_shape=(7, 7))),
    ("AveragePool", [(1, 2, 5, 5)], dict(kernel_shape=(3, 3), strides=(3, 3), ceil_mode=1,
                                         pads=(0, 0, 2, 2))),
    *[(grad, [x, ("out", fwd, a)], a)
      for grad, fwd in (("MaxPoolGrad", "MaxPool"), ("AveragePoolGrad", "AveragePool"))
      for x, a in (((2, 3, 8, 10), dict(kernel_shape=(2, 2), strides=(2, 2))),
                   ((2, 3, 9, 7), dict(kernel_shape=(2, 2), strides=(2, 2))),
                   ((2, 3, 9, 7), dict(kernel_shape=(2, 2), strides=(2, 2), ceil_mode=1)),
                   ((2, 3, 17, 13), dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))),
                   ((2, 3, 17, 13), dict(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1,
                                         pads=(1, 0, 1, 2))),
                   ((1, 4, 9, 11), dict(kernel_shape=(2, 3), strides=(1, 3), dilations=(2, 1),
                                        pads=(1, 1, 0, 1))),
                   ((3, 2, 8, 7), dict(kernel_shape=(3, 3), auto_pad="SAME_LOWER",
                                       strides=(2, 2))),
                   ((1, 2, 5, 5), dict(kernel_shape=(3, 3), strides=(3, 3), ceil_mode=1,
                                       pads=(0, 0, 2, 2))),
                   ((1, 5, 7, 7), dict(kernel_shape=(7, 7))),
                   ((0, 3, 6, 6), dict(kernel_shape=(2, 2), strides=(2, 2))))],
    ("AveragePoolGrad", [(2, 3, 17, 13), ("out", "AveragePool", dict(
        kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), count_include_pad=1))],
     dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), count_include_pad=1)),
    ("GlobalAveragePool", [(2, 5, 7, 3)], {}),
    ("GlobalAveragePool", [(3, 4, 11)], {}),
    ("GlobalAveragePool", [(1, 3, 2, 3, 4)], {}),
    ("GlobalAveragePool", [(2, 3, 1, 1)], {}),
    *[(op, [shape], a) for op in ("Softmax", "LogSoftmax")
      for shape, a in (((3, 7, 33), {}), ((5, 1000), dict(axis=1)), ((4, 6, 1), dict(axis=1)),
                       ((2, 1), {}), ((7,), dict(axis=0)))],
    ("FusedAttention", [(2, 3, 5, 8), (2, 3, 8, 5), (2, 3, 5, 7), (2, 1, 1, 5)],
     dict(scale=0.35)),
    ("FusedAttention", [(1, 2, 40, 16), (1, 2, 16, 40), (1, 2, 40, 16), (40, 40)], {}),
    ("FusedAttention", [(4, 6, 8), (4, 8, 9), (4, 9, 3)], dict(scale=2.0)),
    ("FusedAttention", [(2, 3, 5, 8), (2, 3, 8, 5), (2, 3, 5, 7)],
     dict(scale=0.5, transpose_output=1)),
    ("FusedAttention", [(1, 2, 40, 16), (1, 2, 16, 40), (1, 2, 40, 16), (40, 40)],
     dict(transpose_output=1)),
    ("FusedGemm", [(3, 7), (7, 5), (5,)], {}),
    ("FusedGemm", [(4, 6), (9, 6), (9,)], dict(transB=1, activation="Sigmoid")),
    ("FusedGemm", [(6, 4), (6, 5)], dict(transA=1, activation="Tanh")),
    ("FusedGemm", [(5, 8), (8, 6), (6,)], dict(activation="Relu6")),
    ("FusedGemm", [(2, 300), (300, 1100), (1100,)], {}),  # 2 rows by a 1.3 MB weight
    ("FusedMatMul", [(2, 5, 7), (7, 6), (6,)], dict(activation="Gelu")),
    ("FusedMatMul", [(3, 4, 2, 9), (9, 5)], dict(activation="Silu")),
    ("FusedMatMul", [(6, 8), (8, 3), (3,)], {}),
    ("Gemm", [(3, 7), (7, 5), (5,)], {}),
    ("Gemm", [(4, 6), (9, 6), (9,)], dict(transB=1, alpha=0.5, beta=2.0)),
    ("Gemm", [(6, 4), (6, 5), (4, 5)], dict(transA=1)),  # a bias of the output's shape
    ("MatMul", [(3, 7), (7, 5)], {}),
    ("MatMul", [(2, 3, 4, 6), (6, 5)], {}),
    ("MatMul", [(2, 3, 4, 6), (2, 1, 6, 5)], {}),  # batched, broadcast
    ("MatMul", [(5,), (5, 3)], {}),
    ("MatMul", [(2, 4, 600), (600, 1800)], {}),  # 8 rows by 4.3 MB of weights (writable)
    # empty batches
    ("MaxPool", [(0, 3, 5, 5)], dict(kernel_shape=(2, 2))),
    ("AveragePool", [(0, 3, 5, 5)], dict(kernel_shape=(2, 2))),
    ("Conv", [(0, 4, 5, 5), (3, 4, 3, 3), (3,)], dict(pads=(1, 1, 1, 1))),
    ("BatchNormalization", [(0, 4, 5, 5), (4,), (4,), (4,), ("pos", 4)], {}),
    ("LRN", [(0, 4, 3, 3)], dict(size=3)),
    ("LayerNormalization", [(0, 6), (6,), (6,)], {}),
    ("SkipLayerNormalization", [(0, 6), (0, 6), (6,), (6,)], {}),
    ("ChannelLayerNormalization", [(0, 4, 3, 3), (4,), (4,)], {}),
    ("ReduceMean", [(0, 4, 3), ("const", [1, 2])], {}),
    ("Gelu", [(0, 5)], {}),
    ("ReluGrad", [(0, 5), (0, 5)], {}),
    ("GlobalAveragePool", [(0, 3, 4, 4)], {}),
    ("Softmax", [(0, 5)], {}),
    ("LogSoftmax", [(0, 5)], {}),
    ("FusedAttention", [(0, 2, 3, 4), (0, 2, 4, 3), (0, 2, 3, 4)], {}),
    ("FusedGemm", [(0, 4), (4, 3), (3,)], {}),
    ("MatMul", [(0, 4), (4, 3)], {}),
    # (more in test_resize.py)
    ("Resize", [(2, 3, 5, 7), None, None, ("const", [2, 3, 11, 13])], dict(mode="linear")),
    ("Resize", [(1, 4, 9, 8), None, ("const", [1.0, 1.0, 0.5, 1.75]), None],
     dict(mode="cubic", coordinate_transformation_mode="align_corners")),
    # recurrent: every optional input, both directions in the batch-major layout, a hidden
    # size that is not a multiple of eight (the product's tail), GRU's two forms, no steps
    ("LSTM", [(5, 3, 4), (1, 24, 4), (1, 24, 6), (1, 48), None, (1, 3, 6), (1, 3, 6), (1, 18)],
     {}),
    ("LSTM", [(3, 5, 4), (2, 16, 4), (2, 16, 4)],
     dict(direction="bidirectional", layout=1, input_forget=1)),
    ("LSTM", [(4, 2, 3), (1, 36, 3), (1, 36, 9), (1, 72)], dict(direction="reverse",
                                                               hidden_size=9)),
    ("LSTM", [(0, 2, 3), (1, 16, 3), (1, 16, 4)], {}),
    ("GRU", [(6, 2, 5), (1, 21, 5), (1, 21, 7), (1, 42), None, (1, 2, 7)],
     dict(linear_before_reset=1)),
    ("GRU", [(4, 3, 3), (2, 48, 3), (2, 48, 16), (2, 96)], dict(direction="bidirectional")),
    ("GRU", [(2, 5, 3), (1, 30, 3), (1, 30, 10)], dict(direction="reverse", layout=1,
                                                       linear_before_reset=1)),
    # a classifier's loss: a mean, a sum over class weights with a label ignored, per sample
    # over a thousand classes with int32 labels; and the gradients of the same
    ("SoftmaxCrossEntropyLoss", [(13, 7), ("labels", 13, 7)], {}),
    ("SoftmaxCrossEntropyLoss", [(13, 7), ("labels", 13, 7), (7,)],
     dict(reduction="sum", ignore_index=3)),
    ("SoftmaxCrossEntropyLoss", [(9, 1000), ("labels32", 9, 1000)],
     dict(reduction="none", ignore_index=5)),
    ("SoftmaxCrossEntropyLossGrad", [(13, 7), ("labels", 13, 7), ()], {}),
    ("SoftmaxCrossEntropyLossGrad", [(13, 7), ("labels", 13, 7), (), (7,)],
     dict(reduction="sum", ignore_index=3)),
    ("SoftmaxCrossEntropyLossGrad", [(9, 1000), ("labels32", 9, 1000), (9,)],
     dict(reduction="none", ignore_index=5)),
]

# ops whose numba kernel claims float32 only: for float64 its supports check must refuse
F32_ONLY = {"Softmax", "LogSoftmax"}


def _make(spec, rng, dtype, attrs_of_case):
    if spec is None:  # an omitted optional input
        return None
    if isinstance(spec, tuple) and spec and spec[0] == "const":  # as given (Resize's sizes)
        return np.array(spec[1], np.float32 if isinstance(spec[1][0], float) else np.int64)
    if isinstance(spec, tuple) and spec and spec[0] == "pos":
        return rng.uniform(0.5, 2.0, spec[1]).astype(dtype)
    if isinstance(spec, tuple) and spec and spec[0] == "out":
        return None  # filled in by the caller
    if isinstance(spec, tuple) and spec and spec[0] in ("labels", "labels32"):  # class indices
        return rng.integers(0, spec[2], spec[1]).astype(
            np.int64 if spec[0] == "labels" else np.int32)
    return (rng.standard_normal(spec) * 2).astype(dtype)


def _strided(a: np.ndarray | None) -> np.ndarray | None:
    """The same values in a non-contiguous array (every other element of a bigger one)."""
    if a is None or a.ndim == 0:
        return a
    big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    big[..., ::2] = a
    view = big[..., ::2]
    assert not view.flags.c_contiguous or a.size <= 1
    return view


def _inputs(op, specs, attrs, dtype, seed):
    rng = np.random.default_rng(seed)
    arrays = [_make(s, rng, dtype, attrs) for s in specs]
    for i, s in enumerate(specs):
        if isinstance(s, tuple) and s and s[0] == "out":
            _, fwd, fattrs = s
            shape = OPS[fwd].kernel(*arrays[:i], **fattrs).shape
            arrays[i] = rng.standard_normal(shape).astype(dtype)
    return arrays


def _ids():
    return [f"{op}-{i}" for i, (op, _, _) in enumerate(CASES)]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "strided"])
@pytest.mark.parametrize("case", CASES, ids=_ids())
def test_numba_kernel_matches_the_reference(case, contiguous, dtype):
    op, specs, attrs = case
    impl, check = plugin.KERNELS[op]
    kernel, supports = registry.resolve(impl), registry.resolve(check)
    arrays = _inputs(op, specs, attrs, dtype, seed=len(specs) + 7 * len(attrs))
    if not contiguous:
        arrays = [_strided(a) for a in arrays]
    if op in F32_ONLY and dtype != np.float32:
        assert not supports(*arrays, **attrs), f"the numba {op} kernel claims {dtype}"
        return
    assert supports(*arrays, **attrs), f"the numba {op} kernel refuses {attrs}"
    want = OPS[op].kernel(*arrays, **attrs)
    got = kernel(*arrays, **attrs)
    wants = want if isinstance(want, tuple) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    assert len(gots) == len(wants)
    for g, w in zip(gots, wants):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("case", [c for c in CASES if c[0] in plugin.WRITES_OUT],
                         ids=[f"{op}-{i}" for i, (op, _, _) in enumerate(CASES)
                              if op in plugin.WRITES_OUT])
def test_out_buffer_is_filled_and_returned(case, dtype):
    """A kernel listed in WRITES_OUT fills every element of a given ``out`` (a buffer holding
    NaN beforehand) and returns that very array; strided inputs are still read right."""
    op, specs, attrs = case
    impl, check = plugin.KERNELS[op]
    kernel, supports = registry.resolve(impl), registry.resolve(check)
    arrays = _inputs(op, specs, attrs, dtype, seed=len(specs) + 7 * len(attrs))
    if not supports(*arrays, **attrs):
        assert op in F32_ONLY and dtype != np.float32
        return
    want = OPS[op].kernel(*arrays, **attrs)
    for inputs in (arrays, [_strided(a) for a in arrays]):
        out = np.full(want.shape, np.nan, dtype)
        got = kernel(*inputs, **attrs, out=out)
        assert got is out
        np.testing.assert_allclose(out, want, **TOL[dtype])


def test_every_registered_kernel_is_in_the_table():
    assert {op for op, _, _ in CASES} == set(plugin.KERNELS)


def test_special_values_follow_the_reference():
    for op in ("Erf", "Gelu"):
        kernel = registry.resolve(plugin.KERNELS[op][0])
        x = np.array([np.inf, -np.inf, 0.0, -0.0, 1e-300, 40.0, -40.0])
        with np.errstate(invalid="ignore"):  # Gelu(-inf) is -inf * 0: NaN in both
            want = OPS[op].kernel(x)
        np.testing.assert_array_equal(kernel(x), want)
        assert np.isnan(kernel(np.array([np.nan])))[0]


def test_relu_grad_follows_the_reference_on_special_values():
    """dY's NaN and infinities where Y <= 0 give NaN, a negative dY -0.0: the reference's
    multiply by the mask, bit for bit (signs of zeros included)."""
    kernel = registry.resolve(plugin.KERNELS["ReluGrad"][0])
    y = np.array([-1.0, -1.0, -1.0, -1.0, 0.0, -0.0, np.nan, 2.0, 2.0, 1e-45], np.float32)
    dy = np.array([np.nan, np.inf, -np.inf, -3.0, 5.0, 5.0, 1.0, np.nan, -4.0, 7.0], np.float32)
    with np.errstate(invalid="ignore"):
        want = OPS["ReluGrad"].kernel(y, dy)
    got = kernel(y, dy)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_fused_literal_ops_follow_the_reference_on_special_values():
    kernel = registry.resolve(plugin.KERNELS["FusedElementwise"][0])
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 3.0, -3.0, 2.5, -2.5, 1e-30], np.float32)
    for program in (["HardSwish x0"], ["HardSigmoid x0 0.2 0.5"], ["LeakyRelu x0 0.01"],
                    ["Pow x0 3.0"], ["Pow x0 2.0", "Clip t0 -inf inf"], ["Pow x0 0.5"],
                    ["Pow x0 -1.5"], ["Pow x0 2.5"], ["Pow x0 -1.0"], ["Pow x0 0.0"]):
        with np.errstate(all="ignore"):
            want = OPS["FusedElementwise"].kernel(x, program=program)
        # NaN and infinities where the reference has them; finite values to rounding (one
        # pass in float64, where the reference rounds each step to float32)
        np.testing.assert_allclose(kernel(x, program=program), want, rtol=1e-6, atol=0,
                                   err_msg=str(program))


@pytest.mark.parametrize("op", ["Conv", "LayerNormalization", "Gelu", "Softmax", "MaxPoolGrad",
                                "GlobalAveragePool", "FusedGemm", "LSTM", "GRU"])
def test_the_reference_stays_the_fallback(op):
    """Calls a numba kernel does not cover (float16, 3-D convolution, the tanh Gelu) are
    refused by its supports check, so kernel choice falls through to the reference kernel."""
    supports = registry.resolve(plugin.KERNELS[op][1])
    if op == "Conv":
        assert supports(np.zeros((1, 2, 5), np.float32), np.zeros((3, 2, 3), np.float32))
        assert not supports(np.zeros((1, 2, 5, 5, 5), np.float32),
                            np.zeros((3, 2, 3, 3, 3), np.float32))
        assert not supports(np.zeros((1, 2, 5, 5), np.float16), np.zeros((3, 2, 3, 3), np.float16))
    elif op == "LayerNormalization":
        assert not supports(np.zeros((2, 3), np.float16), np.zeros(3, np.float16))
        assert not supports(np.zeros((2, 3), np.float32), np.zeros(3, np.float64))
    elif op == "Softmax":  # float64 rows and inner axes measured slower than the reference
        assert not supports(np.zeros((2, 3), np.float64))
        assert not supports(np.zeros((2, 3, 4), np.float32), axis=1)
        assert not supports(np.zeros((2, 3), np.float32), axis=2)
        assert supports(np.zeros((2, 3, 1), np.float32), axis=1)
    elif op == "MaxPoolGrad":
        assert not supports(np.zeros((1, 2, 5), np.float32), np.zeros((1, 2, 2), np.float32),
                            kernel_shape=(2,))
        assert not supports(np.zeros((1, 2, 4, 4), np.float32), np.zeros((1, 2, 2, 2), np.float64),
                            kernel_shape=(2, 2))
    elif op == "GlobalAveragePool":
        assert not supports(np.zeros((2, 3), np.float32))
        assert not supports(np.zeros((2, 3, 4, 4), np.int32))
    elif op == "FusedGemm":  # scaled, a bias that is not one row, other dtypes
        a, b, c = np.zeros((3, 4), np.float32), np.zeros((4, 5), np.float32), np.zeros(5, np.float32)
        assert supports(a, b, c)
        assert not supports(a, b, c, alpha=0.5)
        assert not supports(a, b, c, beta=2.0)
        assert not supports(a, b, np.zeros((3, 5), np.float32))
        assert not supports(a, b, c.astype(np.float64))
        assert not supports(a.astype(np.float16), b.astype(np.float16))
        assert not supports(a, b, c, activation="LeakyRelu")
    elif op in ("LSTM", "GRU"):  # other activations, a clip, sequence lengths, float16
        g = 4 if op == "LSTM" else 3
        x, w, r = (np.zeros(s, np.float32) for s in ((5, 2, 3), (1, 4 * g, 3), (1, 4 * g, 4)))
        assert supports(x, w, r)
        assert not supports(x, w, r, activations=["Relu"] * (g - 1))
        assert not supports(x, w, r, clip=1.0)
        assert not supports(x, w, r, None, np.full(2, 5, np.int32))
        assert not supports(x.astype(np.float16), w.astype(np.float16), r.astype(np.float16))
        assert not supports(x, w, r.astype(np.float64))
    else:
        assert not supports(np.zeros((2, 3), np.float32), approximate="tanh")
        assert not supports(np.zeros((2, 3), np.float16))


@pytest.mark.parametrize("case", CASES, ids=_ids())
def test_parallel_variant_matches_the_reference(case, parallel_variants):
    op, specs, attrs = case
    kernel = registry.resolve(plugin.KERNELS[op][0])
    arrays = _inputs(op, specs, attrs, np.float32, seed=3)
    want = OPS[op].kernel(*arrays, **attrs)
    got = kernel(*arrays, **attrs)
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        np.testing.assert_allclose(g, w, **TOL[np.float32])


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pooling_special_values_follow_the_reference(op):
    """NaN wins a max window as in np.maximum (planes with and without NaN side by side),
    infinities pass through, and windows with nothing inside the image give what the
    reference gives (-inf for max, 0/0 for an average that excludes padding)."""
    kernel = registry.resolve(plugin.KERNELS[op][0])
    x = np.random.default_rng(5).standard_normal((2, 3, 7, 8)).astype(np.float32)
    x[0, 1, 3, 4] = np.nan
    x[1, 2, 0, 0] = np.inf
    x[1, 0, 6, 7] = -np.inf
    for attrs in (dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
                  dict(kernel_shape=(2, 2), strides=(3, 3), ceil_mode=1, pads=(0, 0, 2, 2)),
                  dict(kernel_shape=(2, 2), strides=(2, 2)),
                  dict(kernel_shape=(2, 2), strides=(2, 2), pads=(0, 0, 4, 4))):
        with np.errstate(invalid="ignore", divide="ignore"):
            want = OPS[op].kernel(x, **attrs)
        got = kernel(x, **attrs)
        if op == "MaxPool":
            np.testing.assert_array_equal(got, want)
        else:  # the sums run in another order: rounding only; NaN and inf where they are
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert np.isnan(got[0, 1]).any() and not np.isnan(got[0, 0, :3, :3]).any()
    assert got[0, 0, -1, -1] == -np.inf if op == "MaxPool" else np.isnan(got[0, 0, -1, -1])


def test_pooling_refuses_what_it_does_not_cover():
    supports = registry.resolve(plugin.KERNELS["MaxPool"][1])
    assert supports(np.zeros((1, 2, 5, 5), np.float32), kernel_shape=(2, 2))
    assert not supports(np.zeros((1, 2, 5), np.float32), kernel_shape=(2,))
    assert not supports(np.zeros((1, 2, 5, 5, 5), np.float32), kernel_shape=(2, 2, 2))
    assert not supports(np.zeros((1, 2, 5, 5), np.int32), kernel_shape=(2, 2))
    assert not supports(np.zeros((1, 2, 5, 5), np.float16), kernel_shape=(2, 2))


@pytest.mark.parametrize("attrs", [dict(kernel_shape=(2, 2), strides=(2, 2)),
                                   dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
                                   dict(kernel_shape=(2, 2), strides=(1, 1), pads=(1, 1, 1, 1)),
                                   dict(kernel_shape=(2, 2), strides=(3, 3), ceil_mode=1,
                                        pads=(0, 0, 2, 2))],
                         ids=["2x2s2", "3x3s2p1", "2x2s1p1", "ceil-pad"])
def test_max_pool_grad_ties_and_special_values_follow_the_reference(attrs):
    """Which element of a window takes the gradient: the first maximum on ties (inputs from
    three values, so most windows tie), none for a window holding NaN, and a window whose
    first tap is padding keeps it against a real -inf, exactly as the reference decides."""
    kernel = registry.resolve(plugin.KERNELS["MaxPoolGrad"][0])
    rng = np.random.default_rng(11)
    x = rng.integers(0, 3, (2, 3, 8, 8)).astype(np.float32)
    x[0, 0, 2, 3] = np.nan
    x[0, 1, :2, :2] = -np.inf
    x[1, 2] = -np.inf
    x[1, 1, 5, :] = np.inf
    dy = rng.standard_normal(OPS["MaxPool"].kernel(x, **attrs).shape).astype(np.float32)
    want = OPS["MaxPoolGrad"].kernel(x, dy, **attrs)
    got = kernel(x, dy, **attrs)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert ((got != 0) == (want != 0)).all()  # the same element of every window


@pytest.mark.parametrize("shape", [(7, 9), (150, 5), (70, 64), (9, 65)])  # short-row blocks
def test_softmax_special_values_follow_the_reference(shape):
    """Rows holding NaN, +inf, all -inf, some -inf, and values far below the max (whose
    exponentials underflow) give what the reference gives, in the block kernel of short rows
    (rows past the first block of 64 too) and the row kernel."""
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    x[-1, 1] = np.nan  # in the last block
    x[0, 3] = np.nan
    x[1, 2] = np.inf
    x[2] = -np.inf
    x[3, ::2] = -np.inf
    x[4, 0] = 200.0
    x[5] *= 1e4
    for op in ("Softmax", "LogSoftmax"):
        kernel = registry.resolve(plugin.KERNELS[op][0])
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            want = OPS[op].kernel(x)
        got = kernel(x)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-30)


@pytest.mark.parametrize("op,attrs", [("MaxPool", dict(kernel_shape=(2, 2), strides=(2, 2))),
                                      ("AveragePool", dict(kernel_shape=(3, 3))),
                                      ("GlobalAveragePool", {})])
def test_pooling_refuses_an_out_that_breaks_the_contract(op, attrs):
    """An out= of the wrong shape, dtype or layout is an error naming what was expected, never
    a write past the buffer or a result in the wrong type."""
    from onemodel.tensors import OneModelError

    kernel = registry.resolve(plugin.KERNELS[op][0])
    x = np.random.default_rng(0).standard_normal((1, 2, 6, 6)).astype(np.float32)
    want = OPS[op].kernel(x, **attrs)
    for bad in (np.empty(want.shape[:-1] + (want.shape[-1] + 1,), np.float32),
                np.empty(want.shape, np.float64),
                np.empty((want.shape[0], 2 * want.shape[1], *want.shape[2:]),
                         np.float32)[:, ::2]):
        with pytest.raises(OneModelError, match="out= must be"):
            kernel(x, **attrs, out=bad)


def test_skip_layer_norm_with_a_residual_broadcast_inside_rows_takes_the_reference():
    """The kernel repeats the residual's rows; (B, 1, C) over (B, S, C) does not repeat rows,
    so the supports check refuses it and a direct call computes it by the reference."""
    kernel, supports = (registry.resolve(x) for x in plugin.KERNELS["SkipLayerNormalization"])
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    skip = rng.standard_normal((2, 1, 8)).astype(np.float32)
    scale = rng.uniform(0.5, 1.5, 8).astype(np.float32)
    assert not supports(x, skip, scale)
    for got, want in zip(kernel(x, skip, scale), OPS["SkipLayerNormalization"].kernel(x, skip,
                                                                                      scale)):
        np.testing.assert_allclose(got, want, **TOL[np.float32])


def _f32(*shape):
    return np.random.default_rng(5).standard_normal(shape).astype(np.float32)


# calls with an input of the wrong shape: the loops index flat arrays unchecked, so these must
# reach the reference (which raises) and never the loops (which read and wrote past them)
_MISSHAPEN = [
    ("LSTM", (_f32(4, 3, 6), _f32(1, 20, 6), _f32(1, 15, 5)), {}),  # R of 3H rows
    ("LSTM", (_f32(4, 3, 6), _f32(1, 20, 6), _f32(1, 20, 5), None, None, _f32(1, 4, 5)), {}),
    ("LSTM", (_f32(4, 3, 6), _f32(1, 20, 6), _f32(1, 20, 5), _f32(1, 39)), {}),
    ("LSTM", (_f32(4, 3, 6), _f32(1, 20, 6), _f32(1, 20, 5), None, None, None, None,
              _f32(1, 10)), {}),
    ("LSTM", (_f32(4, 3, 6), _f32(1, 20, 6), _f32(1, 20, 5), None, None, _f32(1, 3, 4)), {}),
    ("GRU", (_f32(4, 3, 6), _f32(1, 15, 6), _f32(1, 15, 5), _f32(1, 29)), {}),
    ("GRU", (_f32(4, 3, 6), _f32(1, 15, 7), _f32(1, 15, 5)), {}),
    ("GroupNormalization", (_f32(2, 4, 3), _f32(4), _f32(4)), dict(num_groups=-2)),
    ("GroupNormalization", (_f32(2, 4, 3), _f32(4), _f32(4)), dict(num_groups=3)),
    ("GroupNormalization", (_f32(2, 4, 3), _f32(2), _f32(4)), dict(num_groups=2)),
    ("InstanceNormalization", (_f32(2, 4, 3), _f32(4), _f32(3)), {}),
    ("ConvTranspose", (_f32(1, 3, 4, 4), _f32(3, 2, 3, 3)), dict(strides=[0, 1])),
    ("ConvTranspose", (_f32(1, 3, 4, 4), _f32(3, 2, 3, 3)), dict(output_padding=[-1, 0])),
    # labels outside the classes: the reference's OneModelError, not an index past a row
    ("SoftmaxCrossEntropyLoss", (_f32(4, 3), np.array([0, 3, 1, 2])), {}),
    ("SoftmaxCrossEntropyLoss", (_f32(4, 3), np.array([0, -1, 1, 2])), dict(ignore_index=-100)),
    ("SoftmaxCrossEntropyLossGrad", (_f32(4, 3), np.array([0, 1, 7, 2]), _f32()), {}),
]


@pytest.mark.parametrize("op,args,attrs", _MISSHAPEN, ids=[f"{c[0]}-{i}" for i, c in
                                                             enumerate(_MISSHAPEN)])
def test_misshapen_calls_fail_as_the_reference_does(op, args, attrs):
    kernel = registry.resolve(plugin.KERNELS[op][0])
    with pytest.raises(Exception) as ref:  # whatever the reference raises
        OPS[op].kernel(*args, **attrs)
    with pytest.raises(type(ref.value)):
        kernel(*args, **attrs)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_recurrent_calls_it_does_not_cover_take_the_reference(op):
    """The kernel itself hands the reference what its loops do not compute (a clip, other
    activations, sequence lengths), with the reference's values and errors."""
    kernel = registry.resolve(plugin.KERNELS[op][0])
    g = 4 if op == "LSTM" else 3
    rng = np.random.default_rng(3)
    x, w, r = (rng.standard_normal(s).astype(np.float32)
               for s in ((5, 2, 3), (1, g * 4, 3), (1, g * 4, 4)))
    lens = np.array([5, 2], np.int32)
    for args, attrs in (((x, w, r), dict(clip=0.5)),
                        ((x, w, r), dict(activations=["HardSigmoid"] + ["Relu"] * (g - 2))),
                        ((x, w, r, None, lens), {})):
        want = OPS[op].kernel(*args, **attrs)
        for got, exp in zip(kernel(*args, **attrs), want):
            np.testing.assert_array_equal(got, exp)
    with pytest.raises(ValueError):  # the reference's error for a length past the sequence
        kernel(x, w, r, None, np.array([6, 2], np.int32))


@pytest.mark.parametrize("axes, kwargs", [([1], {}), ([0, 2], {}), ([1, 1], {}), ([], {}),
                                          ([], dict(noop_with_empty_axes=1)), ([3], {})])
def test_reduce_mean_over_other_axes_takes_the_reference(axes, kwargs):
    """Only a block of trailing axes is one row per output; inner or scattered axes, repeated
    or out-of-range ones and an empty list with noop_with_empty_axes go to the reference
    kernel (which computes them, or names what is wrong, as without the plugin)."""
    kernel, supports = (registry.resolve(x) for x in plugin.KERNELS["ReduceMean"])
    x = np.random.default_rng(6).standard_normal((2, 5, 4)).astype(np.float32)
    a = np.array(axes, np.int64)
    if axes == [] and not kwargs:  # every axis: a trailing block, the kernel's
        assert supports(x, a, **kwargs)
        np.testing.assert_allclose(kernel(x, a, **kwargs), OPS["ReduceMean"].kernel(x, a),
                                   **TOL[np.float32])
        return
    assert not supports(x, a, **kwargs)
    try:
        want = OPS["ReduceMean"].kernel(x, a, **kwargs)
    except Exception as exc:  # the reference's own error, raised by the kernel too
        with pytest.raises(type(exc)):
            kernel(x, a, **kwargs)
        return
    np.testing.assert_allclose(kernel(x, a, **kwargs), want, **TOL[np.float32])


def test_cross_entropy_gradient_of_a_confident_row_is_rounded_once():
    """At the label, softmax - 1 of a confident row is tiny: the kernel subtracts in float64
    before it rounds, as the reference does (rounding exp(lp) * c to float32 first left one
    float32 ulp of c, or 0)."""
    kernel = registry.resolve(plugin.KERNELS["SoftmaxCrossEntropyLossGrad"][0])
    lp = np.full((64, 3), -20.0, np.float32)
    lp[:, 1] = [-1e-7, -1e-8] * 32
    labels = np.ones(64, np.int64)
    want = OPS["SoftmaxCrossEntropyLossGrad"].kernel(lp, labels, np.asarray(1.0, np.float32))
    got = kernel(lp, labels, np.asarray(1.0, np.float32))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    assert got[1, 1] != 0
