"""Every `freight` command's --help and error style, walked over the whole command tree.

Each argument and option is described; values show as capital metavars (INPUT, --model MODEL) or as
their choices, flags as nothing (no <bool>); --instance-type lists the shipped choices, --prices says
its format; a command-line mistake is one `error:` line naming the flag, exit 2, like freight's own.
"""

from __future__ import annotations

import re

import pytest
import typer.main
from typer._click.core import Context
from typer.testing import CliRunner

from freight_cli import app

ROOT = typer.main.get_command(app)


def _walk(command: object, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], object]]:
    found = [(path, command)]
    for name, sub in getattr(command, "commands", {}).items():
        found.extend(_walk(sub, (*path, name)))
    return found


COMMANDS = _walk(ROOT)
TYPE_PLACEHOLDER = re.compile(r"<(str|int|float|bool|path|text)>|\{[a-z_]+\}")


def _help(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_the_walk_finds_every_command() -> None:
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"run", "submit", "status", "cost", "results", "demo-model", "worker", "wait", "cancel",
            "quantize", "autoscale", "beat", "eval run", "eval report"} <= names  # fmt: skip


@pytest.mark.parametrize("path", [path for path, _ in COMMANDS], ids=lambda p: " ".join(p) or "freight")
def test_help_describes_every_parameter_in_capitals(path: tuple[str, ...]) -> None:
    command = dict(COMMANDS)[path]
    ctx = Context(command, info_name=" ".join(("freight", *path)))
    for param in command.get_params(ctx):
        what = f"{' '.join(path)} {param.opts or param.name}"
        assert (param.help or "").strip(), f"{what} has no help"
        if param.param_type_name == "argument":
            assert param.metavar and param.metavar == param.metavar.upper(), what
            continue
        shown = param.display_type_rich(ctx)
        if param.is_flag:
            assert shown is None, f"{what} is a flag but shows {shown!r}"
        else:
            assert shown and (shown == shown.upper() or "|" in shown), f"{what} shows {shown!r}"
    text = _help(path)
    assert not TYPE_PLACEHOLDER.search(text), f"freight {' '.join(path)} --help:\n{text}"
    usage = next(line for line in text.splitlines() if "Usage:" in line)
    assert "{" not in usage and not re.search(r"\s[a-z_]+(\s|$)", usage.split("[OPTIONS]")[-1]), usage


@pytest.mark.parametrize("command", ["run", "submit"])
def test_pricing_options_say_their_choices_and_format(command: str) -> None:
    text = " ".join(_help((command,)).split())
    for key in ("cpu-local", "g5.xlarge", "p5.48xlarge"):
        assert key in text, key
    assert "on-demand|spot" in text and "int8|int4" in text
    prices = text[text.index("--prices") :]
    assert "TOML" in prices and "on_demand = " in prices and "USD per hour" in prices


@pytest.mark.parametrize("path", [p for p, c in COMMANDS if not hasattr(c, "commands")], ids=" ".join)
def test_a_command_line_mistake_is_one_error_line(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--no-such-flag"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: no such option: --no-such-flag"), result.output
    assert "╭" not in result.output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", "in.parquet", "--model", "m", "--output", "o", "--max-tokens", "many"], "'--max-tokens'"),
        (["run", "in.parquet", "--model", "m", "--output", "o", "--market", "cheap"], "'cheap' is not one of"),
        (["run", "in.parquet", "--model", "m"], "missing option '--output'"),
        (["autoscale", "--once", "--loop"], "give exactly one of --once or --loop"),
        (["demo-model", "d", "--arch", "gpt2"], "'gpt2' is not one of 'llama', 'qwen2', 'qwen3'"),
    ],
)
def test_errors_name_the_flag_in_one_style(args: list[str], expected: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.output
