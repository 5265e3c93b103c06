"""Planned calls that offer their kernel's machine code to the compiled plan (``direct``, see
onemodel/tensors/ops/specialize.py): the plan calls it with no Python frame and no checks,
so a call may offer it only where the plan's proofs cover every check the call makes. Each
case runs the offered kernel on planned arrays against the call itself (bit for bit), and
asks again with each proof taken away: a feed, another shape or dtype, another constant, an
output of another shape, more than one thread."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from conv_arrays import file_constant

from onemodel.numba import conv, fused, gemm, norm, pool
from onemodel.tensors.ops.specialize import (
    CallSite,
    Constant,
    Input,
    Output,
    Planned,
    specialize,
)

pytestmark = pytest.mark.usefixtures("serial")  # the kernels offered are the serial ones

RNG = np.random.default_rng(5)


def _x(*shape):
    return (RNG.standard_normal(shape) * 2).astype(np.float32)


def _w(*shape):
    return file_constant(RNG.standard_normal(shape).astype(np.float32))


CASES = {
    "pointwise, pixel lanes": (
        conv.fused_conv, [_x(2, 16, 8, 8), _w(48, 16, 1, 1), _w(48)],
        dict(activation="Relu6"), "pointwise_at"),
    "pointwise, channel lanes, no bias": (
        conv.conv, [_x(2, 96, 2, 2), _w(16, 96, 1, 1)], {}, "pointwise_at"),
    "pointwise with a residual": (
        conv.fused_conv, [_x(2, 32, 4, 4), _w(24, 32, 1, 1), _w(24), _x(2, 24, 4, 4)],
        dict(activation="Relu"), "pointwise_residual_at"),
    "depthwise": (
        conv.fused_conv, [_x(2, 32, 8, 8), _w(32, 1, 3, 3), _w(32)],
        dict(group=32, pads=(1, 1, 1, 1), activation="Relu6"), "depthwise_at"),
    "depthwise, strided": (
        conv.conv, [_x(2, 24, 9, 9), _w(24, 1, 5, 5), _w(24)],
        dict(group=24, pads=(2, 2, 2, 2), strides=(2, 2)), "depthwise_at"),
    "depthwise trimmed to its live taps": (
        conv.fused_conv, [_x(2, 64, 1, 1), _w(64, 1, 3, 3), _w(64)],
        dict(group=64, pads=(1, 1, 1, 1), activation="Relu6"), "trimmed_at"),
    "global average pool": (pool.global_average_pool, [_x(2, 40, 5, 5)], {}, "pool_at"),
    "max pool": (pool.max_pool, [_x(2, 3, 9, 9)], dict(kernel_shape=(3, 3), strides=(2, 2)),
                 "pool_at"),
    "average pool": (pool.average_pool, [_x(2, 3, 7, 6)],
                     dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1)), "pool_at"),
    "max pool, lanes": (pool.max_pool, [_x(2, 16, 8, 8)],
                        dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1)), "max_lanes_at"),
    "a residual block's depthwise convolution": (
        conv.fused_conv, [_x(2, 16, 8, 8), _w(16, 1, 3, 3), _w(16), _x(2, 16, 8, 8)],
        dict(group=16, pads=(1, 1, 1, 1), activation="Relu"), "residual_at"),
    "LayerNormalization, its statistics unnamed": (
        norm.layer_normalization, [_x(2, 5, 32), _w(32), _w(32)], {},
        "layer_normalization_at"),
    "SkipLayerNormalization, its sum unnamed": (
        norm.skip_layer_normalization, [_x(2, 5, 32), _x(2, 5, 32), _w(32), _w(32), _w(32)],
        {}, "skip_layer_normalization_at"),
    "SkipLayerNormalization of a broadcast skip, no bias": (
        norm.skip_layer_normalization, [_x(2, 5, 32), _x(5, 32), _w(32), _w(32)], {},
        "skip_layer_normalization_at"),
    "RMSNormalization": (norm.rms_normalization, [_x(2, 5, 32), _w(32)], {},
                         "rms_normalization_at"),
    "LayerNormalization over the channels": (
        norm.channel_layer_normalization, [_x(2, 16, 4, 4), _w(16), _w(16)], {},
        "channel_layer_normalization_at"),
    "a stem on convolution rows": (
        conv.fused_conv, [_x(2, 3, 32, 32), _w(16, 3, 3, 3), _w(16)],
        dict(pads=(1, 1, 1, 1), strides=(2, 2), activation="Relu"), "conv_at"),
    "a convolution on register tiles": (
        conv.fused_conv, [_x(2, 16, 17, 17), _w(32, 16, 3, 3), _w(32)],
        dict(pads=(1, 1, 1, 1), activation="Relu"), "conv_at"),
    "a 1x1 convolution by one matmul": (
        conv.fused_conv, [_x(2, 64, 16, 16), _w(30, 64, 1, 1), _w(30)],
        dict(activation="Relu"), "direct_at"),
    "small convolution": (
        conv.fused_conv, [_x(2, 5, 5, 5), _w(6, 5, 3, 3), _w(6)],
        dict(pads=(1, 1, 1, 1), activation="Tanh"), "conv_small_at"),
    "small convolution along its outputs": (
        conv.conv, [_x(2, 8, 4, 4), _w(64, 8, 1, 3)], dict(pads=(0, 1, 0, 1)),
        "conv_small_at"),
    "panels": (gemm.matmul, [_x(12, 96), _w(96, 384)], {}, "panels_at"),
    "panels over leading axes": (gemm.matmul, [_x(2, 5, 32), _w(32, 64)], {}, "panels_at"),
    "panels with their bias": (gemm.fused_matmul, [_x(2, 5, 32), _w(32, 64), _w(64)],
                               dict(activation=""), "biased_matmul_at"),
    "a transformer's Linear and GELU": (
        gemm.fused_matmul, [_x(2, 5, 32), _w(32, 64), _w(64)], dict(activation="Gelu"),
        "fused_matmul_at"),
    "a Linear layer on panels": (gemm.fused_gemm, [_x(8, 64), _w(40, 64), _w(40)],
                                 dict(activation="Relu", transB=1), "fused_gemm_at"),
    "a chain of two": (fused.fused_elementwise, [_x(2, 6, 5, 7), _x(2, 6, 5, 7)],
                       dict(program=("Add x0 x1", "Relu t0")), "fused2"),
    "a chain with a bias row": (fused.fused_elementwise, [_x(2, 3, 40), _w(40)],
                                dict(program=("Add x0 x1", "Relu t0")), "fused_as_shaped"),
    "a chain of three, broadcast": (
        fused.fused_elementwise, [_x(2, 3, 4, 5), _w(1, 3, 1, 1), _x(2, 3, 4, 5)],
        dict(program=("Mul x0 x1", "Add t0 x2", "Sigmoid t1")), "fused"),
    "GELU's chain, its scalars baked": (
        fused.fused_elementwise, [_x(2, 5, 64), _w(), _w(), _w()],
        dict(program=("Div x0 x1", "Erf t0", "Add t1 x2", "Mul x0 t2", "Mul t3 x3")),
        "fused_as_shaped"),
}
# calls that read their constant inputs as any other array (a chain's bias row): a planned
# buffer of that shape may stand in for one
READ_AS_ARRAYS = {"a chain with a bias row", "a chain of three, broadcast"}
# inputs that are a plan's constants: the weights and biases (not X, not a residual)
CONSTS = {name: {i for i, a in enumerate(c[1]) if not a.flags.writeable}
          for name, c in CASES.items()}


def _planned_call(name):
    kernel, inputs, attrs, called = CASES[name]
    generic = partial(kernel, **attrs)
    want = _first(generic(*inputs))  # (the first output alone is named)
    consts = CONSTS[name]
    site = CallSite(tuple(a.shape for a in inputs), tuple(a.dtype for a in inputs),
                    tuple(a if i in consts else None for i, a in enumerate(inputs)),
                    dict(attrs), (want.shape,), generic)
    call = specialize(kernel, site)
    assert call is not None and call.__name__ == called
    known = tuple(Constant(a) if i in consts else Planned(a.shape, a.dtype)
                  for i, a in enumerate(inputs))
    return call, inputs, known, Planned(want.shape, want.dtype)


def _first(result):
    return result[0] if isinstance(result, tuple) else result


def _run(offered, inputs, out):
    """What the compiled plan's line does with a Direct (or several, in order)."""
    for direct in offered if isinstance(offered, tuple) else (offered,):
        args = []
        for a in direct.arguments:
            if type(a) is Input:
                args.append(inputs[a.index] if a.shape is None else
                            inputs[a.index].reshape(a.shape))
            elif type(a) is Output:
                args.append(out if a.shape is None else out.reshape(a.shape))
            else:
                args.append(a)
        direct.run(*args)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_the_offered_kernel_gives_the_calls_values(name):
    call, inputs, known, out = _planned_call(name)
    direct = call.direct(known, out)
    assert direct is not None
    want = _first(call(*inputs))
    got = _run(direct, inputs, np.full(out.shape, np.nan, np.float32))
    assert np.array_equal(got, want)
    again = _run(direct, [a * 0.5 if i not in CONSTS[name] else a
                          for i, a in enumerate(inputs)], np.empty(out.shape, np.float32))
    assert np.array_equal(again, _first(call(*[a * 0.5 if i not in CONSTS[name] else a
                                               for i, a in enumerate(inputs)])))


