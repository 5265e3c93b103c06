"""Fixtures every package's tests share."""

import pytest

from onemodel.tensors import registry


@pytest.fixture
def isolated_registry(monkeypatch):
    """A registry that loads no installed plugin: only the built-in parts (the reference kernels,
    and the runtime's passes once it is imported)."""
    monkeypatch.setenv(registry.ENV_NO_AUTOLOAD, "1")
    registry.reset()
    yield registry
    monkeypatch.undo()
    registry.reset()
