"""numba's code generation prefers no vector gathers and scatters (``_jit._prefer_no_gathers``):
the loop that LLVM vectorized with AVX-512 gathers on AMD's Zen 4 (a stride-2 window's taps over
16 output columns, 3.4x slower) compiles without them; on an AVX-512 CPU, 512-bit vectors stay
whole (Intel's server CPUs split them into 256-bit halves otherwise); while a user's own choice
of CPU features, or numba already generating code before the plugin loads, is left alone. Each
case runs in a fresh process: the features are fixed when numba first generates code."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytest.importorskip("numba")

_SCRIPT = r"""
import json, sys
import numpy as np
if sys.argv[1] == "numba-first":
    import numba
    numba.njit(lambda x: x + 1)(1)  # numba generates code before the plugin is imported
from onemodel.numba import _jit
from onemodel.numba._simd import fma16, load16, store16
import numba
from numba import njit

U = np.uint64


@njit(cache=False)
def taps(even, odd, out, planes):
    # a MaxPool's 3x3, stride 2 taps, 16 output columns per row (pool._max_pool_fixed's shape)
    for p in range(planes):
        for y in range(16):
            for q in range(16):
                a = even[U(y * 17 + q)]
                v = odd[U(y * 17 + q)]
                a = v if v > a else a
                v = even[U(y * 17 + q + 1)]
                out[U(p * 256 + y * 16 + q)] = v if v > a else a


@njit(cache=False)
def axpy16(a, b, out):
    store16(out, 0, fma16(load16(a, 0), load16(b, 0), load16(out, 0)))


lanes = np.arange(16, dtype=np.float32)
fused = np.ones(16, np.float32)
axpy16(lanes, lanes, fused)
wide_asm = "\n".join(axpy16.inspect_asm().values()).lower()
even = np.arange(16 * 17 + 1, dtype=np.float32)
odd = even[::-1].copy()
out = np.empty(2 * 256, np.float32)
taps(even, odd, out, 2)
want = np.maximum(np.maximum(even[:-1], odd[:-1]), even[1:]).reshape(16, 17)[:, :16]
asm = "\n".join(taps.inspect_asm().values()).lower()
print(json.dumps({
    "added": _jit.PREFERS_NO_GATHERS,
    "features": numba.config.CPU_FEATURES,
    "gathers": sum(("vgather" in line) or ("vscatter" in line) for line in asm.splitlines()),
    "right": bool(np.array_equal(out.reshape(2, 16, 16), np.broadcast_to(want, (2, 16, 16)))),
    "wide": _jit.WIDE_VECTORS,
    "zmm": "zmm" in wide_asm,
    "fma16_right": bool(np.array_equal(fused, lanes * lanes + 1)),
}))
"""


def _run(mode: str, **env) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU_")}
    environ.update(env)
    done = subprocess.run([sys.executable, "-c", _SCRIPT, mode], capture_output=True,
                          text=True, env=environ, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


x86 = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                         reason="the tuning features are LLVM's x86 ones")


@x86
def test_the_plugin_adds_the_tuning_features_and_the_loop_compiles_without_gathers():
    from numba.core import codegen

    got = _run("plugin-first")
    assert got["added"] is True
    host = codegen.get_host_cpu_features()
    avx512 = "+avx512f" in host.split(",")
    assert got["features"] == ",".join(
        (host, *_jit_features(), *(("-prefer-256-bit",) if avx512 else ())))
    assert got["gathers"] == 0
    assert got["right"] and got["fma16_right"]
    # on an AVX-512 CPU a sixteen-lane multiply-add is one 512-bit instruction
    assert got["wide"] is avx512
    assert got["zmm"] is avx512


def _jit_features():
    return ("+prefer-no-gather", "+prefer-no-scatter")


@x86
def test_a_users_own_features_are_kept():
    from numba.core import codegen

    mine = codegen.get_host_cpu_features()
    got = _run("plugin-first", NUMBA_CPU_FEATURES=mine)
    assert got["added"] is False
    assert got["features"] == mine
    assert got["right"] and got["fma16_right"]
    assert got["wide"] is False  # the sixteen-lane kernels are not chosen


@x86
def test_a_users_features_may_keep_vectors_whole():
    from numba.core import codegen

    mine = codegen.get_host_cpu_features() + ",-prefer-256-bit"
    got = _run("plugin-first", NUMBA_CPU_FEATURES=mine)
    assert got["added"] is False and got["wide"] is True


def test_numba_already_generating_code_is_left_alone():
    got = _run("numba-first")
    assert got["added"] is False
    assert got["features"] is None  # numba's default: the host's features, untouched
    assert got["right"] and got["fma16_right"]
    assert got["wide"] is False