def _without(known, index, fact):
    return tuple(fact if i == index else k for i, k in enumerate(known))


@pytest.mark.parametrize("name", list(CASES))
def test_nothing_is_offered_without_every_proof(name):
    call, inputs, known, out = _planned_call(name)
    x = inputs[0]
    assert call.direct(_without(known, 0, None), out) is None  # a feed: nothing known
    assert call.direct(_without(known, 0, Constant(x)), out) is None  # known, not planned
    bigger = (x.shape[0] + 1, *x.shape[1:])
    assert call.direct(_without(known, 0, Planned(bigger, x.dtype)), out) is None
    assert call.direct(_without(known, 0, Planned(x.shape, np.dtype(np.float64))), out) is None
    assert call.direct(known, Planned((out.shape[0] + 1, *out.shape[1:]), out.dtype)) is None
    assert call.direct(known, Planned(out.shape, np.dtype(np.float64))) is None
    for i in CONSTS[name]:  # the same values in another array: not the planned constant
        assert call.direct(_without(known, i, Constant(inputs[i].copy())), out) is None
        if name not in READ_AS_ARRAYS:
            assert call.direct(_without(known, i, Planned(inputs[i].shape, np.float32)),
                               out) is None
    if len(inputs) == 4:  # the residual: a feed or another shape
        z = inputs[3]
        assert call.direct(_without(known, 3, None), out) is None
        assert call.direct(_without(known, 3, Planned((1, *z.shape[1:]), z.dtype)),
                           out) is None
    assert call.direct(known, out) is not None  # (every proof back: offered)


