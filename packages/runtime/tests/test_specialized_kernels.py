"""Kernels specialized while planning (onemodel.tensors.ops.specialize) give what the generic
kernel gives, bit for bit, and take the generic path when handed other shapes than planned."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from onemodel.runtime import GraphBuilder, Session
from onemodel.tensors import DType, OneModelError, ShapeError, registry
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.specialize import CallSite, specialize

RNG = np.random.default_rng(0)


def _x(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _c(values):
    return np.asarray(values, np.int64)


# (op, inputs (arrays; those wrapped in _c are constants of the graph), attributes)
CASES = [
    ("Reshape", [_x(2, 3, 4), _c([4, -1])], {}),
    ("Reshape", [_x(2, 3, 4), _c([0, 12])], {}),
    ("Flatten", [_x(2, 3, 4)], {"axis": 2}),
    ("Squeeze", [_x(2, 1, 4), _c([1])], {}),
    ("Squeeze", [_x(1, 3, 1)], {}),
    ("Unsqueeze", [_x(3, 4), _c([0, -1])], {}),
    ("Transpose", [_x(2, 3, 4)], {"perm": (2, 0, 1)}),
    ("Transpose", [_x(2, 3, 4)], {}),
    ("Expand", [_x(3, 1), _c([2, 3, 4])], {}),
    ("Expand", [_x(1, 1), _c([100, 100])], {}),
    ("Expand", [_x(3, 4), _c([3, 4])], {}),
    ("Slice", [_x(6, 7), _c([1, -3]), _c([5, 10**18]), _c([0, 1])], {}),
    ("Slice", [_x(6, 7), _c([-1]), _c([-100]), _c([1]), _c([-2])], {}),
    ("Slice", [_x(6, 7), _c([2]), _c([4])], {}),
    ("Gather", [_x(3, 4, 5), _c(1)], {"axis": 1}),
    ("Gather", [_x(3, 4, 5), _c(-1)], {"axis": -1}),
    ("Gather", [_x(3, 4, 5), _c([2, 0])], {"axis": 0}),
    ("MatMul", [_x(2, 3, 4), _x(4, 5)], {}),
    ("MatMul", [_x(3, 4, dtype=np.int64), _x(4, 2, dtype=np.int64)], {}),
    ("MatMul", [_x(2, 2, 3, 4, dtype=np.float64), _x(4, 5, dtype=np.float64)], {}),
    ("MatMul", [_x(3, 4), _x(4, 5)], {}),
    ("MatMul", [_x(2, 3, 4), _x(2, 4, 5)], {}),
    ("Gemm", [_x(3, 4), _x(5, 4), _x(5)], {"transB": 1}),
    ("Gemm", [_x(4, 3), _x(4, 5), _x(3, 5)], {"transA": 1, "alpha": 0.5, "beta": 2.0}),
    ("Gemm", [_x(3, 4, dtype=np.float64), _x(4, 5, dtype=np.float64)], {}),
    ("FusedGemm", [_x(3, 4), _x(4, 5), _x(5)], {"activation": "Relu"}),
    ("FusedGemm", [_x(3, 4), _x(5, 4), _x(1, 5)], {"activation": "Sigmoid", "transB": 1}),
    ("FusedGemm", [_x(3, 4), _x(4, 5)], {"activation": "Tanh", "alpha": 2.0}),
    ("ReduceMean", [_x(2, 5, 32), _c([-1])], {"keepdims": 1}),
    ("ReduceMean", [_x(2, 5, 32), _c([0, 2])], {"keepdims": 0}),
    ("ReduceMean", [_x(2, 5, 32, dtype=np.float64)], {"keepdims": 1}),
    ("ReduceMean", [_x(4, 6)], {"keepdims": 0}),  # a 0-d result: the generic kernel
    ("Pad", [_x(2, 3, 4, 5), _c([0, 0, 1, 2, 0, 0, 3, 1])], {}),
    ("Pad", [_x(1, 8, 8, 16), _c([0, 0, 0, 0, 0, 1, 1, 0])], {"mode": "constant"}),
    ("Pad", [_x(2, 5, 6, dtype=np.int64) * 9, _c([1, 0, 2, 3]), _c(-5), _c([2, -2])], {}),
    ("Pad", [_x(3, 4, dtype=np.int64), _c([2, 2, 2, 2]), _c(7)], {}),
    ("Pad", [_x(0, 3), _c([1, 1, 1, 1])], {}),  # an empty input: only the value
    ("Pad", [_x(4, 6), _c([-1, 2, 1, -2])], {}),  # a crop: the generic kernel
    ("Pad", [_x(4, 6), _c([1, 2, 1, 2])], {"mode": "reflect"}),
    ("Pad", [_x(2, 3, 5, 6), _c([0, 0, 3, 1, 0, 0, 1, 3])], {"mode": "reflect"}),
    ("Pad", [_x(2, 3, 5, 6), _c([0, 1, 2, 0, 1, 0, 0, 2])], {"mode": "edge"}),
    ("Pad", [_x(3, 4), _c([5, 2, 0, 7])], {"mode": "wrap"}),  # pads past the axis: wrap again
    ("Pad", [_x(2, 5, dtype=np.int64), _c([0, 6, 0, 9])], {"mode": "reflect"}),  # past it too
    ("Pad", [_x(1, 2), _c([0, 1, 0, 1])], {"mode": "reflect"}),  # a size-1 axis
    ("Pad", [_x(1, 40), _c([0, 33, 0, 33])], {"mode": "edge"}),  # 66 slabs: the generic kernel
    ("Pad", [_x(4, 6), _c([1, 2, 1, 2]), _x(1)], {}),  # a value fed at run time: generic
]


def _is_const(op, i, value) -> bool:
    """The integer inputs after the first (targets, axes, bounds, indices) are constants."""
    return op not in ("MatMul", "Gemm", "FusedGemm") and i > 0 and value.dtype == np.int64


def _session(op, inputs, attrs):
    b = GraphBuilder()
    names, feeds = [], {}
    for i, value in enumerate(inputs):
        if _is_const(op, i, value):
            names.append(b.const(value))
        else:
            name = f"in{i}"
            names.append(b.input(name, DType.from_numpy(value.dtype), value.shape))
            feeds[name] = value
    b.output(b.op(op, *names, **attrs), "y")
    return Session(b.build(), optimize=False), feeds


@pytest.mark.parametrize("op,inputs,attrs", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_specialized_equals_generic(op, inputs, attrs):
    """The planned call gives what the generic call of the kernel the registry chooses gives
    (a plugin's, where one is installed and covers the call: the numba ReduceMean sums in
    float64, so it is its own generic call that the plan must match bit for bit)."""
    session, feeds = _session(op, inputs, attrs)
    kernel = registry.choose_kernel_record(op, "cpu", inputs, attrs).function()
    want = np.asarray(kernel(*inputs, **attrs))
    np.testing.assert_allclose(want, OPS[op].kernel(*inputs, **attrs), rtol=1e-6, atol=1e-7)
    for _ in range(2):  # the first run and a steady one (planned buffers in place)
        got = session.run(feeds)["y"].numpy()
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def _site(op, inputs, attrs):
    """The call site the planner would describe for ``inputs`` (every input's value given)."""
    out = np.asarray(OPS[op].kernel(*inputs, **attrs))
    return CallSite(tuple(a.shape for a in inputs), tuple(a.dtype for a in inputs),
                    tuple(a if _is_const(op, i, a) else None for i, a in enumerate(inputs)),
                    dict(attrs), (out.shape,), partial(OPS[op].kernel, **attrs))


@pytest.mark.parametrize("op,inputs,attrs", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_other_shapes_take_the_generic_path(op, inputs, attrs):
    call = specialize(OPS[op].kernel, _site(op, inputs, attrs))
    if call is None:
        pytest.skip("declined: the generic kernel runs")
    np.testing.assert_array_equal(call(*inputs), OPS[op].kernel(*inputs, **attrs))
    # the first input one longer on its first axis (still valid for the op's other inputs)
    grown = [np.concatenate([inputs[0], inputs[0][:1]])] + inputs[1:]
    try:
        want = OPS[op].kernel(*grown, **attrs)
    except Exception:  # the op refuses the grown shape: so must the call
        with pytest.raises(Exception):  # noqa: B017
            call(*grown)
        return
    np.testing.assert_array_equal(call(*grown), want)


def test_plans_use_the_specialized_calls():
    session, feeds = _session("Slice", CASES[11][1], {})
    session.run(feeds)
    steps = next(iter(session._plans.values())).steps
    assert [s.call.__qualname__.split(".")[0] for s in steps if s.op == "Slice"] == ["_slice_at"]


def test_gather_out_of_range_still_fails_naming_the_node():
    session, feeds = _session("Gather", [_x(3, 4), _c(7)], {"axis": 1})
    with pytest.raises(OneModelError, match="Gather"):
        session.run(feeds)


@pytest.mark.parametrize("op,attrs", [("MatMul", {}), ("Gemm", {}), ("FusedGemm", {}),
                                      ("Gemm", {"transB": 1})])
@pytest.mark.parametrize("rows", [1, 2, 3, 5])
def test_a_few_rows_by_a_large_weight(op, attrs, rows):
    """2-3 rows by a weight of 1 MiB or more run as one matrix-vector product per row (see
    linalg._rowwise): the products agree with float64 ones, row order and all."""
    k, n = 576, 512  # 1.1 MiB of float32
    a, w, bias = _x(rows, k), _x(n, k) if attrs.get("transB") else _x(k, n), _x(n)
    inputs = [a, w] if op == "MatMul" else [a, w, bias]
    session, feeds = _session(op, inputs, attrs)
    got = session.run(feeds)["y"].numpy()
    w64 = w.astype(np.float64).T if attrs.get("transB") else w.astype(np.float64)
    want = a.astype(np.float64) @ w64 + (0 if op == "MatMul" else bias)
    if op == "FusedGemm":
        want = np.maximum(want, 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert got.flags.c_contiguous and got.dtype == np.float32


def test_a_repeated_reduction_axis_fails_as_in_the_generic_kernel():
    session, feeds = _session("ReduceMean", [_x(4, 6), _c([1, -1])], {"keepdims": 1})
    with pytest.raises(OneModelError, match="ReduceMean"):
        session.run(feeds)


def test_a_specializer_that_raises_names_the_node(monkeypatch):
    def broken(site):
        raise ValueError("a bug in a plugin's specializer")

    monkeypatch.setattr(OPS["Transpose"].kernel, "specialize", broken)
    session, feeds = _session("Transpose", [_x(2, 3)], {})
    with pytest.raises(OneModelError, match="Transpose.*specializing kernel.*a bug"):
        session.run(feeds)


@pytest.mark.parametrize("a_shape,b_shape", [((2, 3, 4), (4, 5)), ((2, 576), (576, 512)),
                                             ((3, 576), (576, 512))])
def test_an_out_the_products_cannot_write_goes_to_the_generic_kernel(a_shape, b_shape):
    """The planned products write 2-D views of a C-contiguous ``out`` of the planned shape and
    dtype. Any other ``out`` goes to the generic kernel, which fills a strided or wider one
    (never a copy left unwritten) and refuses one of another shape with a ShapeError naming the
    shapes (numpy's own error before)."""
    a, b = _x(*a_shape), _x(*b_shape)
    call = specialize(OPS["MatMul"].kernel, _site("MatMul", [a, b], {}))
    want = OPS["MatMul"].kernel(a, b)
    out = np.full(want.shape[::-1], np.nan, np.float32).T  # the right shape, transposed strides
    assert call(a, b, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    wide = np.full(want.shape, np.nan, np.float64)
    assert call(a, b, out=wide) is wide
    np.testing.assert_allclose(wide, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError, match="MatMul: out= of shape"):
        call(a, b, out=np.empty(want.shape[:-1] + (want.shape[-1] + 1,), np.float32))


@pytest.mark.parametrize("a_shape,b_shape", [((2, 3, 4), (4, 5)), ((3, 4), (4, 5))])
def test_an_out_made_read_only_after_use_is_refused(a_shape, b_shape):
    """The planned product keeps a 2-D view of the out= it was last given (a plan hands the
    same buffer each run); that array made read-only since is refused as the generic kernel
    refuses it, not written through the kept view."""
    a, b = _x(*a_shape), _x(*b_shape)
    call = specialize(OPS["MatMul"].kernel, _site("MatMul", [a, b], {}))
    want = a @ b
    out = np.zeros(want.shape, np.float32)
    assert call(a, b, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    out[...] = 0
    out.flags.writeable = False
    with pytest.raises(ShapeError, match="read-only"):
        call(a, b, out=out)
    assert not out.any()


@pytest.mark.parametrize("shape,sizes,attrs", [
    ((2, 5, 12), [4, 4, 4], {"axis": -1}),
    ((6, 7), [1, 5], {"axis": 0}),
    ((3, 8), None, {"axis": 1, "num_outputs": 3}),  # parts of 3, 3 and 2
])
def test_split_parts_are_the_generic_views(shape, sizes, attrs):
    x = _x(*shape)
    inputs = [x] if sizes is None else [x, _c(sizes)]
    generic = partial(OPS["Split"].kernel, **attrs)
    want = generic(*inputs)
    site = CallSite(tuple(a.shape for a in inputs), tuple(a.dtype for a in inputs),
                    (None,) + tuple(inputs[1:]), dict(attrs), tuple(w.shape for w in want),
                    generic)
    call = specialize(OPS["Split"].kernel, site)
    assert call is not None
    got = call(*inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
        assert np.shares_memory(g, x)  # views, as the generic kernel's
    grown = np.concatenate([x, x[:1]])  # another shape: the generic call
    for g, w in zip(call(grown, *inputs[1:]), generic(grown, *inputs[1:])):
        np.testing.assert_array_equal(g, w)


def test_a_product_writes_whichever_out_it_is_given():
    """The specialized product keeps the 2-D view of the last out= it was given (a plan hands
    the same buffer each run); runs of two buffer sets alternate, and each result still lands
    in the buffer of its own call, never in the other's."""
    a, b = _x(2, 5, 8), _x(8, 3)
    want = OPS["MatMul"].kernel(a, b)
    call = specialize(OPS["MatMul"].kernel, _site("MatMul", [a, b], {}))
    first, second = np.full(want.shape, np.nan, want.dtype), np.full(want.shape, np.nan, want.dtype)
    for out in (first, second, first, second):
        out[...] = np.nan
        assert call(a, b, out=out) is out
        np.testing.assert_array_equal(out, want)
    strided = np.empty((2, 3, 5), want.dtype).transpose(0, 2, 1)  # filled by the generic kernel
    assert call(a, b, out=strided) is strided
    np.testing.assert_array_equal(strided, want)


def test_a_pad_of_a_0d_input_is_left_to_the_generic_kernel():
    """Nothing to pad: the generic kernel's own answer (an error for its empty pads)."""
    x = np.array(2.0, np.float32)
    site = CallSite(((), (0,)), (x.dtype, np.dtype(np.int64)), (None, np.zeros(0, np.int64)),
                    {}, ((),), partial(OPS["Pad"].kernel))
    assert specialize(OPS["Pad"].kernel, site) is None
