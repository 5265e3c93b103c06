import importlib.metadata

import onemodel.native


def test_installed_version_matches_the_package():
    assert importlib.metadata.version("onemodel-native") == onemodel.native.__version__
