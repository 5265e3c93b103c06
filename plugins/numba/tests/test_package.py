import importlib.metadata

import onemodel.numba


def test_installed_version_matches_the_package():
    assert importlib.metadata.version("onemodel-numba") == onemodel.numba.__version__
