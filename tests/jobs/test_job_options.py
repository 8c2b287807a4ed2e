"""The job options come from one table (jobs/job_options.py): `run`, `submit` and `estimate` take the
same flags with the same defaults and help, the table's defaults are the JobSpec's, eval suites name
their keys after it and describe them with its help, and the CLI's command modules share helpers
only through modules of their own (never one command module importing another)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import typer.main

from freight_cli import app
from freight_cli.job_options import spec_from_options
from jobs.evals.suite import Sampling, SuiteError
from jobs.evals.suite_loader import parse_suite_text
from jobs.job_options import CACHE_OPTIONS, JOB_OPTIONS, REQUIRED, job_option
from jobs.spec import JobSpec

CLI = Path(__file__).resolve().parents[2] / "freight_cli"
COMMANDS = typer.main.get_command(app).commands  # type: ignore[attr-defined]


def _command_modules() -> set[str]:
    """The modules that register commands (freight_cli/__init__.py adds each one's `register`)."""
    return {
        path.stem
        for path in CLI.glob("*.py")
        if any(isinstance(n, ast.FunctionDef) and n.name == "register" for n in ast.parse(path.read_text()).body)
    }


def _cli_imports(path: Path) -> set[str]:
    """freight_cli modules `path` imports anywhere in its body (lazy imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "freight_cli":
                found.update(alias.name for alias in node.names)
            elif node.module.startswith("freight_cli."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("freight_cli."))
    return found


def test_command_modules_import_nothing_from_one_another() -> None:
    commands = _command_modules()
    assert {"run", "fleet", "estimate", "evals", "serve", "keys"} <= commands
    crossings = [
        f"freight_cli/{name}.py -> freight_cli.{other}"
        for name in sorted(commands)
        for other in sorted(_cli_imports(CLI / f"{name}.py") & commands)
        if other != name
    ]
    assert crossings == []


def _option_rows(command: str) -> dict[str, tuple[object, ...]]:
    """Each job option of `command` as click sees it: flags, default, required, help, metavar, type."""
    params = {p.name: p for p in COMMANDS[command].params}
    return {
        o.name: (tuple(p.opts), p.default, p.required, p.help, p.metavar, repr(p.bare_type), p.multiple)
        for o in JOB_OPTIONS
        if (p := params.get(o.name)) is not None
    }


def test_run_submit_and_estimate_take_the_same_job_options() -> None:
    run, submit, estimate = (_option_rows(c) for c in ("run", "submit", "estimate"))
    assert list(run) == [o.name for o in JOB_OPTIONS]  # every option, in the table's order
    assert submit == run
    assert estimate == {name: row for name, row in run.items() if name != "output"}  # it writes nothing
    for option in JOB_OPTIONS:
        _flags, default, required, help_text, *_ = run[option.name]
        assert help_text == option.help and required == (option.default is REQUIRED)
        assert option.default is REQUIRED or default == option.default
        assert option.argument or _flags == (option.flag,)


def test_a_command_takes_the_job_options_before_its_own() -> None:
    names = [p.name for p in COMMANDS["submit"].params]
    assert names[: len(JOB_OPTIONS)] == [o.name for o in JOB_OPTIONS]
    assert {"priority", "deadline", "as_json", "completion_window", "notify", "max_cost"} == set(
        names[len(JOB_OPTIONS) :]
    )
    profile = {p.name: p for p in COMMANDS["profile"].params}
    for name in ("instance_type", "price_per_hour", "quantization"):
        assert profile[name].help == job_option(name).help and profile[name].default == job_option(name).default


def test_the_tables_defaults_are_the_job_specs() -> None:
    given = {"input": "in.parquet", "model": "/m", "output": "/out"}
    defaults = {o.name: o.default for o in JOB_OPTIONS
                if o.default is not REQUIRED and o.name not in ("prices", *CACHE_OPTIONS)}  # fmt: skip
    assert spec_from_options(**given, **defaults) == JobSpec(**{k: str(Path(v).absolute()) for k, v in given.items()})


def test_suite_keys_are_job_options_described_by_their_help() -> None:
    from jobs.evals.suite_loader import _SuiteFields

    described = {
        name: info.description
        for fields in (Sampling.model_fields, _SuiteFields.model_fields)
        for name, info in fields.items()
        if name in {o.name for o in JOB_OPTIONS}
        # a suite writes these inline (a table, a list), not as a file or comma-separated text; its
        # chat messages have their own key, messages_column
        and name not in ("json_schema", "choice", "prompt_column")
    }
    assert {"max_tokens", "temperature", "top_p", "seed", "shard_rows", "speculative"} <= set(described)
    assert described == {name: job_option(name).help for name in described}


def test_a_bad_suite_value_says_what_the_key_means(tmp_path: Path) -> None:
    text = (
        '[[suite]]\nname = "s"\ndataset = "d.parquet"\nmodels = ["m"]\n'
        'sampling = { top_p = 2.0 }\n[[suite.metrics]]\ntype = "exact_match"\n'
    )
    with pytest.raises(SuiteError) as caught:
        parse_suite_text(text, tmp_path / "suites.toml", None)
    assert f"sampling.top_p: Input should be less than or equal to 1 (top_p: {job_option('top_p').help})" in str(
        caught.value
    )
