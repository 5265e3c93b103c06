"""Planned output buffers (onemodel.runtime.buffers): kernels registered with ``writes_out`` get
``out=`` buffers that the plan reuses from run to run. The oracle is numpy on the same inputs;
the test plugin's kernels record the memory of every ``out`` they are given, so "no new buffers
after the first run" is checked on what the kernels really received."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from onemodel.runtime import GraphBuilder, Session
from onemodel.runtime.buffers import BufferSet
from onemodel.runtime.planner import ExecutionError
from onemodel.tensors import DType
from onemodel.tensors.registry import hookimpl

GIVEN: list[int] = []  # the data address of every out= a test kernel received
_lock = threading.Lock()
SLOW = threading.Event()  # set: the kernels sleep a little, so threads overlap


def _note(out):
    if out is not None:
        with _lock:
            GIVEN.append(out.__array_interface__["data"][0])
    if SLOW.is_set():
        time.sleep(0.0005)


def relu(x, *, out=None):
    _note(out)
    return np.maximum(x, 0, out=out)


def add(a, b, *, out=None):
    _note(out)
    return np.add(a, b, out=out)


def tanh(x, *, out=None):
    """Raises on a marked input (x[0, 0] == 123), to fail a run midway."""
    _note(out)
    if x.flat[0] == 123:
        raise ValueError("marked input")
    return np.tanh(x, out=out)


def sigmoid(x, *, out=None):
    """Breaks the out= contract on purpose: ignores ``out`` and returns a new array."""
    _note(out)
    return 1 / (1 + np.exp(-x))


def neg(x, *, out=None):
    """Breaks the contract worse: returns one row, which numpy would broadcast into ``out``."""
    _note(out)
    return -x[:1]


def same_shapes(*arrays, **attrs):
    return len({a.shape for a in arrays}) == 1


class Plugin:
    @hookimpl
    def onemodel_register_kernels(self, register):
        for op, fn in (("Relu", "relu"), ("Add", "add"), ("Tanh", "tanh"),
                       ("Sigmoid", "sigmoid"), ("Neg", "neg")):
            register(op, f"{__name__}:{fn}", dtypes=["F32"], priority=10, writes_out=True,
                     supports=f"{__name__}:same_shapes")


@pytest.fixture
def plugin(isolated_registry):
    isolated_registry.register_plugin(Plugin(), "buffers-test")
    GIVEN.clear()
    SLOW.clear()
    yield
    SLOW.clear()


def _relu(x):
    return np.maximum(x, 0)


def _chain(n=6, shape=(16, 16)):
    """x -> Relu -> Tanh -> Relu -> ... (n steps, each writing out=) -> y."""
    b = GraphBuilder()
    v = b.input("x", DType.F32, shape)
    for i in range(n):
        v = b.op("Relu" if i % 2 == 0 else "Tanh", v)
    b.output(v)
    return b.build(), v


def _want_chain(x, n=6):
    for i in range(n):
        x = _relu(x) if i % 2 == 0 else np.tanh(x)
    return x


def _plan(session):
    (plan,) = list(session._plans.values())
    return plan


def test_steady_state_runs_reuse_the_first_runs_buffers(plugin):
    graph, out = _chain()
    s = Session(graph, optimize=False)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 16)).astype(np.float32)
    np.testing.assert_allclose(s.run({"x": x}, return_numpy=True)[out], _want_chain(x), 1e-6)
    first = set(GIVEN)
    plan = _plan(s)
    pool = plan.buffer_pool
    # five values go to planned buffers (the last escapes as the output); each dies when the
    # next step has read it, so two arenas serve them all
    assert sum(st.buf >= 0 for st in plan.steps) == 5
    assert len(pool.layout.arenas) == 2 and len(first) == 3  # 2 arenas + the output's new out=
    for seed in range(1, 4):
        GIVEN.clear()
        x = np.random.default_rng(seed).standard_normal((16, 16)).astype(np.float32)
        got = s.run({"x": x}, return_numpy=True)[out]
        np.testing.assert_allclose(got, _want_chain(x), 1e-6)
        assert len(GIVEN) == 6
        assert len(set(GIVEN) - first) <= 1  # only the escaping output's out= is new
    assert pool.made == 1


def test_turned_off_by_option_and_environment(plugin, monkeypatch):
    graph, out = _chain()
    x = np.ones((16, 16), np.float32)
    s = Session(graph, optimize=False, planned_buffers=False)
    np.testing.assert_allclose(s.run({"x": x}, return_numpy=True)[out], _want_chain(x), 1e-6)
    assert _plan(s).buffer_pool is None and all(st.buf < 0 for st in _plan(s).steps)
    monkeypatch.setenv("ONEMODEL_PLANNED_BUFFERS", "0")
    s = Session(graph, optimize=False)
    s.run({"x": x})
    assert _plan(s).buffer_pool is None
    monkeypatch.setenv("ONEMODEL_PLANNED_BUFFERS", "1")
    s = Session(graph, optimize=False)
    s.run({"x": x})
    assert _plan(s).buffer_pool is not None


def test_a_buffer_read_through_a_view_stays_alive_until_the_views_last_read(plugin):
    """a = relu(x); t = a.T (a view of a's buffer); b = relu(t); c = tanh(b); y = c + t. Were
    t's reads not counted as a's, c would reuse a's arena and overwrite t before the Add."""
    b_ = GraphBuilder()
    x = b_.input("x", DType.F32, (8, 8))
    a = b_.op("Relu", x)
    t = b_.op("Transpose", a, perm=[1, 0])
    b = b_.op("Relu", t)
    c = b_.op("Tanh", b)
    y = b_.op("Add", c, t)
    b_.output(y)
    s = Session(b_.build(), optimize=False)
    for seed in range(3):
        xv = np.random.default_rng(seed).standard_normal((8, 8)).astype(np.float32)
        want = np.tanh(_relu(_relu(xv).T)) + _relu(xv).T
        np.testing.assert_allclose(s.run({"x": xv}, return_numpy=True)[y], want, 1e-6)
    plan = _plan(s)
    arena = {st.op + str(i): plan.buffer_pool.layout.slots[st.buf].arena
             for i, st in enumerate(plan.steps) if st.buf >= 0}
    assert arena["Tanh3"] != arena["Relu0"]


def test_outputs_never_share_a_buffer(plugin):
    """A view of a buffered value that reaches the outputs is copied (the group escapes, so its
    writer gets a new out= each run); mutating an output changes nothing in later runs."""
    b_ = GraphBuilder()
    x = b_.input("x", DType.F32, (4, 6))
    a = b_.op("Relu", x)
    r = b_.op("Reshape", a, b_.const([6, 4], DType.I64))  # a view of a
    h = b_.op("Tanh", a)
    g = b_.op("Relu", h)
    b_.output(r)
    b_.output(g)
    s = Session(b_.build(), optimize=False)
    xv = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    first = s.run({"x": xv}, return_numpy=True)
    plan = _plan(s)
    sets = list(plan.buffer_pool._free)
    for o in first.values():
        o[...] = 99.0  # the caller owns its outputs
        assert not any(np.shares_memory(o, arena) for bs in sets for arena in bs.arenas)
    again = s.run({"x": xv}, return_numpy=True)
    np.testing.assert_array_equal(again[r], _relu(xv).reshape(6, 4))
    np.testing.assert_allclose(again[g], _relu(np.tanh(_relu(xv))), 1e-6)
    assert not np.shares_memory(again[r], first[r])


def test_owned_copies_whatever_lies_on_a_buffer(plugin):
    """The last line of defence: ``Plan._owned`` copies a result on a run's arenas."""
    graph, _ = _chain()
    s = Session(graph, optimize=False)
    s.run({"x": np.ones((16, 16), np.float32)})
    plan = _plan(s)
    bufs = BufferSet(plan.buffer_pool.layout, kept=False)
    view = bufs.views[0][1:]
    (got,) = plan._owned([view], [], bufs.roots)
    assert not np.shares_memory(got, bufs.arenas[0])
    (same,) = plan._owned([view], [])  # without the roots it would be handed out as it is
    assert np.shares_memory(same, bufs.arenas[0])


def test_concurrent_runs_on_one_session(plugin):
    graph, out = _chain(8, (32, 32))
    s = Session(graph, optimize=False)
    inputs = [np.random.default_rng(i).standard_normal((32, 32)).astype(np.float32)
              for i in range(4)]
    s.run({"x": inputs[0]})
    SLOW.set()
    errors: list[str] = []
    start = threading.Barrier(4)

    def work(k):
        start.wait()
        for _ in range(15):
            got = s.run({"x": inputs[k]}, return_numpy=True)[out]
            if not np.allclose(got, _want_chain(inputs[k], 8), 1e-6):
                errors.append(f"thread {k}: wrong result")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    pool = _plan(s).buffer_pool
    # runs overlapped (the kernels sleep), each on its own set: at most one set per thread
    assert 2 <= pool.made <= 4 and pool.kept == pool.made and len(pool._free) == pool.kept
    # the plan's bytes count every set its pool keeps, and the cache counts them at a hit
    plan = _plan(s)
    assert plan.nbytes == pool.kept * pool.set_nbytes
    s.run({"x": inputs[0]})
    assert s.cache_info().nbytes == plan.nbytes


def test_a_kernel_that_fails_midway_gives_its_buffers_back(plugin):
    graph, out = _chain()
    s = Session(graph, optimize=False)
    x = np.full((16, 16), 2.0, np.float32)
    s.run({"x": x})
    pool = _plan(s).buffer_pool
    bad = x.copy()
    bad[0, 0] = 123  # Relu keeps it, the Tanh after it raises
    for _ in range(3):
        with pytest.raises(ExecutionError, match="marked input"):
            s.run({"x": bad})
        assert len(pool._free) == pool.kept == 1
    np.testing.assert_allclose(s.run({"x": x}, return_numpy=True)[out], _want_chain(x), 1e-6)
    assert pool.made == 1


def test_a_kernel_that_ignores_out_is_still_right(plugin):
    b_ = GraphBuilder()
    x = b_.input("x", DType.F32, (5, 7))
    a = b_.op("Sigmoid", x)
    y = b_.op("Relu", b_.op("Sigmoid", a))
    b_.output(y)
    s = Session(b_.build(), optimize=False)
    xv = np.random.default_rng(5).standard_normal((5, 7)).astype(np.float32)
    want = _relu(1 / (1 + np.exp(-(1 / (1 + np.exp(-xv))))))
    for _ in range(2):
        np.testing.assert_allclose(s.run({"x": xv}, return_numpy=True)[y], want, 1e-6)


@pytest.mark.parametrize("profile", [False, True])
def test_a_kernel_returning_another_shape_is_an_error_not_a_broadcast(plugin, profile):
    b_ = GraphBuilder()
    x = b_.input("x", DType.F32, (5, 7))
    y = b_.op("Relu", b_.op("Neg", b_.op("Relu", x)))
    b_.output(y)
    s = Session(b_.build(), optimize=False, profile=profile)
    with pytest.raises(ExecutionError, match=r"Neg.*writes_out=True must fill out"):
        s.run({"x": np.ones((5, 7), np.float32)})


def test_profiled_runs_use_the_buffers_too(plugin):
    graph, out = _chain()
    s = Session(graph, optimize=False, profile=True)
    x = np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32)
    for _ in range(3):
        np.testing.assert_allclose(s.run({"x": x}, return_numpy=True)[out], _want_chain(x), 1e-6)
    assert _plan(s).buffer_pool.made == 1
    assert "Relu" in s.profile_summary()


