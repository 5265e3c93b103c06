"""Fixtures shared by the numba plugin's tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# the shared test helpers (conv_arrays.py) import as plain modules
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def parallel_variants(monkeypatch):
    """Every kernel call takes its parallel (prange) variant, on two threads."""
    from onemodel.numba import _jit
    from onemodel.tensors import threads

    saved = threads.num_threads()
    monkeypatch.setattr(_jit, "PARALLEL_MIN_BYTES", 0)
    threads.set_num_threads(2)
    _jit.sync_threads()
    monkeypatch.setattr(_jit, "_parallel", True)
    yield
    threads.set_num_threads(saved)


@pytest.fixture
def serial(monkeypatch):
    """Serial kernels and plans, as with one thread: the kernels chosen on one thread only
    (register tiles, lanes, panels, Winograd, bands) are planned. The thread setting is synced
    first, or a later sync would set the mode back."""
    from onemodel.numba import _jit

    _jit.sync_threads()
    monkeypatch.setattr(_jit, "_parallel", False)


@pytest.fixture
def no_small_convolutions(monkeypatch):
    """Convolution tests' cases are small: without this, most would take the one-call
    small-convolution kernel (tested in test_conv_small.py) instead of the path they test.
    The memoized plans are cleared before and after."""
    from onemodel.numba import conv

    monkeypatch.setattr(conv, "_SMALL_MAX_WORK", -1)
    monkeypatch.setattr(conv, "_SMALL_MAX_WORK_WIDE", -1)
    monkeypatch.setattr(conv, "_SMALL_MAX_WORK_NARROW", -1)
    conv._plan.cache_clear()
    conv._PLANS.clear()
    yield
    conv._plan.cache_clear()
    conv._PLANS.clear()


@pytest.fixture
def no_depthwise_lanes(monkeypatch):
    """Planned depthwise convolutions keep the kernel of their plan's path, not the vector-lane
    kernel that is chosen over it for some shapes (tested in test_depthwise_lanes.py): tests
    that compare a path's planned call bit for bit with the generic call use this."""
    from onemodel.numba import depthwise_lanes

    monkeypatch.setattr(depthwise_lanes, "fits", lambda *args: False)


@pytest.fixture
def no_pointwise(monkeypatch):
    """Planned 1x1 convolutions keep the kernel of their plan's path, not the register tiles
    chosen over it for small float32 ones on one thread (tested in test_pointwise.py)."""
    from onemodel.numba import pointwise

    monkeypatch.setattr(pointwise, "kernel", lambda *args: None)  # fits() asks it too


@pytest.fixture
def no_panels(monkeypatch):
    """Planned float32 MatMuls by constant weights keep the skinny product or BLAS, not the
    packed panels chosen over them on one thread (tested in test_panels.py)."""
    from onemodel.numba import panels

    monkeypatch.setattr(panels, "fits", lambda *args: False)
