"""The numba kernels' plan-time specializers (onemodel.tensors.ops.specialize): each specialized
call gives what the generic call gives, bit for bit (strided inputs, float32 and float64, with
and without ``out=``), and takes the generic path for inputs of other shapes or dtypes than
planned. A session over a small network uses them and agrees with onnxruntime."""

from __future__ import annotations

import inspect
from dataclasses import replace
from functools import partial

import numpy as np
import pytest

from onemodel.numba import attention, conv, fused, gemm, norm, pool, reduction, softmax
from onemodel.tensors import OneModelError
from onemodel.tensors.errors import ShapeError
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.specialize import CallSite, specialize

RNG = np.random.default_rng(7)


def _x(*shape):
    return RNG.standard_normal(shape)


GELU = ("Div x0 x1", "Erf t0", "Add t1 x2", "Mul x0 t2", "Mul t3 x3")

# (kernel, inputs (float64 arrays; cast per dtype), attributes, indices of constant inputs,
#  whether the kernel writes out=)
CASES = [
    (attention.fused_attention, [_x(2, 3, 5, 8), _x(2, 3, 8, 5), _x(2, 3, 5, 8), _x(2, 1, 1, 5)],
     dict(scale=0.35), (), True),  # one pass per query row
    (attention.fused_attention, [_x(4, 6, 8), _x(4, 8, 6), _x(4, 6, 7)], {}, (), True),
    (attention.fused_attention, [_x(1, 2, 40, 16), _x(1, 2, 16, 40), _x(1, 2, 40, 16),
                                 _x(40, 40)], dict(scale=0.25), (3,), True),  # BLAS products
    (conv.conv, [_x(8, 3, 16, 16), _x(8, 3, 3, 3), _x(8)], dict(pads=(1, 1, 1, 1)), (1, 2), True),
    (conv.conv, [_x(8, 8, 8, 8), _x(16, 8, 3, 3)], dict(strides=(2, 2)), (1,), True),
    (conv.conv, [_x(4, 3, 6, 6), _x(5, 3, 3, 3), _x(5)], {}, (), True),  # one GEMM, inputs
    (conv.conv, [_x(2, 4, 5, 5), _x(6, 4, 1, 1), _x(6)], {}, (1, 2), True),  # 1x1: direct
    (conv.conv, [_x(2, 4, 6, 6), _x(6, 2, 3, 3), _x(6)], dict(group=2, pads=(1, 0, 1, 0)),
     (1, 2), True),
    (conv.conv, [_x(2, 16, 6, 6), _x(16, 1, 3, 3), _x(16)], dict(group=16, pads=(1, 1, 1, 1)),
     (1, 2), True),  # depthwise, channels-last
    (conv.conv, [_x(1, 4, 9, 9), _x(4, 1, 3, 3)], dict(group=4, strides=(2, 2)), (1,), True),
    (conv.conv, [_x(1, 4, 20, 20), _x(8, 1, 5, 5)], dict(group=4, dilations=(2, 1)), (1,), True),
    (conv.conv, [_x(2, 3, 10), _x(4, 3, 3), _x(4)], dict(pads=(1, 1)), (1, 2), True),  # 1-D
    (conv.conv, [_x(2, 3, 11), _x(4, 3, 3)], dict(strides=(2,), auto_pad="SAME_UPPER"), (1,),
     True),
    (conv.fused_conv, [_x(2, 3, 7, 7), _x(4, 3, 3, 3), _x(4)], dict(activation="Relu"), (1, 2),
     True),
    (conv.fused_conv, [_x(2, 3, 7, 7), _x(4, 3, 3, 3), _x(4)], dict(activation="Sigmoid"),
     (1, 2), True),
    (conv.fused_conv, [_x(1, 8, 5, 5), _x(8, 1, 3, 3), _x(8)],
     dict(activation="Tanh", group=8, pads=(1, 1, 1, 1)), (1, 2), True),
    (conv.fused_conv, [_x(3, 4, 4, 4), _x(4, 4, 1, 1)], {}, (1,), True),
    (gemm.fused_gemm, [_x(3, 7), _x(7, 5), _x(5)], {}, (1, 2), True),
    (gemm.fused_gemm, [_x(2, 6), _x(9, 6), _x(9)], dict(transB=1, activation="Sigmoid"),
     (1, 2), True),
    (gemm.fused_gemm, [_x(6, 4), _x(6, 5)], dict(transA=1, activation="Tanh"), (), True),
    (pool.max_pool, [_x(8, 8, 16, 16)], dict(kernel_shape=(2, 2), strides=(2, 2)), (), True),
    (pool.max_pool, [_x(2, 3, 9, 9)], dict(kernel_shape=(3, 3), strides=(2, 2),
                                           pads=(1, 1, 1, 1)), (), True),
    (pool.max_pool, [_x(2, 3, 8, 7)], dict(kernel_shape=(2, 3), ceil_mode=1, strides=(2, 2),
                                           dilations=(1, 2)), (), True),
    (pool.max_pool, [_x(2, 3, 7, 7)], dict(kernel_shape=(2, 2), strides=(2, 2)), (), True),
    (pool.max_pool, [_x(1, 2, 7, 8)], dict(kernel_shape=(3, 3), strides=(2, 2),
                                           auto_pad="SAME_UPPER"), (), True),
    (pool.average_pool, [_x(8, 16, 4, 4)], dict(kernel_shape=(2, 2), strides=(2, 2)), (), True),
    (pool.average_pool, [_x(2, 3, 7, 6)], dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1)), (),
     True),
    (pool.average_pool, [_x(2, 3, 7, 6)], dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1),
                                               count_include_pad=1, strides=(2, 1)), (), True),
    (pool.global_average_pool, [_x(2, 3, 4, 5)], {}, (), True),
    (pool.global_average_pool, [_x(2, 5, 7)], {}, (), True),
    (norm.batch_normalization, [_x(2, 3, 4, 4), _x(3), _x(3), _x(3), np.abs(_x(3)) + 0.5],
     dict(epsilon=1e-3), (1, 2, 3, 4), True),
    (norm.batch_normalization, [_x(2, 3, 5), _x(3), _x(3), _x(3), np.abs(_x(3)) + 0.5], {}, (),
     True),
    (norm.layer_normalization, [_x(2, 5, 32), _x(32), _x(32)], {}, (1, 2), False),
    (norm.layer_normalization, [_x(2, 5, 32), _x(32)], {}, (1,), False),
    (norm.layer_normalization, [_x(3, 4, 6), _x(4, 6), _x(6)], dict(axis=1, epsilon=1e-3),
     (), False),
    (norm.layer_normalization, [_x(3, 7), _x(7), _x(7)], dict(stash_type=0), (1,), False),
    (norm.rms_normalization, [_x(2, 5, 32), _x(32)], {}, (1,), True),
    (norm.rms_normalization, [_x(3, 4, 6), _x(4, 6)], dict(axis=-2), (), True),
    (norm.lrn, [_x(2, 5, 4, 4)], dict(size=3, alpha=1e-3), (), False),
    (softmax.softmax, [_x(2, 2, 5, 5)], {}, (), True),
    (softmax.softmax, [_x(3, 70)], dict(axis=1), (), True),
    (softmax.softmax, [_x(2, 7, 1, 1)], dict(axis=1), (), True),  # trailing size-1 axes
    (softmax.log_softmax, [_x(2, 2, 5, 5)], {}, (), True),
    (softmax.log_softmax, [_x(4, 33)], dict(axis=-1), (), True),
    (fused.fused_elementwise, [_x(2, 6, 5, 7), _x(1, 6, 1, 1)],
     dict(program=("Add x0 x1", "Relu t0")), (1,), True),
    (fused.fused_elementwise, [_x(4, 9), _x(9), _x(4, 1)],
     dict(program=("Mul x0 x1", "Add t0 x2", "Clip t1 -0.5 nan", "Sigmoid t2")), (), True),
    (fused.fused_elementwise, [_x(3, 29)], dict(program=("HardSwish x0",)), (), True),
    (fused.fused_elementwise, [_x(2, 3, 4), _x(2, 3, 4)],
     dict(program=("Sub x0 x1", "Abs t0", "Sqrt t1", "Tanh t2")), (), True),
    (fused.fused_elementwise, [_x(5, 1, 8), _x(1, 3, 1)],
     dict(program=("Mul x0 x1", "Erf t0")), (), True),
    # scalar constants written into the kernel as literals (GELU as exporters write it)
    (fused.fused_elementwise, [_x(2, 5, 64), np.array(np.sqrt(2.0)), np.array(1.0),
                               np.array(0.5)],
     dict(program=GELU), (1, 2, 3), True),
    (fused.fused_elementwise, [_x(3, 4), np.array([[np.inf]]), _x(4)],
     dict(program=("Mul x0 x1", "Add t0 x2")), (1,), True),
    (reduction.reduce_mean, [_x(2, 32, 1, 1), np.array([-2, -1])], {}, (1,), False),
    (reduction.reduce_mean, [_x(2, 5, 3, 4), np.array([3, 1, 2])], dict(keepdims=0), (1,),
     False),
    (reduction.reduce_mean, [_x(3, 7)], {}, (), False),  # every axis
    (reduction.reduce_mean, [_x(3, 7)], dict(keepdims=0), (), False),  # to a 0-d array
]
DTYPES = (np.float32, np.float64)