def test_plans_after_a_data_dependent_size_use_buffers(plugin):
    """The continuation after NonZero plans its own buffers, reused at its sizes."""
    b_ = GraphBuilder()
    x = b_.input("x", DType.F32, (6, 5))
    a = b_.op("Relu", x)
    idx = b_.op("NonZero", a)
    f = b_.op("Cast", idx, to=DType.F32)
    g = b_.op("Tanh", b_.op("Relu", f))
    y = b_.op("Relu", g)
    b_.output(y)
    s = Session(b_.build(), optimize=False)
    xv = np.random.default_rng(2).standard_normal((6, 5)).astype(np.float32)
    want = _relu(np.tanh(_relu(np.array(np.nonzero(_relu(xv)), np.float32))))
    for _ in range(3):
        np.testing.assert_allclose(s.run({"x": xv}, return_numpy=True)[y], want, 1e-6)
    plan = _plan(s)
    cont = plan.steps[-1].call
    (sub,) = list(cont._plans.values())
    assert sub.buffer_pool is not None and sub.buffer_pool.made == 1
    # the continuation's plans (and their buffers) count in the plan's bytes and the cache's
    assert plan.nbytes == plan.buffer_pool.set_nbytes + sub.nbytes
    assert s.cache_info().nbytes == plan.nbytes


@pytest.mark.filterwarnings("ignore::onemodel.tensors.devices.DeviceFallbackWarning")
def test_device_sessions_run_without_planned_buffers_profiled_or_not():
    """A plan placed on another device runs its own kernels: it keeps no planned buffers, and
    its profiled runs work as before."""
    pytest.importorskip("onemodel_sim", reason="the example backend (scripts/dev.py installs it)")
    b_ = GraphBuilder()
    x = b_.input("x", DType.F32, (1, 2, 6, 6))
    y = b_.op("Relu", b_.op("MaxPool", b_.op("Relu", x), kernel_shape=[2, 2], strides=[2, 2]))
    b_.output(y)
    graph = b_.build()
    xv = np.random.default_rng(4).standard_normal((1, 2, 6, 6)).astype(np.float32)
    want = Session(graph).run({"x": xv}, return_numpy=True)[y]
    for profile in (False, True):
        s = Session(graph, device="sim", profile=profile)
        got = s.run({"x": xv}, return_numpy=True)[y]
        np.testing.assert_array_equal(got, want)
        assert _plan(s).buffer_pool is None
