"""The plan compiled to straight-line code (codegen.py) does what the step loop does: the same
results (checked against numpy and against the profiled run, which keeps the loop), values
freed after their last reader, planned buffers filled in place, and errors that name the node
even when the node's name is text that would be code if pasted into a program."""

from __future__ import annotations

import dataclasses
import gc
import weakref
from operator import itemgetter

import numpy as np
import pytest

from onemodel.runtime import ExecutionError, GraphBuilder, Session
from onemodel.runtime.codegen import compile_steps
from onemodel.runtime.planner import Step
from onemodel.runtime.profiling import Profiler
from onemodel.tensors import DType

RNG = np.random.default_rng(3)


def _graph():
    """Split (several outputs), TopK with its indices unused, constants, a Concat of views."""
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("n", 6))
    weight = RNG.standard_normal((3, 3)).astype(np.float32)
    w = b.initializer("w", weight)
    left, right = b.op("Split", x, axis=1, num_outputs=2, outputs=2)
    mixed = b.op("Relu", b.op("Add", b.op("MatMul", left, w), right))
    k = b.initializer("k", np.array([2], np.int64))
    top, _ = b.op("TopK", mixed, k, axis=1, outputs=2)
    b.output(b.op("Concat", top, b.op("Neg", left), axis=1), "y")
    b.output(mixed, "mixed")
    return b.build(), weight


def _expected(x, w):
    mixed = np.maximum(x[:, :3] @ w + x[:, 3:], 0)
    top = -np.sort(-mixed, axis=1)[:, :2]
    return np.concatenate([top, -x[:, :3]], axis=1), mixed


@pytest.mark.parametrize("optimize", [True, False], ids=["optimized", "plain"])
@pytest.mark.parametrize("buffers", [True, False], ids=["buffers", "no-buffers"])
def test_compiled_runs_match_numpy_and_the_step_loop(optimize, buffers):
    graph, w = _graph()
    s = Session(graph, optimize=optimize, planned_buffers=buffers)
    for n in (4, 1, 4):  # a second shape, then the first plan again
        x = RNG.standard_normal((n, 6)).astype(np.float32)
        got = s.run({"x": x}, return_numpy=True)
        y, mixed = _expected(x, w)
        np.testing.assert_allclose(got["y"], y, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["mixed"], mixed, rtol=1e-5, atol=1e-6)
        plan = s.plan_for({"x": (n, 6)})
        looped = plan.execute_profiled([x], Profiler())
        for a, b_ in zip(plan.execute([x]), looped):
            np.testing.assert_array_equal(a, b_)


def _step(call, ins, outs, release=(), multi=False, buf=-1, label="node s"):
    return Step(call, itemgetter(*ins), len(ins) == 1, multi, tuple(outs), tuple(release), label,
                tuple(ins), buf=buf)


def test_a_value_is_freed_after_its_last_reader():
    seen = {}

    def make(x):
        a = x + 1.0
        seen["a"] = weakref.ref(a)
        return a

    def alive_check(y):
        gc.collect()
        return np.array(seen["a"]() is not None)

    steps = [_step(make, [2], [3]), _step(lambda a: a * 2.0, [3], [4], release=[3]),
             _step(alive_check, [4], [5])]
    code = compile_steps(steps, [2], [4, 5], [None] * 6)
    doubled, alive = code.run([np.ones(3)], ())
    np.testing.assert_array_equal(doubled, np.full(3, 4.0))
    assert not alive  # slot 3 was let go before the third step ran


def test_steps_that_write_a_feed_or_constant_slot_start_from_its_value():
    template = [None, None, None, np.array(10.0), None]
    steps = [_step(lambda x, k: x + k, [2, 3], [4]),
             _step(lambda y, k: (y * k, y), [4, 3], [3, 2], multi=True),
             _step(lambda k, x: k - x, [3, 2], [4])]
    code = compile_steps(steps, [2], [4, 3, 2], template)
    got = code.run([np.array(1.0)], ())
    assert [float(v) for v in got] == [110.0 - 11.0, 110.0, 11.0]
    assert float(template[3]) == 10.0  # the plan's constant itself is untouched


def test_buffers_are_written_in_place_and_a_kernel_that_returns_another_array_is_copied_in():
    buf = np.empty(3)

    def writes(x, out=None):
        np.add(x, 1.0, out=out)
        return out

    def breaks_contract(x, out=None):
        return x * 3.0

    for kernel in (writes, breaks_contract):
        code = compile_steps([_step(kernel, [2], [3], buf=0)], [2], [3], [None] * 4)
        (got,) = code.run([np.arange(3.0)], (buf,))
        assert got is buf
        np.testing.assert_array_equal(buf, kernel(np.arange(3.0), out=np.empty(3)))


def test_the_failing_step_and_its_inputs_are_found_from_the_traceback():
    def fails(a, b):
        raise ValueError("boom")

    steps = [_step(lambda x: x + 1, [2], [3]), _step(fails, [3, 2], [4])]
    code = compile_steps(steps, [2], [4], [None] * 5)
    with pytest.raises(ValueError) as info:
        code.run([np.zeros(2)], ())
    index, values = code.failed_step(info.value.__traceback__)
    assert index == 1
    np.testing.assert_array_equal(values[3], np.ones(2))
    np.testing.assert_array_equal(values[2], np.zeros(2))


