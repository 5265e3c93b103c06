"""Hook specifications the runtime adds to the ``onemodel`` registry (through
``onemodel_addhooks``)."""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("onemodel")


@hookspec
def onemodel_register_passes(register) -> None:
    """Provide graph optimization passes.

    :param register: ``register(name, impl, *, order=100)``. ``impl`` is a
        :class:`onemodel.runtime.passes.Pass` subclass or a ``"module:attr"`` string naming one;
        passes run in increasing ``order`` (the built-ins use 10 to 70), repeatedly, until none
        changes the graph.

    Example (the runtime's own)::

        @hookimpl
        def onemodel_register_passes(register):
            register("dead-code", "onemodel.runtime.passes.cleanup:DeadCodeElimination", order=70)
    """


@hookspec
def onemodel_register_serializers(register) -> None:
    """Provide a file format for graphs.

    :param register: ``register(name, *, extensions, magic=b"", save, load, package,
        describe=None)``.
        ``extensions`` are file suffixes (``[".onemodel"]``); ``magic`` a byte prefix that
        identifies the format's files; ``save(graph, path)`` and ``load(path) -> Graph`` are
        callables or ``"module:attr"`` strings; ``package`` is the distribution to install;
        ``describe(path) -> dict`` (optional) gives format details that ``onemodel inspect``
        prints, such as the format version or ONNX opset.

    Example (``onemodel-native``)::

        @hookimpl
        def onemodel_register_serializers(register):
            register("native", extensions=[".onemodel"], magic=b"ONEMODEL",
                     save="onemodel.native.format:save", load="onemodel.native.format:load",
                     describe="onemodel.native.describe:describe", package="onemodel-native")
    """


@hookspec
def onemodel_register_commands(register) -> None:
    """Provide subcommands of the ``onemodel`` command-line tool.

    :param register: ``register(name, command)``. ``command`` is a :class:`click.Command` or a
        ``"module:attr"`` string naming one (imported only when that subcommand runs or its help
        is shown); ``name`` is what users type after ``onemodel``. A name registered twice is an
        error.

    Example (the ONNX plugin adds ``onemodel validate``)::

        @hookimpl
        def onemodel_register_commands(register):
            register("validate", "onemodel.onnx.cli:validate_command")
    """
