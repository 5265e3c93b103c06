"""A compiled plan calls a specialized call's kernel directly (``direct``, see
onemodel/tensors/ops/specialize.py) only where it proves what the call would check: inputs
that are planned buffers of earlier steps (their shape and dtype), constants, and its own
output buffer. Anything else (a feed, an unbuffered value, a step without a buffer) keeps
the call, and the plan asks again under another thread setting."""

from __future__ import annotations

import dataclasses
from operator import itemgetter

import numpy as np
import pytest

from onemodel.runtime import GraphBuilder, Session
from onemodel.runtime.codegen import compile_steps
from onemodel.runtime.planner import Step
from onemodel.tensors import DType, threads
from onemodel.tensors.ops.specialize import (
    Constant,
    Direct,
    Input,
    Output,
    Planned,
    constant,
    planned,
)

F64 = np.dtype(np.float64)


def _step(call, ins, outs, buf=-1):
    return Step(call, itemgetter(*ins), len(ins) == 1, False, tuple(outs), (), "node s",
                tuple(ins), buf=buf)


def _scaled(k, asked):
    """A call ``x * k * 2`` into ``out`` that offers its kernel where x is a planned (2, 3)
    float64 buffer and k is ``k`` itself; ``asked`` records each offer's facts, the call
    itself appends "call" when it runs."""

    def run(x, kk, out, scale):  # the "machine code": flat arrays, as a kernel may take them
        assert x.shape == (6,) and out.shape == (6,)
        np.multiply(x, np.tile(kk, 2) * scale, out=out)

    def call(x, kk, out=None):
        asked.append("call")
        out = np.empty(x.shape) if out is None else out
        np.multiply(x, kk * 2.0, out=out)
        return out

    def direct(known, out):
        asked.append((known, out))
        if planned(known[0], (2, 3), F64) and constant(known[1], k) and \
                planned(out, (2, 3), F64):
            return Direct(run, (Input(0, (6,)), Input(1), Output((6,)), 2.0))
        return None
    call.direct = direct
    return call


def _plus_one(x, out=None):
    return np.add(x, 1.0, out=out)


def test_a_proven_call_runs_its_kernel_with_the_plans_arrays():
    k = np.array([1.0, 2.0, 3.0])
    asked = []
    template = [None, None, None, None, k, None]
    steps = [_step(_plus_one, [2], [3], buf=0), _step(_scaled(k, asked), [3, 4], [5], buf=1)]
    code = compile_steps(steps, [2], [5], template, [((2, 3), F64), ((2, 3), F64)])
    assert asked == [((Planned((2, 3), F64), Constant(k)), Planned((2, 3), F64))]
    views = [np.empty((2, 3)), np.empty((2, 3))]
    x = np.arange(6.0).reshape(2, 3)
    (got,) = code.run([x], views)
    assert got is views[1]
    np.testing.assert_array_equal(got, (x + 1.0) * k * 2.0)
    assert "call" not in asked  # the kernel ran without the call


@pytest.mark.parametrize("case", ["feed", "unbuffered input", "no buffer", "other shape",
                                  "other constant"])
def test_the_call_is_kept_where_the_plan_cannot_prove_its_checks(case):
    k = np.array([1.0, 2.0, 3.0])
    asked = []
    call = _scaled(np.array([1.0, 2.0, 3.0]) if case == "other constant" else k, asked)
    template = [None, None, None, None, k, None]
    first = _step(_plus_one, [2], [3], buf=-1 if case == "unbuffered input" else 0)
    second = _step(call, [2 if case == "feed" else 3, 4], [5],
                   buf=-1 if case == "no buffer" else 1)
    planned_ = [((2, 3), F64), ((3, 2) if case == "other shape" else (2, 3), F64)]
    code = compile_steps([first, second], [2], [5], template, planned_)
    views = [np.empty((2, 3)), np.empty(planned_[1][0])]
    x = np.arange(6.0).reshape(2, 3)
    if case == "other shape":  # (the call itself would refuse the buffer: ask, then stop)
        assert asked and asked[0][1] == Planned((3, 2), F64)
        return
    (got,) = code.run([x], views)
    source = x if case == "feed" else x + 1.0
    np.testing.assert_array_equal(got, source * k * 2.0)
    assert "call" in asked
    facts = [a for a in asked if a != "call"]
    if case == "no buffer":
        assert facts == []  # a step with no buffer is never offered
    elif case in ("feed", "unbuffered input"):
        assert facts[0][0][0] is None  # nothing is known of that input


