"""The ``onemodel`` click group: loads subcommands from the registry and turns every
``OneModelError`` into one clear line and exit status 1."""

from __future__ import annotations

import sys

import click

from onemodel.tensors import OneModelError, registry


class _Group(click.Group):
    """Subcommands are looked up in the registry when first needed, so ``--help`` of one command
    imports only that command's module."""

    def _commands(self) -> dict[str, object]:
        table: dict[str, object] = {}
        for plugin, args, _kwargs in registry.collect("onemodel_register_commands"):
            name, impl = args[0], args[1]
            if name in table:
                raise click.ClickException(
                    f"command {name!r} is registered twice (the second by plugin {plugin!r})")
            table[name] = impl
        return table

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self._commands())

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        impl = self._commands().get(name)
        return None if impl is None else registry.resolve(impl)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except OneModelError as exc:
            raise click.ClickException(_one_line(exc)) from None
        except (OSError, ValueError) as exc:  # files the user named, malformed option values
            raise click.ClickException(_one_line(exc)) from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="onemodel-runtime", prog_name="onemodel")
def cli() -> None:
    """Inspect, run, convert, compare and benchmark OneModel and ONNX model files."""


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point."""
    try:
        # without standalone mode, click returns an Exit's code instead of raising it
        code = cli.main(args=argv, prog_name="onemodel", standalone_mode=False)
    except click.Abort:
        click.echo("aborted", err=True)
        return 1
    except click.UsageError as exc:  # one line, not click's usage block
        where = exc.ctx.command_path if exc.ctx is not None else "onemodel"
        click.echo(f"Error: {_one_line(exc.format_message())} (see '{where} --help')", err=True)
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