@pytest.mark.parametrize("name", [n for n, c in CASES.items()
                                  if c[3] in ("depthwise_at", "pool_at", "residual_at",
                                              "fused_matmul_at", "fused2", "fused",
                                              "fused_as_shaped", "layer_normalization_at",
                                              "skip_layer_normalization_at",
                                              "rms_normalization_at", "direct_at",
                                              "channel_layer_normalization_at")])
def test_calls_that_run_in_parallel_offer_nothing_on_two_threads(name, parallel_variants):
    call, _inputs, known, out = _planned_call(name)
    assert call.direct(known, out) is None


def test_skip_layer_norm_writes_a_named_sum_into_the_second_output():
    kernel, inputs, attrs, _ = CASES["SkipLayerNormalization, its sum unnamed"]
    consts = CONSTS["SkipLayerNormalization, its sum unnamed"]
    y, total = kernel(*inputs, **attrs)
    site = CallSite(tuple(a.shape for a in inputs), tuple(a.dtype for a in inputs),
                    tuple(a if i in consts else None for i, a in enumerate(inputs)),
                    dict(attrs), (y.shape, total.shape), partial(kernel, **attrs))
    call = specialize(kernel, site)
    known = tuple(Constant(a) if i in consts else Planned(a.shape, a.dtype)
                  for i, a in enumerate(inputs))
    offered = call.direct(known, Planned(y.shape, y.dtype))
    outs = [np.full(y.shape, np.nan, np.float32), np.full(y.shape, np.nan, np.float32)]
    args = [inputs[a.index] if type(a) is Input else outs[a.index] if type(a) is Output else a
            for a in offered.arguments]
    offered.run(*args)
    want_y, want_total = call(*inputs)
    assert np.array_equal(outs[0], want_y) and np.array_equal(outs[1], want_total)


@pytest.mark.parametrize("name", ["LayerNormalization, its statistics unnamed"])
def test_norms_whose_other_outputs_are_named_offer_nothing(name):
    """The kernel offered writes only the first output: a node that names the statistics
    keeps its call, which returns them."""
    kernel, inputs, attrs, _ = CASES[name]
    consts = CONSTS[name]
    outs = kernel(*inputs, **attrs)
    site = CallSite(tuple(a.shape for a in inputs), tuple(a.dtype for a in inputs),
                    tuple(a if i in consts else None for i, a in enumerate(inputs)),
                    dict(attrs), tuple(o.shape for o in outs), partial(kernel, **attrs))
    call = specialize(kernel, site)
    known = tuple(Constant(a) if i in consts else Planned(a.shape, a.dtype)
                  for i, a in enumerate(inputs))
    assert call.direct(known, Planned(outs[0].shape, outs[0].dtype)) is None
