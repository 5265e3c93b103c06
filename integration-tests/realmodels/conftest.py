import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

SLOW_ENV = "ONEMODEL_SLOW_MODELS"


def pytest_collection_modifyitems(config, items):
    """The slowest real models run only when asked: ``-m slow_models`` (or an expression naming
    it) or ``ONEMODEL_SLOW_MODELS=1``; the default run keeps a representative subset."""
    if "slow_models" in (config.option.markexpr or "") or os.environ.get(SLOW_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"slow real model: run with -m slow_models or {SLOW_ENV}=1")
    for item in items:
        if "slow_models" in item.keywords:
            item.add_marker(skip)
