import importlib.metadata
import subprocess
import sys

import onemodel.distributed


def test_installed_version_matches_the_package():
    assert importlib.metadata.version("onemodel-distributed") == onemodel.distributed.__version__


def test_import_loads_no_engine():
    code = ("import sys, onemodel.distributed\n"
            "print(sorted(m for m in ('mpi4py', 'ray', 'onemodel.training') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_unknown_name_is_an_attribute_error():
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        onemodel.distributed.Nope  # noqa: B018