@pytest.mark.parametrize("name", ['x"); import os; os.remove("f") #', "a\nb", "k0", "v3 = None"])
def test_node_names_never_become_code(name):
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("n",))
    i = b.input("i", DType.I64, ("k",))
    b.output(b.op("Gather", b.op("Relu", x, name=name), i, axis=0, name=name + "!"), "y")
    s = Session(b.build())
    got = s.run({"x": np.array([-1.0, 2.0], np.float32), "i": np.array([1, 0])}, return_numpy=True)
    np.testing.assert_array_equal(got["y"], [2.0, 0.0])
    with pytest.raises(ExecutionError, match="Gather"):
        s.run({"x": np.zeros(2, np.float32), "i": np.array([5])})


def test_a_kernel_replaced_after_a_run_is_used_by_the_next_run():
    b = GraphBuilder()
    x = b.input("x", DType.F32, (3,))
    b.output(b.op("Neg", x), "y")
    s = Session(b.build(), optimize=False)
    x = np.arange(3, dtype=np.float32)
    plan = s.plan_for({"x": (3,)})
    np.testing.assert_array_equal(s.run({"x": x}, return_numpy=True)["y"], -x)
    (step,) = [st for st in plan.steps if st.op == "Neg"]
    step.call = lambda a, out=None: np.multiply(a, 2.0, out=out)  # as a profiler wraps one
    np.testing.assert_array_equal(s.run({"x": x}, return_numpy=True)["y"], 2 * x)
    tripled = lambda a, out=None: np.multiply(a, 3.0, out=out)
    plan.steps = [dataclasses.replace(st, call=tripled) if st is step else st
                  for st in plan.steps]  # a plan given new steps compiles them too
    np.testing.assert_array_equal(s.run({"x": x}, return_numpy=True)["y"], 3 * x)


def test_a_declared_method_call_is_written_in_with_its_shape_guard():
    calls = []

    def reshape_kernel(data):
        calls.append(data.shape)
        return data.reshape(3, 2)
    reshape_kernel.as_method = ("reshape", (3, 2), (2, 3))

    code = compile_steps([_step(reshape_kernel, [2], [3])], [2], [3], [None] * 4)
    (got,) = code.run([np.arange(6.0).reshape(2, 3)], ())
    np.testing.assert_array_equal(got, np.arange(6.0).reshape(3, 2))
    assert calls == []  # the method ran in the plan's own code
    (got,) = code.run([np.arange(6.0)], ())  # another input shape: the kernel itself
    np.testing.assert_array_equal(got, np.arange(6.0).reshape(3, 2))
    assert calls == [(6,)]


def test_a_method_name_that_is_not_a_name_is_never_written_in():
    def kernel(data):
        return data.T
    kernel.as_method = ("T; import os", (), None)
    code = compile_steps([_step(kernel, [2], [3])], [2], [3], [None] * 4)
    (got,) = code.run([np.ones((2, 3))], ())
    assert got.shape == (3, 2)


def test_reshape_and_transpose_steps_run_as_array_methods():
    b = GraphBuilder()
    x = b.input("x", DType.F32, (2, 3, 4))
    t = b.op("Transpose", x, perm=(0, 2, 1))
    b.output(b.op("Reshape", t, b.const(np.array([4, -1], np.int64))), "y")
    s = Session(b.build(), optimize=False)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(s.run({"x": x}, return_numpy=True)["y"],
                                  x.transpose(0, 2, 1).reshape(4, -1))
    plan = s.plan_for({"x": (2, 3, 4)})
    assert {st.op for st in plan.steps if hasattr(st.call, "as_method")} == {"Transpose", "Reshape"}


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "helper"])
def test_a_new_outputs_step_that_returns_a_view_gets_a_copy(compiled):
    """An op declared ``new_outputs`` promises arrays of their own (the buffer plan keeps its
    outputs out of its inputs' groups); a kernel that returns a view of its input anyway
    has that output copied, in the compiled code and in the profiled loop alike."""
    from onemodel.runtime.buffers import new_arrays

    def both(x):
        return x[::1], x + 1.0  # a view, and a new array

    step = dataclasses.replace(_step(both, [2], [3, 4], multi=True), new_outputs=True)
    x = np.arange(3.0)
    if compiled:
        view, new = compile_steps([step], [2], [3, 4], [None] * 5).run([x], ())
    else:
        view, new = new_arrays(step.call(x), True)
    assert not np.shares_memory(view, x)
    np.testing.assert_array_equal(view, x)
    np.testing.assert_array_equal(new, x + 1.0)
    single = dataclasses.replace(_step(lambda a: a[1:], [2], [3]), new_outputs=True)
    (tail,) = compile_steps([single], [2], [3], [None] * 4).run([x], ())
    assert not np.shares_memory(tail, x) and list(tail) == [1.0, 2.0]
