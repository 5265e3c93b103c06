"""One thread setting: ONEMODEL_NUM_THREADS or set_num_threads, applied to the BLAS."""

from __future__ import annotations

import pytest

from onemodel.tensors import OneModelError, threads


@pytest.fixture
def fresh(monkeypatch):
    saved = (threads._threads, threads._blas_applied)
    monkeypatch.setattr(threads, "_threads", None)
    monkeypatch.setattr(threads, "_blas_applied", None)
    yield
    threads._threads, threads._blas_applied = saved
    if saved[0] is not None:
        threads.set_num_threads(saved[0])


def _blas_threads() -> set[int]:
    threadpoolctl = pytest.importorskip("threadpoolctl")
    return {p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"}


def test_the_environment_sets_the_count_and_the_blas(fresh, monkeypatch):
    monkeypatch.setenv(threads.ENV, "1")
    before = threads.generation
    assert threads.num_threads() == 1
    assert threads.generation > before
    assert _blas_threads() <= {1}


def test_set_num_threads_moves_the_blas(fresh):
    threads.set_num_threads(2)
    assert threads.num_threads() == 2
    assert _blas_threads() <= {2}
    threads.set_num_threads(1)
    assert _blas_threads() <= {1}


@pytest.mark.parametrize("raw", ["zero", "0", "-2", "1.5"])
def test_a_bad_environment_value_is_an_error(fresh, monkeypatch, raw):
    monkeypatch.setenv(threads.ENV, raw)
    with pytest.raises(OneModelError, match=threads.ENV):
        threads.num_threads()


@pytest.mark.parametrize("bad", [0, -1, 1.0, "2", True])
def test_a_bad_count_is_an_error(fresh, bad):
    with pytest.raises(OneModelError, match="whole number"):
        threads.set_num_threads(bad)
