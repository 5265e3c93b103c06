"""numba's code generation prefers no vector gathers and scatters (``_jit._prefer_no_gathers``):
the loop that LLVM vectorized with AVX-512 gathers on AMD's Zen 4 (a stride-2 window's taps over
16 output columns, 3.4x slower) compiles without them, while a user's own choice of CPU
features, or numba already generating code before the plugin loads, is left alone. Each case
runs in a fresh process: the features are fixed when numba first generates code."""

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
    assert got["features"].endswith(",+prefer-no-gather,+prefer-no-scatter")
    # the host's own features stay as numba would have chosen them
    assert got["features"].startswith(codegen.get_host_cpu_features())
    assert got["gathers"] == 0
    assert got["right"]


@x86
def test_a_users_own_features_are_kept():
    from numba.core import codegen

    mine = codegen.get_host_cpu_features()
    got = _run("plugin-first", NUMBA_CPU_FEATURES=mine)
    assert got["added"] is False
    assert got["features"] == mine
    assert got["right"]


def test_numba_already_generating_code_is_left_alone():
    got = _run("numba-first")
    assert got["added"] is False
    assert got["features"] is None  # numba's default: the host's features, untouched
    assert got["right"]
