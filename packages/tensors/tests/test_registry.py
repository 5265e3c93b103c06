"""The plugin registry: plugins defined inside each test, isolated from what is installed."""

import importlib.metadata
import subprocess
import sys
import textwrap

import numpy as np
import pluggy
import pytest

from onemodel.tensors import PluginError, Tensor, registry
from onemodel.tensors.registry import PluginLoadWarning, hookimpl


def _entry_point(name, value):
    return importlib.metadata.EntryPoint(name=name, value=value, group="onemodel")


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A folder on sys.path where a test writes plugin modules."""
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.fixture
def fake_entry_points(monkeypatch, isolated_registry):
    """Entry points the registry will see instead of the installed ones."""
    eps = []
    monkeypatch.delenv(registry.ENV_NO_AUTOLOAD)
    monkeypatch.setattr(registry, "_entry_points", lambda: list(eps))
    registry.reset()
    yield eps
    registry.reset()


class DoublingAdd:
    """A plugin whose Add kernel doubles the result, so a test sees which kernel ran."""

    calls = 0

    @hookimpl
    def onemodel_register_kernels(self, register):
        def add(a, b):
            DoublingAdd.calls += 1
            return (a + b) * 2

        register("Add", add, priority=10)


def test_reference_kernels_register_through_the_hooks(isolated_registry):
    infos = {p.name: p for p in registry.list_plugins()}
    ref = infos["onemodel-tensors.reference"]
    assert ref.hooks == ["onemodel_register_kernels"] and ref.version == "0.1.0"
    assert "Conv" in registry.kernels() and registry.kernels()["Add"][0].priority == 0


def test_a_higher_priority_kernel_overrides_one_op(isolated_registry):
    registry.register_plugin(DoublingAdd(), "doubling", version="1.2")
    a = Tensor.from_data([1.0, 2.0])
    assert (a + a).tolist() == [4.0, 8.0]
    assert (a * a).tolist() == [1.0, 4.0]  # other ops untouched
    assert {"name": "doubling", "version": "1.2"}.items() <= vars(
        next(p for p in registry.list_plugins() if p.name == "doubling")).items()
    registry.unregister_plugin("doubling")
    assert (a + a).tolist() == [2.0, 4.0]


def test_supports_lets_a_kernel_refuse_a_call(isolated_registry):
    class SmallOnly:
        @hookimpl
        def onemodel_register_kernels(self, register):
            register("Mul", lambda a, b: np.full(np.broadcast_shapes(a.shape, b.shape), -1.0,
                                                  a.dtype),
                     priority=5, supports=lambda a, b: a.size <= 2, dtypes=["F32"])

    registry.register_plugin(SmallOnly(), "small")
    two = Tensor.from_data([1.0, 2.0])
    three = Tensor.from_data([1.0, 2.0, 3.0])
    assert (two * two).tolist() == [-1.0, -1.0]
    assert (three * three).tolist() == [1.0, 4.0, 9.0]
    f64 = two.cast("F64")
    assert (f64 * f64).tolist() == [1.0, 4.0]  # dtypes=[F32] excludes F64


def test_kernels_are_named_lazily(isolated_registry, plugin_dir):
    (plugin_dir / "lazy_kernels.py").write_text("def sub(a, b):\n    return a - b - 100\n")

    class Lazy:
        @hookimpl
        def onemodel_register_kernels(self, register):
            register("Sub", "lazy_kernels:sub", priority=3)

    registry.register_plugin(Lazy(), "lazy")
    assert "lazy_kernels" not in sys.modules
    assert registry.kernels()["Sub"][0].plugin == "lazy"
    assert "lazy_kernels" not in sys.modules  # collecting does not import the code
    assert (Tensor.from_data([1.0]) - Tensor.from_data([1.0])).tolist() == [-100.0]
    assert "lazy_kernels" in sys.modules


def test_entry_point_plugins_load_and_broken_ones_are_skipped(fake_entry_points, plugin_dir):
    (plugin_dir / "good_plugin.py").write_text(textwrap.dedent("""
        from onemodel.tensors.registry import hookimpl
        __version__ = "3.1"

        @hookimpl
        def onemodel_register_backends(register):
            register("fancy", description="a test device")
    """))
    (plugin_dir / "broken_plugin.py").write_text("import a_module_that_does_not_exist\n")
    fake_entry_points += [_entry_point("good", "good_plugin"),
                          _entry_point("broken", "broken_plugin")]
    with pytest.warns(PluginLoadWarning, match="'broken'.*a_module_that_does_not_exist"):
        names = {p.name: p for p in registry.list_plugins()}
    assert "broken" not in names
    assert names["good"].version == "3.1" and names["good"].hooks == ["onemodel_register_backends"]
    assert registry.backends()["fancy"].description == "a test device"


def test_allow_and_deny_lists(fake_entry_points, plugin_dir, monkeypatch):
    for n in ("p_one", "p_two"):
        (plugin_dir / f"{n}.py").write_text("")
        fake_entry_points.append(_entry_point(n, n))

    def loaded():
        registry.reset()
        return {p.name for p in registry.list_plugins()} - set(registry.BUILTIN_PLUGINS)

    assert loaded() == {"p_one", "p_two"}
    monkeypatch.setenv(registry.ENV_ALLOW, "p_two")
    assert loaded() == {"p_two"}
    monkeypatch.delenv(registry.ENV_ALLOW)
    monkeypatch.setenv(registry.ENV_DENY, "p_two, p_one")
    assert loaded() == set()
    monkeypatch.delenv(registry.ENV_DENY)
    monkeypatch.setenv(registry.ENV_NO_AUTOLOAD, "1")
    assert loaded() == set()


def test_duplicate_plugin_names_are_an_error(fake_entry_points, plugin_dir):
    (plugin_dir / "dup_a.py").write_text("")
    (plugin_dir / "dup_b.py").write_text("")
    fake_entry_points += [_entry_point("same", "dup_a"), _entry_point("same", "dup_b")]
    with pytest.raises(PluginError, match="two plugins are named 'same'"):
        registry.list_plugins()
    registry.reset()
    fake_entry_points.clear()
    registry.register_plugin(DoublingAdd(), "twice")
    with pytest.raises(PluginError, match="already registered"):
        registry.register_plugin(DoublingAdd(), "twice")


def test_dispatch_never_calls_pluggy(isolated_registry, monkeypatch):
    a = Tensor.from_data([1.0, 2.0]).requires_grad_()
    (a * a + a).sum().backward()  # warm the kernel cache
    calls = []
    real = pluggy.HookCaller.__call__
    monkeypatch.setattr(pluggy.HookCaller, "__call__",
                        lambda self, *args, **kw: calls.append(self.name) or real(self, *args, **kw))
    real_hookimpls = pluggy.HookCaller.get_hookimpls
    monkeypatch.setattr(pluggy.HookCaller, "get_hookimpls",
                        lambda self: calls.append(self.name) or real_hookimpls(self))
    for _ in range(3):
        (a * a + a).sum().backward()
    assert calls == []


def test_unknown_hook_and_missing_kernel_errors(isolated_registry):
    with pytest.raises(PluginError, match="no hook named 'onemodel_register_nothing'"):
        registry.collect("onemodel_register_nothing")
    with pytest.raises(PluginError, match="no kernel for op 'Add' on device 'tpu'"):
        registry.get_registry().candidates("Add", "tpu", None)


def test_importing_tensors_imports_neither_numba_nor_onnx():
    code = ("import sys, onemodel.tensors as t; t.Tensor.ones(2) + 1; "
            "t.registry.list_plugins(); "
            "print(sorted(m for m in ('numba', 'onnx', 'onnxruntime', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
