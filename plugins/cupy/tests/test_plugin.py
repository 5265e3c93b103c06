"""The plugin as the registry sees it, on any machine: found through its entry point, lazy (no
CuPy import to register), the device unusable but harmless where CuPy or a GPU is missing, and
a kernel table whose every entry takes exactly its op's inputs and attributes."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import subprocess
import sys

import pytest

import onemodel.cupy
from onemodel.cupy import device, plugin
from onemodel.tensors import DType, Tensor
from onemodel.tensors.errors import OneModelError
from onemodel.tensors.ops import OPS
from onemodel.tensors.registry import resolve


def test_installed_version_matches_the_package():
    assert importlib.metadata.version("onemodel-cupy") == onemodel.cupy.__version__


def test_entry_point_registers_the_device_and_kernels_without_importing_cupy():
    code = ("import sys; from onemodel.tensors import registry; import onemodel.runtime; "
            "names = [p.name for p in registry.list_plugins()]; "
            "b = registry.backends()['cuda']; "
            "ks = [r for r in registry.kernels()['Conv'] if r.device == 'cuda']; "
            "print('cupy' in names, b.plugin, b.fallback, ks[0].plugin, ks[0].priority, "
            "'cupy' in sys.modules, 'onemodel.cupy.kernels' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "cupy", "True", "cupy", str(plugin.PRIORITY), "False", "False"]


def test_cpu_kernels_are_untouched():
    from onemodel.tensors import registry

    for op in plugin.KERNELS:
        best = registry.get_registry().candidates(op, "cpu", None)[0]
        assert not str(best.impl).startswith("onemodel.cupy"), op


@pytest.mark.parametrize("op", sorted(plugin.KERNELS))
def test_kernel_signature_is_the_op_signature(op):
    impl, dtypes = plugin.KERNELS[op]
    ours = inspect.signature(resolve(impl)).parameters
    ref = inspect.signature(OPS[op].kernel).parameters
    # a reference kernel's out= (OpDef.writes_out) is the planned buffer, not part of the op
    assert [(p.name, p.kind, p.default) for p in ours.values()] == \
        [(p.name, p.kind, p.default) for p in ref.values()
         if not (OPS[op].writes_out and p.name == "out")]
    assert all(DType.of(d) for d in dtypes)


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None,
                    reason="CuPy is installed here: the missing-CuPy path cannot be shown")
def test_without_cupy_the_device_is_unavailable_and_says_so():
    assert device.available() is False
    x = Tensor.randn(2, 3)
    with pytest.raises(OneModelError, match="cuda.*not usable"):
        x.to("cuda")