def test_no_planned_buffers_means_no_direct_calls():
    k = np.array([1.0, 2.0, 3.0])
    asked = []
    steps = [_step(_plus_one, [2], [3], buf=0), _step(_scaled(k, asked), [3, 4], [5], buf=1)]
    code = compile_steps(steps, [2], [5], [None, None, None, None, k, None])  # no shapes
    (got,) = code.run([np.zeros((2, 3))], [np.empty((2, 3)), np.empty((2, 3))])
    np.testing.assert_array_equal(got, k * 2.0 * np.ones((2, 3)))
    assert asked == ["call"]


@pytest.fixture
def one_thread():
    saved = threads.num_threads()
    threads.set_num_threads(1)
    yield
    threads.set_num_threads(saved)


def test_a_plan_asks_again_under_another_thread_count_and_keeps_each(one_thread):
    b = GraphBuilder()
    x = b.input("x", DType.F32, (2, 3))
    weight = np.arange(9, dtype=np.float32).reshape(3, 3) / 8
    w = b.initializer("w", weight)
    inner = b.op("MatMul", b.op("MatMul", x, w), w)  # reads one buffer, writes another
    b.output(b.op("MatMul", b.op("Relu", inner), w), "y")
    s = Session(b.build(), optimize=False)
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    s.run({"x": x})
    plan = s.plan_for({"x": (2, 3)})
    (step,) = [st for st in plan.steps if st.op == "MatMul" and st.buf == 1]
    asked = []

    def matmul_call(a, b_, out=None):
        return np.matmul(a, b_, out=out)

    def direct(known, out):
        asked.append(threads.num_threads())
        return Direct(lambda a, b_, o: np.matmul(a, b_, out=o), (Input(0), Input(1), Output()))
    matmul_call.direct = direct
    step.call = matmul_call  # a step edit: the next run compiles again
    want = np.maximum(x @ weight @ weight, 0) @ weight
    np.testing.assert_allclose(s.run({"x": x}, return_numpy=True)["y"], want, rtol=1e-6)
    assert asked == [1]
    threads.set_num_threads(2)
    np.testing.assert_allclose(s.run({"x": x}, return_numpy=True)["y"], want, rtol=1e-6)
    threads.set_num_threads(1)
    np.testing.assert_allclose(s.run({"x": x}, return_numpy=True)["y"], want, rtol=1e-6)
    assert asked == [1, 2]  # one thread's code was kept, not compiled again


def test_several_kernels_offered_run_in_order_on_the_buffer():
    """A product, then its epilogue over the output: ``direct`` may offer a tuple."""
    def call(x, out=None):
        return np.multiply(np.add(x, 1.0, out=out), 3.0, out=out)

    def direct(known, out):
        return (Direct(lambda x, o: np.add(x, 1.0, out=o), (Input(0), Output())),
                Direct(lambda o, s: np.multiply(o, s, out=o), (Output((6,)), 3.0)))
    call.direct = direct
    steps = [_step(_plus_one, [2], [3], buf=0), _step(call, [3], [4], buf=1)]
    code = compile_steps(steps, [2], [4], [None] * 5, [((2, 3), F64), ((2, 3), F64)])
    assert "d1_1" in code.run.__globals__
    x = np.arange(6.0).reshape(2, 3)
    (got,) = code.run([x], [np.empty((2, 3)), np.empty((2, 3))])
    np.testing.assert_array_equal(got, (x + 2.0) * 3.0)


def test_a_declared_reshape_of_a_planned_buffer_is_planned_at_its_new_shape():
    def reshape_kernel(data):
        return data.reshape(3, 2)
    reshape_kernel.as_method = ("reshape", (3, 2), (2, 3))
    asked = []

    def call(x, out=None):
        return np.negative(x, out=out)

    def direct(known, out):
        asked.append(known)
        return Direct(np.negative, (Input(0), Output()))
    call.direct = direct
    steps = [_step(_plus_one, [2], [3], buf=0), _step(reshape_kernel, [3], [4]),
             _step(call, [4], [5], buf=1)]
    code = compile_steps(steps, [2], [5], [None] * 6, [((2, 3), F64), ((3, 2), F64)])
    assert asked == [(Planned((3, 2), F64),)]
    x = np.arange(6.0).reshape(2, 3)
    (got,) = code.run([x], [np.empty((2, 3)), np.empty((3, 2))])
    np.testing.assert_array_equal(got, -(x + 1.0).reshape(3, 2))
    # a transpose's view is not contiguous: nothing is known of it
    transpose_kernel = lambda data: data.T
    transpose_kernel.as_method = ("transpose", None, None)
    asked.clear()
    steps[1] = _step(transpose_kernel, [3], [4])
    compile_steps(steps, [2], [5], [None] * 6, [((2, 3), F64), ((3, 2), F64)])
    assert asked == [(None,)]


