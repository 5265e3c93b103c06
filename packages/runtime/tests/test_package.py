import importlib.metadata

import onemodel.runtime


def test_installed_version_matches_the_package():
    assert importlib.metadata.version("onemodel-runtime") == onemodel.runtime.__version__
