"""The `freight` command. Each module in this package registers one group of commands.

Commands that run work in process import worker/ lazily, inside the command body.
"""

from __future__ import annotations

import typer
from pydantic import ValidationError

from jobs.cli import autoscale, estimate, evals, fleet, jobs_list, quantize, run
from jobs.cli.common import fail
from jobs.cli.style import FreightGroup, restyle_commands
from jobs.log import configure_logging
from jobs.settings import get_settings, settings_error

app = typer.Typer(
    name="freight",
    cls=FreightGroup,
    help="Bulk LLM inference: Parquet in, results and a per-job cost report out.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _setup() -> None:
    try:
        settings = get_settings()
    except ValidationError as exc:
        raise fail(settings_error(exc)) from None
    configure_logging(settings.log_format, settings.log_level)


for _module in (run, fleet, jobs_list, estimate, quantize, evals, autoscale):
    _module.register(app)
restyle_commands(app)  # capital metavars, no <bool>, one-line errors (jobs/cli/style.py)


def main() -> None:
    app()
