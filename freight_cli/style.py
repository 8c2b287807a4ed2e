"""How every `freight` command looks: its help and its errors.

- Help: arguments and option values show as capital metavars (`INPUT`, `--model MODEL`), a choice
  as its values (`--market on-demand|spot`), a flag as nothing at all (no `<bool>`), never typer's
  `<str>` / `{input}` placeholders.
- Errors: one line on stderr, `error: <what>; <what to do>`, exit status 2, for freight's own errors
  (`common.fail`) and for the command line's (an unknown flag, a value that does not parse, a
  missing argument) alike; no boxes, no usage block.

`FreightGroup` is the class of the `freight` app and of its sub-apps; `restyle_commands` gives every
registered command `FreightCommand`. Both restyle their parameters when the help or the parser asks
for them (`get_params`), by switching each typer parameter to a subclass that only changes display.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer._click import exceptions as click_exceptions
from typer._click.core import Context, Parameter
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from freight_cli.common import EXIT_USER_ERROR, fail


class _Option(TyperOption):
    """An option whose value shows as its metavar or its choices; a flag shows no value."""

    def display_type_rich(self, ctx: Context) -> str | None:
        if self.is_flag or self.count:
            return None
        if self.metavar is not None:
            return self.metavar
        desc = self.type_descriptor
        if desc.is_choice and desc.choices:
            return "|".join(str(c) for c in desc.choices)
        return (self.name or "value").upper()


class _Argument(TyperArgument):
    """An argument shown by its capital metavar, bare in the usage line when required."""

    def display_type_rich(self, ctx: Context) -> str | None:
        return None  # the metavar says it; `<str>` beside it says nothing

    def _usage_display_name(self) -> str:
        name = self.display_name_raw
        if not self.required:
            name = f"[{name}]"
        return name + ("..." if self.nargs != 1 else "")


def _restyle(params: Sequence[Parameter]) -> None:
    for param in params:
        if type(param) is TyperOption:
            param.__class__ = _Option  # display only: no new state, the same parsing
        elif type(param) is TyperArgument:
            param.__class__ = _Argument
            if param.metavar is None and param.name:
                param.metavar = param.name.upper()


class FreightCommand(TyperCommand):
    def get_params(self, ctx: Context) -> list[Parameter]:
        params = super().get_params(ctx)
        _restyle(params)
        return params

    def collect_usage_pieces(self, ctx: Context) -> list[str]:
        _restyle(self.get_params(ctx))
        return super().collect_usage_pieces(ctx)


class FreightGroup(TyperGroup):
    def get_params(self, ctx: Context) -> list[Parameter]:
        params = super().get_params(ctx)
        _restyle(params)
        return params

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Run the command line; command-line mistakes print as one `error:` line, exit 2.
        With standalone_mode=False (a caller that handles errors itself) nothing changes."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click_exceptions.NoArgsIsHelpError as exc:  # `freight` alone: the help, as typer shows it
            exc.show()
            sys.exit(exc.exit_code)
        except click_exceptions.UsageError as exc:
            hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
            fail(_sentence(exc.format_message()) + hint)
            sys.exit(EXIT_USER_ERROR)
        except click_exceptions.ClickException as exc:
            fail(_sentence(exc.format_message()))
            sys.exit(exc.exit_code)
        except typer.Abort:
            fail("aborted", code=1)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def _sentence(message: str) -> str:
    """Click's message on one line, starting lower-case like freight's own."""
    line = " ".join(message.split()).replace("Value error, ", "")
    return line[:1].lower() + line[1:]


def restyle_commands(app: typer.Typer) -> None:
    """Give `app`'s commands (and its sub-apps' commands) the freight look, unless one chose a class."""
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):  # typer's default
            info.cls = FreightCommand
    for group in app.registered_groups:
        sub = group.typer_instance
        if sub is not None:
            sub.info.cls = FreightGroup
            restyle_commands(sub)
