"""Training steps reuse the memory the previous step freed (onemodel.training.memory): in a
fresh process, steady-state steps of a small CNN fault (almost) no pages in, where with the
setting switched off glibc returns the freed heap and every step faults it in again."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from onemodel.training import memory

STEPS = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from onemodel import training as T
    from onemodel.tensors import Tensor
    model = T.Sequential(T.Conv2d(1, 32, 3, padding=1), T.ReLU(), T.MaxPool2d(2),
                         T.Conv2d(32, 64, 3, padding=1), T.ReLU(), T.MaxPool2d(2),
                         T.Flatten(), T.Linear(64 * 7 * 7, 10))
    opt = T.SGD(model.parameters(), 0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    x = Tensor.from_numpy(rng.standard_normal((32, 1, 28, 28)).astype(np.float32))
    y = Tensor.from_numpy(rng.integers(0, 10, 32).astype(np.int64))
    def step():
        with T.ActivationScope():
            opt.zero_grad()
            T.losses.cross_entropy(model(x), y).backward()
            opt.step()
    for _ in range(3):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(8):
        step()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 8)
""")


def _faults_per_step(**env) -> float:
    clean = {k: v for k, v in os.environ.items()
             if k not in memory._USER_SETTINGS and k != "ONEMODEL_KEEP_FREED_MEMORY"}
    out = subprocess.run([sys.executable, "-c", STEPS], capture_output=True, text=True,
                         check=True, env={**clean, "ONEMODEL_NUM_THREADS": "1", **env})
    return float(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_steady_training_steps_do_not_fault_pages_in():
    without = _faults_per_step(ONEMODEL_KEEP_FREED_MEMORY="0")
    if without < 200:
        pytest.skip(f"this C library keeps freed memory by itself ({without} faults a step)")
    with_it = _faults_per_step()
    assert with_it < 0.05 * without, (with_it, without)


def test_the_setting_can_be_switched_off(monkeypatch):
    monkeypatch.setattr(memory, "_applied", None)
    monkeypatch.setenv("ONEMODEL_KEEP_FREED_MEMORY", "0")
    assert memory.keep_freed_memory() is False
    monkeypatch.delenv("ONEMODEL_KEEP_FREED_MEMORY")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000000")  # the user's own choice wins
    assert memory.keep_freed_memory() is False
