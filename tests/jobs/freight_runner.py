"""`freight ARGS` run in the test process (typer's CliRunner), for the job tests that drive the CLI."""

from __future__ import annotations

from typer.testing import CliRunner

from freight_cli import app


def freight(args: list[str]) -> tuple[int, str]:
    """(exit code, output) of `freight ARGS`; an exception the CLI did not turn into an exit is
    raised here, with its traceback, instead of hiding behind exit code 1."""
    result = CliRunner().invoke(app, args)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def freight_ok(args: list[str]) -> str:
    """The output of `freight ARGS`, which must succeed."""
    code, output = freight(args)
    assert code == 0, output
    return output
