"""PyTorch imported first: its libgomp is loaded before the plugin can make OpenMP workers sleep
between kernels. The plugin must then keep numba off that libgomp (no OpenMP threading layer,
no parallel region from a serial kernel), so no worker spins beside our serial kernels; results
stay right, with one and two threads and from two Python threads at once. Each case runs in a
fresh process (which library loads libgomp first is per process), on a numba cache of this
module's own, filled in a known order: what the cache holds decides which machine code runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("numba")
pytest.importorskip("torch")

pytestmark = pytest.mark.torch

_SCRIPT = r"""
import json, os, sys, threading, time
mode, n = sys.argv[1], int(sys.argv[2])
import numpy as np
if mode == "torch":
    import torch
    t = torch.randn(600, 600)
    (t + t).sum()  # torch's OpenMP pool starts, under libgomp's default (spinning) policy
from onemodel.runtime import GraphBuilder, Session
from onemodel.tensors import DType


def session(rows, bias):
    b = GraphBuilder()
    x = b.input("x", DType.F32, (rows, 512 if rows > 64 else 32))
    b.output(b.op("Tanh", b.op("Add", x, b.initializer("bias", bias))), "y")
    return Session(b.build(), threads=n)


def others_cpu_ms():
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != os.getpid():
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])
    return total * 1000 // os.sysconf("SC_CLK_TCK")


rng = np.random.default_rng(0)
rows = 1024 if sys.argv[3] == "big" else 32
bias = np.linspace(-1, 1, rows, dtype=np.float32).reshape(rows, 1)
s = session(rows, bias)
x = rng.standard_normal((rows, 512 if rows > 64 else 32)).astype(np.float32)
want = np.tanh(x + bias)
np.testing.assert_allclose(s.run({"x": x})["y"].numpy(), want, rtol=2e-6, atol=1e-6)
assert "FusedElementwise" in {node.op for node in s.graph.nodes}
time.sleep(0.2)  # torch's own workers finish their spin after its op
before = others_cpu_ms()
for _ in range(300 if rows == 32 else 20):
    y = s.run({"x": x})["y"].numpy()
spun = others_cpu_ms() - before
np.testing.assert_allclose(y, want, rtol=2e-6, atol=1e-6)
errors = []
if n > 1:  # two Python threads launching parallel kernels at once
    def worker():
        try:
            for _ in range(10):
                np.testing.assert_allclose(s.run({"x": x})["y"].numpy(), want, rtol=2e-6,
                                           atol=1e-6)
        except Exception as e:
            errors.append(repr(e))
    ts = [threading.Thread(target=worker) for _ in range(2)]
    [t.start() for t in ts]
    [t.join() for t in ts]
import numba
from onemodel.numba import _jit
try:
    layer = numba.threading_layer()
except ValueError:
    layer = None  # numba's pool never started
print(json.dumps(dict(layer=layer, avoid=_jit.AVOID_OPENMP, spun=spun, errors=errors)))
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("numba-cache")


def _run(cache, mode, threads, size):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY",
                                                            "NUMBA_THREADING_LAYER")}
    env.update(NUMBA_CACHE_DIR=str(cache), OMP_NUM_THREADS="2")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, mode, str(threads), size], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_torch_first_keeps_numba_off_spinning_openmp(cache):
    # the parallel variant compiles (and is cached) first, as after a multi-threaded session
    big = _run(cache, "torch", 2, "big")
    assert big["avoid"] and big["layer"] not in ("omp", None) and not big["errors"]
    # one thread: serial machine code only, numba's pool never started, no worker spins (before
    # the fix the serial variant loaded the parallel one from the cache and every call woke
    # torch's spinning libgomp workers: about 1 s of their CPU over these 300 calls)
    small = _run(cache, "torch", 1, "small")
    assert small["layer"] is None
    assert small["spun"] <= 60, small
    # two threads, small calls: serial, still no spinning
    two = _run(cache, "torch", 2, "small")
    assert two["layer"] not in ("omp", None) and two["spun"] <= 60, two


def test_without_torch_numba_keeps_its_openmp_layer(cache):
    out = _run(cache, "plain", 2, "big")
    assert not out["avoid"] and not out["errors"]
    if os.path.exists("/proc/self/maps"):
        assert out["layer"] in ("omp", "tbb", "workqueue")
