"""Every hook of the registry is documented (its docstring gives each parameter and an example;
docs/plugins.md gives its exact signature) and implemented by a plugin in some test."""

from __future__ import annotations

from pathlib import Path

import pytest

import onemodel.runtime  # noqa: F401 - adds the runtime's hookspecs
from onemodel.tensors import registry

ROOT = Path(__file__).resolve().parent.parent


def _hookspecs():
    pm = registry.pluginmanager()
    out = []
    for name in sorted(vars(pm.hook)):
        caller = getattr(pm.hook, name)
        if name.startswith("onemodel_") and getattr(caller, "spec", None) is not None:
            out.append((name, caller.spec.argnames, caller.spec.function.__doc__ or ""))
    return out


HOOKS = _hookspecs()
TEST_FILES = [p for folder in ("packages", "plugins", "integration-tests")
              for p in (ROOT / folder).rglob("test_*.py") if p != Path(__file__).resolve()]


def test_the_known_hooks_are_all_there():
    assert {"onemodel_addhooks", "onemodel_register_kernels", "onemodel_register_backends",
            "onemodel_register_passes", "onemodel_register_serializers",
            "onemodel_register_commands"} <= {h[0] for h in HOOKS}


@pytest.mark.parametrize("name, args, doc", HOOKS, ids=[h[0] for h in HOOKS])
def test_hook_is_documented_and_exercised(name, args, doc):
    for arg in args:
        assert f":param {arg}:" in doc, f"{name}'s docstring does not describe {arg!r}"
    assert "Example" in doc and "@hookimpl" in doc, f"{name}'s docstring has no example"
    signature = f"{name}({', '.join(args)})"
    assert signature in (ROOT / "docs" / "plugins.md").read_text(), \
        f"docs/plugins.md does not give {signature}"
    assert any(f"def {name}(" in p.read_text() for p in TEST_FILES), \
        f"no test implements {name}"
