"""The plugin as the registry sees it: found through its entry point, lazy (no numba import
until a kernel runs), chosen over the reference kernels where it applies, and giving the same
results as a session without it. Threads follow the Session option."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from onemodel.numba import plugin
from onemodel.runtime import GraphBuilder, Session
from onemodel.tensors import DType


def test_entry_point_and_lazy_import():
    code = ("import sys; from onemodel.tensors import registry; import onemodel.runtime; "
            "names = [p.name for p in registry.list_plugins()]; "
            "ks = registry.kernels()['Conv']; "
            "print('numba' in names, 'numba' in sys.modules, ks[0].plugin, ks[0].priority)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "False", "numba", str(plugin.PRIORITY)]


def _net(rng):
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("batch", 6, 15, 13))

    def init(name, *shape, scale=0.3):
        return b.initializer(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    h = b.op("Conv", x, init("w1", 8, 6, 3, 3), init("b1", 8), pads=(1, 1, 1, 1))
    # a per-pixel shift: no per-channel constant conv-affine-folding could take into the Conv
    h = b.op("Relu", b.op("Mul", b.op("Add", h, init("shift", 1, 8, 15, 13)), init("k", 1)))
    h = b.op("LRN", h, size=3)
    h = b.op("MaxPool", h, kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1)
    h = b.op("Conv", h, init("w2", 8, 1, 3, 3), group=8, pads=(1, 1, 1, 1))
    h = b.op("BatchNormalization", h, *(b.initializer(n, rng.uniform(0.5, 1.5, 8).astype(
        np.float32)) for n in ("s", "o", "m", "v")))
    h = b.op("AveragePool", h, kernel_shape=(2, 2), strides=(1, 1), pads=(1, 1, 0, 0))
    h = b.op("GlobalAveragePool", h)
    h = b.op("Reshape", h, b.const([0, -1], "I64"))
    h = b.op("Gelu", h)
    b.output(b.op("Softmax", h), "out")
    return b.build()


def test_results_with_and_without_the_plugin_agree(isolated_registry):
    rng = np.random.default_rng(0)
    graph = _net(rng)
    x = rng.standard_normal((3, 6, 15, 13)).astype(np.float32)
    without = Session(graph).run({"x": x})["out"].numpy()
    isolated_registry.register_plugin(plugin, "numba")
    s = Session(graph)
    assert "FusedElementwise" in {n.op for n in s.graph.nodes}
    calls = [getattr(st.call, "func", st.call) for st in s.plan_for({"x": x.shape}).steps]
    assert sum(c.__module__.startswith("onemodel.numba") for c in calls) >= 4
    np.testing.assert_allclose(s.run({"x": x})["out"].numpy(), without, rtol=1e-5, atol=1e-6)


def test_session_threads_govern_numba():
    numba = pytest.importorskip("numba")
    from onemodel.numba import _jit
    from onemodel.tensors import threads

    saved = threads.num_threads()
    try:
        rng = np.random.default_rng(1)
        x = rng.standard_normal((1, 6, 15, 13)).astype(np.float32)
        for n in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            s = Session(_net(rng), threads=n)
            s.run({"x": x})
            assert threads.num_threads() == n and _jit._parallel == (n > 1)
            if n > 1:  # one thread: serial variants only, numba's pool is not started
                assert numba.get_num_threads() == n
    finally:
        threads.set_num_threads(saved)


def test_warmup_compiles_the_kernels_the_plan_uses():
    """In a fresh process, ``Session.warmup`` leaves the numba kernels of the plan compiled for
    its dtypes before any real run."""
    code = """
import numpy as np
from onemodel.runtime import GraphBuilder, Session
from onemodel.tensors import DType
b = GraphBuilder()
x = b.input("x", DType.F32, ("batch", 7))
b.output(b.op("Gelu", x), "y")
s = Session(b.build(), threads=1)
from onemodel.numba import activation
before = len(activation._gelu_f32.serial.signatures)
s.warmup({"x": (2, 7)})
print(before, [str(t[0]) for t in activation._gelu_f32.serial.signatures])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "0 ['array(float32, 1d, C)']"
