"""The runtime's hooks, each implemented by a plugin defined here: a package adding its own
hookspecs (onemodel_addhooks), a file format (onemodel_register_serializers) and a subcommand of
the onemodel tool (onemodel_register_commands)."""

from __future__ import annotations

import types

import numpy as np
import pluggy
import pytest
from click.testing import CliRunner

from onemodel.runtime import GraphBuilder, Session, load, save, serializers
from onemodel.tensors import DType, OneModelError, registry
from onemodel.tensors.registry import hookimpl


def _graph():
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("n", 3))
    b.output(b.op("Relu", b.op("Neg", x)), "y")
    return b.build()


def test_addhooks_lets_a_package_add_its_own_hook(isolated_registry):
    spec = types.ModuleType("widget_specs")

    @pluggy.HookspecMarker("onemodel")
    def onemodel_register_widgets(register):
        """Provide widgets."""

    spec.onemodel_register_widgets = onemodel_register_widgets

    class Adds:
        @hookimpl
        def onemodel_addhooks(self, pluginmanager):
            pluginmanager.add_hookspecs(spec)

    class Provides:
        @hookimpl
        def onemodel_register_widgets(self, register):
            register("gear", teeth=12)

    registry.register_plugin(Adds(), "adds-widget-hook")
    registry.register_plugin(Provides(), "provides-widgets")
    assert registry.collect("onemodel_register_widgets") == [
        ("provides-widgets", ("gear",), {"teeth": 12})]


class CopyFormat:
    """A format that stores the native format's bytes under another extension and magic."""

    @hookimpl
    def onemodel_register_serializers(self, register):
        register("copy", extensions=[".copy"], magic=b"ONEMODEL",
                 save=CopyFormat.save, load=CopyFormat.load, package="copy-format",
                 describe=lambda path: {"kind": "copy"})

    saved: list[str] = []

    @staticmethod
    def save(graph, path):
        CopyFormat.saved.append(str(path))
        from onemodel.native.format import save as native_save

        native_save(graph, path)

    @staticmethod
    def load(path):
        from onemodel.native.format import load as native_load

        return native_load(path)


def test_a_serializer_plugin_saves_and_loads_by_extension(isolated_registry, tmp_path):
    pytest.importorskip("onemodel.native")
    registry.register_plugin(CopyFormat(), "copy-format")
    path = tmp_path / "m.copy"
    save(_graph(), path)
    assert CopyFormat.saved[-1] == str(path)
    assert serializers.for_loading(path).describe(path) == {"kind": "copy"}
    x = np.array([[1, -2, 3]], np.float32)
    np.testing.assert_array_equal(Session.load(path).run({"x": x})["y"].numpy(), [[0, 2, 0]])
    assert [n.op for n in load(path).nodes] == ["Neg", "Relu", "Identity"]
    registry.register_plugin(CopyFormat(), "copy-format-again")
    with pytest.raises(OneModelError, match="registered twice"):
        serializers.serializers()


def test_a_plugin_adds_a_subcommand(isolated_registry):
    import click

    from onemodel.runtime.cli.app import cli

    @click.command("hello")
    @click.argument("who")
    def hello(who):
        click.echo(f"hello {who}")

    class Commands:
        @hookimpl
        def onemodel_register_commands(self, register):
            register("hello", hello)

    registry.register_plugin(Commands(), "hello-command")
    result = CliRunner().invoke(cli, ["hello", "world"])
    assert result.exit_code == 0 and result.output == "hello world\n"
    assert "hello" in CliRunner().invoke(cli, ["--help"]).output
    registry.register_plugin(Commands(), "hello-again")
    assert "registered twice" in CliRunner().invoke(cli, ["hello", "x"]).output
