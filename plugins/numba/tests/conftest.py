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
