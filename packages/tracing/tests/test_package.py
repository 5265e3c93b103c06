import importlib.metadata

import onemodel.tracing


def test_installed_version_matches_the_package():
    assert importlib.metadata.version("onemodel-tracing") == onemodel.tracing.__version__
