import importlib.metadata

import onemodel.onnx


def test_installed_version_matches_the_package():
    assert importlib.metadata.version("onemodel-onnx") == onemodel.onnx.__version__
