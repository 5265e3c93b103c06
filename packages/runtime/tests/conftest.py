import sys
from pathlib import Path

# the shared graph builders (runtime_graphs.py) import as a plain module
sys.path.insert(0, str(Path(__file__).parent))


import pytest


@pytest.fixture
def isolated_runtime(monkeypatch):
    """The registry with only the built-in parts (entry points not loaded)."""
    from onemodel.tensors import registry

    monkeypatch.setenv(registry.ENV_NO_AUTOLOAD, "1")
    registry.reset()
    yield registry
    monkeypatch.undo()
    registry.reset()