def _negating(asked):
    """A call of -x (a tuple with unnamed statistics when ``multi``) that offers np.negative."""
    def call(x, out=None):
        asked.append("call")
        return np.negative(x, out=out), None

    def direct(known, out):
        asked.append((known, out))
        return Direct(np.negative, (Input(0), Output()))
    call.direct = direct
    return call


def test_a_step_without_a_buffer_gets_a_new_array_and_proves_it_to_the_next():
    asked, later = [], []
    first = dataclasses.replace(_step(_negating(asked), [2], [3, 1]), multi=True,
                                out_specs=(((2, 3), F64), None))  # its second output unnamed
    second = dataclasses.replace(_step(_negating(later), [3], [4, 1]), multi=True,
                                 out_specs=(((2, 3), F64), None))
    code = compile_steps([first, second], [2], [3, 4], [None] * 5, [])
    assert asked == [((None,), Planned((2, 3), F64))]  # a feed: nothing known
    assert later == [((Planned((2, 3), F64),), Planned((2, 3), F64))]  # a new array: known
    x = np.arange(6.0).reshape(2, 3)
    a, b = code.run([x], [])
    np.testing.assert_array_equal(a, -x)
    np.testing.assert_array_equal(b, x)
    assert a.base is None and b.base is None and not np.shares_memory(a, x)
    c, _ = code.run([x], [])
    assert c is not a  # a new array at each run, as the call makes


def test_an_op_whose_other_outputs_are_named_keeps_its_call():
    asked = []
    step = dataclasses.replace(_step(_negating(asked), [2], [3, 4]), multi=True,
                               out_specs=(((2, 3), F64), None))
    code = compile_steps([step], [2], [3, 4], [None] * 5, [])
    x = np.arange(6.0).reshape(2, 3)
    y, stats = code.run([x], [])
    np.testing.assert_array_equal(y, -x)
    assert stats is None and asked[-1] == "call"  # the kernels offered do not write output 1


def test_kernels_may_write_an_op_s_other_named_output_into_a_new_array():
    def call(x, out=None):
        return np.negative(x), x * 2.0

    def direct(known, out):
        return (Direct(np.negative, (Input(0), Output())),
                Direct(np.multiply, (Input(0), 2.0, Output(index=1))))
    call.direct = direct
    spec = ((2, 3), F64)
    step = dataclasses.replace(_step(call, [2], [3, 4]), multi=True, out_specs=(spec, spec))
    code = compile_steps([step], [2], [3, 4], [None] * 5, [])
    assert "d0_1" in code.run.__globals__
    x = np.arange(6.0).reshape(2, 3)
    y, doubled = code.run([x], [])
    np.testing.assert_array_equal(y, -x)
    np.testing.assert_array_equal(doubled, 2 * x)
    # of another shape than the first output: the plan has no array for it, the call runs
    other = dataclasses.replace(step, out_specs=(spec, ((3, 2), F64)))
    code = compile_steps([other], [2], [3, 4], [None] * 5, [])
    assert "d0_1" not in code.run.__globals__
    y, doubled = code.run([x], [])
    np.testing.assert_array_equal(doubled, 2 * x)


def test_a_direct_form_that_fails_names_the_node():
    from onemodel.tensors import OneModelError

    def call(x, out=None):
        return np.negative(x, out=out)

    def direct(known, out):
        raise KeyError("a plugin's bug")
    call.direct = direct
    steps = [_step(_plus_one, [2], [3], buf=0), _step(call, [3], [4], buf=1)]
    with pytest.raises(OneModelError, match="node s: the direct form of its kernel failed"):
        compile_steps(steps, [2], [4], [None] * 5, [((2, 3), F64), ((2, 3), F64)])
