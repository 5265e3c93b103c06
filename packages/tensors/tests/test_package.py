import importlib.metadata

import onemodel.tensors


def test_installed_version_matches_the_package():
    assert importlib.metadata.version("onemodel-tensors") == onemodel.tensors.__version__