def _ids():
    return [f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)]


def _site(kernel, inputs, attrs, consts):
    """The call site the planner describes for ``inputs`` (those at ``consts`` constant)."""
    generic = partial(kernel, **attrs)
    got = generic(*inputs)
    outs = got if isinstance(got, tuple) else (got,)
    return CallSite(tuple(a.shape for a in inputs), tuple(a.dtype for a in inputs),
                    tuple(a if i in consts else None for i, a in enumerate(inputs)),
                    dict(attrs), tuple(o.shape for o in outs), generic)


def _same(got, want):
    """Bit for bit: shape, dtype and bytes (NaN payloads and signed zeros included)."""
    got_all = got if isinstance(got, tuple) else (got,)
    want_all = want if isinstance(want, tuple) else (want,)
    assert len(got_all) == len(want_all)
    for g, w in zip(got_all, want_all):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert np.ascontiguousarray(g).tobytes() == np.ascontiguousarray(w).tobytes()


def _strided(a):
    """The same values as a non-contiguous view (every other element of a larger array)."""
    big = np.empty(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    big[..., ::2] = a
    big[..., 1::2] = np.nan
    return big[..., ::2]


def _cast(inputs, dtype):
    """The float inputs in ``dtype``; integer ones (ReduceMean's axes) as they are."""
    return [a.astype(dtype) if a.dtype.kind == "f" else a for a in inputs]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel,inputs,attrs,consts,writes_out", CASES, ids=_ids())
def test_specialized_equals_generic(kernel, inputs, attrs, consts, writes_out, dtype):
    inputs = _cast(inputs, dtype)
    if kernel in (softmax.softmax, softmax.log_softmax):
        inputs[0][0, 0] = 40.0  # a large entry: the exponentials' range reduction matters
    site = _site(kernel, inputs, attrs, consts)
    call = specialize(kernel, site)
    assert call is not None, "declined"
    generic = site.generic
    for _ in range(2):  # a second call: nothing planned is consumed by the first
        _same(call(*inputs), generic(*inputs))
    # inputs of the planned shapes but strided, and non-constant copies of the constants
    others = [_strided(a) if a.ndim and a.dtype.kind == "f" else a.copy() for a in inputs]
    _same(call(*others), generic(*inputs))
    if writes_out:
        want = generic(*inputs)
        out = np.full(want.shape, np.nan, want.dtype)
        assert call(*inputs, out=out) is out
        _same(out, want)
        out2 = np.full(want.shape, np.nan, want.dtype)
        assert call(*others, out=out2) is out2
        _same(out2, want)


def _grown(a):
    return np.concatenate([a, a[:1]])


@pytest.mark.parametrize("kernel,inputs,attrs,consts,writes_out", CASES, ids=_ids())
def test_other_shapes_and_dtypes_take_the_generic_path(kernel, inputs, attrs, consts,
                                                       writes_out):
    inputs = _cast(inputs, np.float32)
    site = _site(kernel, inputs, attrs, consts)
    call = specialize(kernel, site)
    generic = site.generic
    variants = [
        [_grown(inputs[0]), *inputs[1:]],  # a larger batch
        [inputs[0].astype(np.float64), *inputs[1:]],  # another dtype
        _cast(inputs, np.float64),  # another dtype throughout
    ]
    if len(inputs) > 1 and inputs[1].ndim:
        variants.append([inputs[0], inputs[1][..., :1], *inputs[2:]])  # another 2nd shape
    if kernel in (conv.conv, conv.fused_conv):
        variants.append(inputs[:2] + [None] * (len(inputs) == 3))  # the bias left out
        if len(inputs) == 3:
            variants.append([*inputs[:2], inputs[2].astype(np.float64)])  # another bias dtype
        if len(inputs) == 2:
            variants.append([*inputs, np.zeros(inputs[1].shape[0], np.float32)])  # one added
    if kernel is norm.layer_normalization:
        variants.append([*inputs[:2], np.zeros(inputs[1].shape, np.float32)] if len(inputs) == 2
                        else inputs[:2])
    for args in variants:
        try:
            want = generic(*args)
        except Exception as exc:  # the generic call refuses: so does the specialized one
            with pytest.raises(type(exc)):
                call(*args)
            continue
        _same(call(*args), want)


@pytest.mark.parametrize("kernel,inputs,attrs,consts,writes_out", CASES, ids=_ids())
def test_thread_setting_changes_between_calls(kernel, inputs, attrs, consts, writes_out,
                                              parallel_variants):
    """A specialized call made with one thread runs the parallel variants when the setting
    says so later, with the generic call's result."""
    inputs = _cast(inputs, np.float32)
    site = _site(kernel, inputs, attrs, consts)
    call = specialize(kernel, site)
    _same(call(*inputs), site.generic(*inputs))


def test_declined_sites():
    """Sites the generic call must handle: other dtypes, empty outputs, a Softmax over an
    axis followed by longer axes, attributes the kernel refuses."""
    x = _x(2, 3, 4, 4).astype(np.float32)
    w = _x(4, 3, 3, 3).astype(np.float32)
    assert specialize(conv.conv, _site(conv.conv, [x, w.astype(np.float64)], {}, ())) is None
    assert specialize(conv.fused_conv, CallSite(
        (x.shape, w.shape), (x.dtype, w.dtype), (None, None), {"activation": "Elu"}, ((2, 4, 2, 2),),
        None)) is None
    assert specialize(softmax.softmax, _site(softmax.softmax, [x], {"axis": 1}, ())) is None
    empty = np.zeros((0, 3, 4, 4), np.float32)
    assert specialize(pool.max_pool, CallSite((empty.shape,), (empty.dtype,), (None,),
                                              {"kernel_shape": (2, 2)}, ((0, 3, 3, 3),),
                                              None)) is None
    assert specialize(pool.average_pool, CallSite(
        (x.shape,), (x.dtype,), (None,), {"kernel_shape": (9, 9)}, ((2, 3, -4, -4),),
        None)) is None


def _model(path):
    """Conv+Relu, MaxPool, AveragePool, GlobalAveragePool, Flatten, LayerNormalization and
    Softmax, as an ONNX file."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = {"W": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
             "B": rng.standard_normal(8).astype(np.float32),
             "S": rng.standard_normal(8).astype(np.float32),
             "T": rng.standard_normal(8).astype(np.float32)}
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("AveragePool", ["m"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Softmax", ["a"], ["s1"], axis=-1),
        helper.make_node("GlobalAveragePool", ["s1"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("LayerNormalization", ["f", "S", "T"], ["l"], epsilon=1e-5),
        helper.make_node("Softmax", ["l"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8]),
         helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 8, 8, 8])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)


def test_session_uses_the_specialized_calls_and_matches_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    from onemodel.runtime import Session

    path = str(tmp_path / "small.onnx")
    _model(path)
    x = np.random.default_rng(4).standard_normal((2, 3, 16, 16)).astype(np.float32)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want_y, want_a = ref.run(["y", "a"], {"x": x})
    session = Session.load(path)
    for _ in range(3):  # the first run, then runs with planned buffers
        got = session.run({"x": x})
        np.testing.assert_allclose(got["y"].numpy(), want_y, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["a"].numpy(), want_a, rtol=1e-5, atol=1e-6)
    steps = next(iter(session._plans.values())).steps
    calls = {s.op: s.call for s in steps}
    for op in ("FusedConv", "MaxPool", "AveragePool", "GlobalAveragePool",
               "LayerNormalization", "Softmax"):
        assert op in calls, sorted(calls)
        call = calls[op]
        if call.__qualname__.startswith("fresh_out."):  # a graph output's new-buffer wrapper
            call = inspect.getclosurevars(call).nonlocals["call"]
        assert "_at" in call.__qualname__, (op, call.__qualname__)


@pytest.mark.parametrize("kernel", [pool.max_pool, pool.average_pool, pool.global_average_pool])
def test_pool_out_of_another_shape_is_refused_as_by_the_generic_call(kernel):
    x = _x(2, 3, 4, 4).astype(np.float32)
    attrs = {} if kernel is pool.global_average_pool else {"kernel_shape": (2, 2)}
    call = specialize(kernel, _site(kernel, [x], attrs, ()))
    with pytest.raises(OneModelError, match="out= must be"):
        call(x, out=np.empty((2, 3, 5, 5), np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_without_named_statistics_skips_them(dtype):
    """A node naming only Y (an exported inference graph's) gets Y alone, bit for bit."""
    inputs = [_x(2, 5, 32).astype(dtype), _x(32).astype(dtype), _x(32).astype(dtype)]
    site = _site(norm.layer_normalization, inputs, {}, (1, 2))
    site = replace(site, out_shapes=(site.out_shapes[0], None, None))
    call = norm.layer_normalization.specialize(site)
    y, mean, inv = call(*inputs)
    assert mean is None and inv is None
    _same(y, norm.layer_normalization(*inputs)[0])


def test_a_fused_chain_writes_whichever_out_it_is_given():
    """The specialized chain keeps the view of the last out= it was given; alternating buffers
    (two buffer sets of one plan) each get their own call's result."""
    x, bias = _x(4, 9).astype(np.float32), _x(9).astype(np.float32)
    attrs = dict(program=("Add x0 x1", "Relu t0"))
    want = np.maximum(x + bias, 0)
    call = specialize(fused.fused_elementwise, _site(fused.fused_elementwise, [x, bias], attrs,
                                                     ()))
    first, second = np.empty_like(want), np.empty_like(want)
    for out in (first, second, first, second):
        out[...] = np.nan
        assert call(x, bias, out=out) is out
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes,program,as_shaped", [
    # a transformer's output projection: bias, then the residual; the last axis stays
    (((2, 16, 32), (32,), (2, 16, 32)), ("Add x1 x0", "Add t0 x2"), True),
    # a broadcast on every axis, inputs of three ranks
    (((5, 1, 8), (3, 1), (8,)), ("Mul x0 x1", "Add t0 x2", "Tanh t1"), True),
    # a small activation whose collapse would merge the rows (64 rows of 32)
    (((2, 32, 32),), ("Sigmoid x0",), True),
    # per-channel bias over NCHW: collapsed (the rows of 8 merge into 64)
    (((2, 6, 8, 8), (1, 6, 1, 1)), ("Add x0 x1", "Relu t0"), False),
    # scalars (an expanded Range's arithmetic): no last axis to keep
    (((), (), ()), ("Sub x0 x1", "Div t0 x2"), False),
])
def test_a_chain_along_the_last_axis_takes_its_arrays_as_shaped(shapes, program, as_shaped,
                                                                 dtype):
    """Chains that keep the last axis run a kernel given the arrays as they are (no views made
    per call): equal bit for bit to the generic call, for strided inputs and a strided out too,
    and other shapes or dtypes go to the generic call."""
    inputs = [_x(*s).astype(dtype) for s in shapes]
    site = _site(fused.fused_elementwise, inputs, dict(program=program), ())
    call = specialize(fused.fused_elementwise, site)
    assert ("as_shaped" in call.__qualname__) is as_shaped
    want = site.generic(*inputs)
    _same(call(*inputs), want)
    # and the op's reference kernel, which runs the chain op by op in numpy
    np.testing.assert_allclose(call(*inputs), OPS["FusedElementwise"].kernel(
        *inputs, program=program), rtol=1e-6 if dtype == np.float32 else 1e-12, atol=1e-7)
    _same(call(*[_strided(a) if a.ndim else a.copy() for a in inputs]), want)
    out = np.full(want.shape, np.nan, dtype)
    out = _strided(out) if out.ndim else out
    assert call(*inputs, out=out) is out
    _same(out, want)
    other = [inputs[0].astype(np.float64 if dtype == np.float32 else np.float32), *inputs[1:]]
    _same(call(*other), site.generic(*other))
    if len(inputs) > 1:
        mixed = [inputs[0], inputs[1].astype(np.float64 if dtype == np.float32 else np.float32),
                 *inputs[2:]]
        _same(call(*mixed), site.generic(*mixed))
    if not inputs[0].ndim:
        return
    grown = [np.concatenate([inputs[0], inputs[0][:1]]), *inputs[1:]]
    try:
        want = site.generic(*grown)
    except Exception as exc:  # shapes that no longer broadcast: the same error, from generic
        with pytest.raises(type(exc)):
            call(*grown)
    else:
        _same(call(*grown), want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scalar_constants_of_a_chain_are_baked_and_only_the_planned_ones_used(dtype):
    """The planned constants are literals of the kernel; a call given other arrays in their
    place (equal or not) takes the generic path and uses the values it was given."""
    x = _x(2, 5, 64).astype(dtype)
    consts = [np.array(v, dtype) for v in (np.sqrt(2.0), 1.0, 0.5)]
    site = _site(fused.fused_elementwise, [x, *consts], dict(program=GELU), (1, 2, 3))
    call = specialize(fused.fused_elementwise, site)
    assert call.baked == 3
    _same(call(x, *consts), site.generic(x, *consts))
    other = [np.array(v, dtype) for v in (2.0, 3.0, 0.25)]
    _same(call(x, *other), site.generic(x, *other))
    want = 0.25 * x * (3.0 + np.vectorize(__import__("math").erf)(x / 2.0))
    np.testing.assert_allclose(call(x, *other), want, rtol=1e-5, atol=1e-6)


def test_a_nan_constant_finds_its_kernel_again():
    """Two plans of a chain with a NaN constant share one generated kernel (its key holds the
    literal's text, not a float NaN that equals nothing) and propagate the NaN."""
    nan = np.array(np.nan, np.float32)
    for rows in (3, 4):
        x = _x(rows, 8).astype(np.float32)
        site = _site(fused.fused_elementwise, [x, nan], dict(program=("Add x0 x1", "Abs t0")),
                     (1,))
        call = specialize(fused.fused_elementwise, site)
        assert call.baked == 1
        _same(call(x, nan), site.generic(x, nan))
        assert np.isnan(call(x, nan)).all()
        if rows == 3:
            kernels = len(fused._kernels)
    assert len(fused._kernels) == kernels


def _depthwise_site(w):
    """A depthwise convolution of 16 channels over 6x6 planes (the channels-last kernel) with
    ``w`` as its constant weights."""
    x = _x(2, 16, 6, 6).astype(np.float32)
    attrs = dict(group=16, pads=(1, 1, 1, 1))
    assert conv._plan(x.shape, w.shape, 4, None, None, (1, 1, 1, 1), None, "NOTSET",
                      16)[0] == conv._DW_NHWC
    return x, attrs, specialize(conv.conv, _site(conv.conv, [x, w], attrs, (1,)))


def test_channels_last_weights_of_a_file_constant_are_made_once_and_right(no_depthwise_lanes):
    """Weights loaded from a file (read-only views of bytes) are laid out channels-last once,
    at plan time; the result is the generic call's."""
    w = np.frombuffer(_x(16, 1, 3, 3).astype(np.float32).tobytes(), np.float32).reshape(
        16, 1, 3, 3)
    assert conv._immutable(w)
    x, attrs, call = _depthwise_site(w)
    got = call(x, w)
    _same(got, conv.conv(x, w, **attrs))
    np.testing.assert_allclose(got, OPS["Conv"].kernel(x, w, **attrs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("read_only_view", [False, True])
def test_weights_changed_in_place_are_used_as_they_are_now(read_only_view):
    """Weights that can change in place (a traced model's own parameters, or a read-only view
    of them) are not laid out ahead: a call after an update in place uses the new values."""
    w = _x(16, 1, 3, 3).astype(np.float32)
    given = w
    if read_only_view:
        given = w.view()
        given.flags.writeable = False
    assert not conv._immutable(given)
    x, attrs, call = _depthwise_site(given)
    call(x, given)
    w *= -2.0  # the training step's update, in place
    got = call(x, given)
    _same(got, conv.conv(x, w, **attrs))
    np.testing.assert_allclose(got, OPS["Conv"].kernel(x, w, **attrs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", ["Relu", "HardSwish", "Sigmoid", "Silu"])
def test_a_widening_1x1_convolution_of_1x1_planes_uses_weights_laid_out_once(activation):
    """Squeeze-and-excitation's second 1x1 convolution (96 -> 384 channels over 1x1 planes)
    with weights from a file: multiplied as (N, C) @ (C, M) by a (C, M) copy made at plan
    time, then the bias and activation; the result is the reference kernel's."""
    x = _x(2, 96, 1, 1).astype(np.float32)
    w = np.frombuffer(_x(384, 96, 1, 1).astype(np.float32).tobytes(), np.float32).reshape(
        384, 96, 1, 1)
    b = np.frombuffer(_x(384).astype(np.float32).tobytes(), np.float32)
    plan = conv._plan(x.shape, w.shape, 4, None, None, None, None, "NOTSET", 1)
    assert conv._prepared_weights(plan, x.shape, w) is not None
    attrs = dict(activation=activation)
    call = specialize(conv.fused_conv, _site(conv.fused_conv, [x, w, b], attrs, (1, 2)))
    want = OPS["FusedConv"].kernel(x, w, b, **attrs)
    for out in (None, np.empty_like(want)):
        got = call(x, w, b, out=out)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("planned", [False, True])
def test_rms_normalization_fills_a_non_contiguous_out(planned):
    """An out= whose rows cannot be viewed as the kernel's (a transposed buffer) still gets
    the result, from the generic call and the planned one alike."""
    x, scale = _x(3, 4, 8).astype(np.float32), _x(8).astype(np.float32)
    want = norm.rms_normalization(x, scale)
    call = specialize(norm.rms_normalization, _site(norm.rms_normalization, [x, scale], {},
                                                    (1,))) if planned else norm.rms_normalization
    out = np.full((8, 4, 3), np.nan, np.float32).T  # (3, 4, 8), not C-contiguous
    assert call(x, scale, out=out) is out
    _same(out, want)
    with pytest.raises(ShapeError, match="out= has shape"):
        norm.rms_normalization(x, scale, out=np.empty((2, 3, 4, 8), np.float32))


@pytest.mark.parametrize("xshape,k,attrs,path", [
    ((2, 8, 8, 8), 3, dict(pads=(1, 1, 0, 0)), conv._DW_TAPS),
    ((2, 8, 8, 8), 3, dict(pads=(1, 1, 1, 1)), conv._DW_FLAT),
    ((2, 4, 3, 3), 5, dict(pads=(2, 2, 2, 2), strides=(2, 2)), conv._DW_TABLE),
    ((2, 16, 6, 6), 3, dict(pads=(1, 1, 1, 1)), conv._DW_NHWC),
    ((1, 4, 12, 12), 9, dict(pads=(4, 4, 4, 4)), conv._DW),
])
def test_a_planned_depthwise_convolution_calls_its_kernel_directly(xshape, k, attrs, path,
                                                                 no_depthwise_lanes):
    """Depthwise convolutions with constant weights plan a call straight to their kernel, with
    its arguments chosen once: bit for bit the generic call's result, for strided inputs and a
    given out; other weights, another bias or a strided out take the full call; weights
    changed in place are used as they are now (the channels-last path lays out only a file's
    weights, which cannot change)."""
    c = xshape[1]
    x = _x(*xshape).astype(np.float32)
    w = _x(c, 1, k, k).astype(np.float32)
    if path == conv._DW_NHWC:  # a file's constant, as the channels-last path needs
        w = np.frombuffer(w.tobytes(), np.float32).reshape(w.shape)
    b = _x(c).astype(np.float32)
    attrs = dict(attrs, group=c, activation="HardSwish")
    assert conv._plan(x.shape, w.shape, 4, None, attrs.get("strides"), attrs["pads"], None,
                      "NOTSET", c)[0] == path
    site = _site(conv.fused_conv, [x, w, b], attrs, (1, 2))
    call = specialize(conv.fused_conv, site)
    assert call.__qualname__.startswith("_depthwise_site")
    want = site.generic(x, w, b)
    _same(call(x, w, b), want)
    _same(call(_strided(x), w, b), want)
    out = np.full(want.shape, np.nan, np.float32)
    assert call(x, w, b, out=out) is out
    _same(out, want)
    strided_out = _strided(np.full(want.shape, np.nan, np.float32))
    assert call(x, w, b, out=strided_out) is strided_out
    _same(strided_out, want)
    b2 = b + 1.0
    _same(call(x, w, b2), site.generic(x, w, b2))
    w2 = w * 0.5
    _same(call(x, w2, b), site.generic(x, w2, b))
    if path != conv._DW_NHWC:
        w *= -2.0  # an update in place of the planned constant
        _same(call(x, w, b), site.generic(x, w, b))


@pytest.mark.parametrize("activation,bias", [("Relu", True), ("HardSwish", True), (None, False)])
def test_a_planned_1x1_convolution_multiplies_image_by_image_directly(activation, bias):
    """A 1x1 convolution over planes (two images, 96 -> 48 channels over 9x9) with constant
    weights plans a call of one np.dot per image and one bias-and-activation pass: the
    generic call's result, bit for bit, whichever out it is given run after run (the views it
    keeps follow the array), for strided inputs and outs, and for other weights or biases."""
    x = _x(2, 96, 9, 9).astype(np.float32)
    w = _x(48, 96, 1, 1).astype(np.float32)
    b = _x(48).astype(np.float32)
    assert conv._plan(x.shape, w.shape, 4, None, None, None, None, "NOTSET", 1)[0] == \
        conv._DIRECT
    kernel, attrs = (conv.fused_conv, dict(activation=activation)) if activation else \
        (conv.conv, {})
    inputs, consts = ([x, w, b], (1, 2)) if bias else ([x, w], (1,))
    site = _site(kernel, inputs, attrs, consts)
    call = specialize(kernel, site)
    assert call.__qualname__.startswith("_direct_site")
    args = inputs[1:]
    want = site.generic(x, *args)
    if activation == "Relu":
        np.testing.assert_allclose(want, np.maximum(
            np.einsum("mc,nchw->nmhw", w[:, :, 0, 0], x) + b[:, None, None], 0), rtol=1e-4,
            atol=1e-4)
    _same(call(x, *args), want)
    _same(call(_strided(x), *args), want)
    outs = [np.full(want.shape, np.nan, np.float32) for _ in range(2)]
    for out in outs + outs:  # a plan's buffers, alternating
        x2 = _x(*x.shape).astype(np.float32)
        assert call(x2, *args, out=out) is out
        _same(out, site.generic(x2, *args))
    strided_out = _strided(np.full(want.shape, np.nan, np.float32))
    assert call(x, *args, out=strided_out) is strided_out
    _same(strided_out, want)
    w2 = w * 0.5
    _same(call(x, w2, *args[1:]), site.generic(x, w2, *args[1:]))
    if bias:
        b2 = b + 1.0
        _same(call(x, w, b2), site.generic(x, w, b2))
    w *= -2.0  # an update in place of the planned constant
    _same(call(x, *args), site.generic(x, *args))


def test_conv_fills_a_strided_out_and_refuses_one_of_another_shape():
    """The convolution kernels write C-contiguous results: a strided out= is filled through a
    copy, and an out= of another shape is a ShapeError, never written past its end."""
    x, w, b = _x(2, 3, 7, 7).astype(np.float32), _x(4, 3, 3, 3).astype(np.float32), \
        _x(4).astype(np.float32)
    want = conv.fused_conv(x, w, b, activation="Relu", pads=(1, 1, 1, 1))
    out = _strided(np.full(want.shape, np.nan, np.float32))
    assert conv.fused_conv(x, w, b, activation="Relu", pads=(1, 1, 1, 1), out=out) is out
    _same(out, want)
    with pytest.raises(ShapeError, match="out= has shape"):
        conv.fused_conv(x, w, b, activation="Relu", pads=(1, 1, 1, 1),
                        out=np.empty((2, 4, 7, 6), np.float32))


def _file_constant(a):
    """``a`` as a constant loaded from a file is: a read-only view of immutable bytes."""
    a = np.ascontiguousarray(a)
    return np.frombuffer(a.tobytes(), a.dtype).reshape(a.shape)


# (input, weights, attributes, live rows, live columns): dilated or padded windows over small
# planes, some of whose kernel rows or columns read only padding
DEAD_TAPS = [
    ((2, 24, 4, 4), (8, 24, 3, 3), dict(dilations=(12, 12), pads=(12, 12, 12, 12)),
     (1, 2), (1, 2)),  # DeepLabV3's ASPP over a 4x4 map: the centre tap only
    ((2, 6, 5, 4), (4, 6, 3, 3), dict(dilations=(6, 2), pads=(6, 2, 6, 2)), (1, 2), (0, 3)),
    ((1, 4, 3, 3), (5, 4, 5, 5), dict(pads=(4, 1, 4, 1), strides=(2, 1)), (0, 5), (1, 4)),
    ((2, 8, 4, 4), (8, 1, 3, 3), dict(group=8, dilations=(4, 4), pads=(4, 4, 4, 4)), (1, 2),
     (1, 2)),  # depthwise
]


@pytest.mark.parametrize("activation", ["", "Relu"])
@pytest.mark.parametrize("xshape, wshape, attrs, rows, cols", DEAD_TAPS)
def test_taps_that_read_only_padding_are_left_out_and_the_result_is_torchs(
        xshape, wshape, attrs, rows, cols, activation):
    """A convolution with constant weights from a file, some of whose kernel rows or columns
    read only padding at the planned size, runs as the convolution of the live taps; the
    result is PyTorch's full convolution. Other weights take the generic call."""
    import torch

    x = _x(*xshape).astype(np.float32)
    w = _file_constant(_x(*wshape).astype(np.float32))
    b = _file_constant(_x(wshape[0]).astype(np.float32))
    full = dict(attrs, activation=activation) if activation else attrs
    kernel = conv.fused_conv if activation else conv.conv
    plan = conv._plan(xshape, wshape, 4, None, attrs.get("strides"), attrs["pads"],
                      attrs.get("dilations"), "NOTSET", attrs.get("group", 1))
    assert (conv._live_taps(xshape[2], plan[1][2], wshape[2], plan[2][0], plan[3][0],
                            plan[4][0]),
            conv._live_taps(xshape[3], plan[1][3], wshape[3], plan[2][1], plan[3][1],
                            plan[4][1])) == (rows, cols)
    call = specialize(kernel, _site(kernel, [x, w, b], full, (1, 2)))
    assert call.__name__ == "trimmed_at"
    p = attrs["pads"]
    want = torch.nn.functional.conv2d(
        torch.nn.functional.pad(torch.from_numpy(x), (p[1], p[3], p[0], p[2])),
        torch.from_numpy(w.copy()), torch.from_numpy(b.copy()), stride=attrs.get("strides", 1),
        dilation=attrs.get("dilations", 1), groups=attrs.get("group", 1))
    want = (torch.relu(want) if activation else want).numpy()
    np.testing.assert_allclose(call(x, w, b), want, rtol=1e-5, atol=1e-5)
    other = w.copy()  # the same values in another array: the full convolution
    np.testing.assert_allclose(call(x, other, b), want, rtol=1e-5, atol=1e-5)


def test_weights_that_are_not_finite_or_can_change_keep_every_tap():
    """A zero of the padding times an infinite weight is NaN, which the full convolution
    keeps; weights that can change in place are read per call. Neither is trimmed."""
    xshape, wshape, attrs = DEAD_TAPS[0][:3]
    x = _x(*xshape).astype(np.float32)
    w = _x(*wshape).astype(np.float32)
    w[0, 0, 0, 0] = np.inf  # a corner tap, which reads only padding
    call = specialize(conv.conv, _site(conv.conv, [x, _file_constant(w)], attrs, (1,)))
    assert call.__name__ != "trimmed_at"
    got = call(x, _file_constant(w))  # (the site's constant is another array: generic too)
    assert np.isnan(got[:, 0]).all() and np.isfinite(got[:, 1:]).all()
    writable = _x(*wshape).astype(np.float32)
    call = specialize(conv.conv, _site(conv.conv, [x, writable], attrs, (1,)))
    assert call.__name__ != "trimmed_at"


@pytest.mark.parametrize("kernel,attrs", [(conv.conv, {}),
                                          (conv.fused_conv, dict(activation="Relu"))])
def test_a_planned_small_convolution_fills_a_strided_out_and_refuses_a_wrong_one(kernel, attrs):
    """The one-call small-convolution kernel writes a C-contiguous output without checks: its
    planned call hands a strided out= to the generic call (which fills it through a copy) and
    refuses one of another shape, as the generic call does."""
    x, w = _x(1, 4, 5, 5).astype(np.float32), _x(8, 4, 3, 3).astype(np.float32)
    site = _site(kernel, [x, w], attrs, (1,))
    call = specialize(kernel, site)
    assert call.__qualname__.startswith("_small_site")
    want = site.generic(x, w)
    out = _strided(np.full(want.shape, np.nan, np.float32))
    assert call(x, w, out=out) is out
    _same(out, want)
    with pytest.raises(ShapeError, match="out= has shape"):
        call(x, w, out=np.empty((1, 8, 3, 2), np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("nchw,bias", [((2, 96, 16, 16), True), ((2, 8, 8, 8), True),
                                       ((1, 16, 5, 3), False), ((3, 12, 7), True)])
def test_layer_norm_of_a_permuted_channels_first_view_matches_torch(dtype, nchw, bias):
    """ConvNeXt's LayerNorm over the channels: a (N, H, W, C) view of an (N, C, H, W)
    activation (and a 1-D (N, L, C) one), normalized without copying the view first;
    against torch's layer_norm on the permuted tensor, with and without B, planes whose
    pixels are not a multiple of eight."""
    import torch

    x = RNG.standard_normal(nchw).astype(dtype)
    x[0, 1] += 100.0  # one channel far off: the two-pass variance keeps its precision
    perm = (0, *range(2, x.ndim), 1)
    view = x.transpose(perm)
    assert not view.flags.c_contiguous
    c = nchw[1]
    scale, b = (RNG.standard_normal(c).astype(dtype) for _ in range(2))
    inputs = [view, scale, b] if bias else [view, scale]
    site = _site(norm.layer_normalization, inputs, {}, (1, 2) if bias else (1,))
    site = replace(site, out_shapes=(site.out_shapes[0], None, None))
    y = norm.layer_normalization.specialize(site)(*inputs)[0]
    want = torch.nn.functional.layer_norm(
        torch.from_numpy(np.ascontiguousarray(view)), (c,), torch.from_numpy(scale),
        torch.from_numpy(b) if bias else None, eps=1e-5).numpy()
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    assert y.shape == view.shape and y.flags.c_contiguous
    np.testing.assert_allclose(y, want, **tol)
    np.testing.assert_allclose(y, norm.layer_normalization(np.ascontiguousarray(view),
                                                           *inputs[1:])[0], **tol)
    # the kernel's parallel variant (taken with several threads) computes the same values
    flat = (nchw[0], c, int(np.prod(nchw[2:])))
    outs = []
    for variant in (norm._layer_norm_channels.serial, norm._layer_norm_channels.parallel):
        out = np.full((flat[0], flat[2], c), np.nan, dtype)
        variant(x.reshape(flat), scale, b if bias else scale, bias, 1e-5, out, True)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0].reshape(y.shape), y, **tol)
