import importlib.metadata

import onemodel.training


def test_installed_version_matches_the_package():
    assert importlib.metadata.version("onemodel-training") == onemodel.training.__version__
