"""The `freight` command: the composition root, the one part that joins the control plane (jobs/)
to the data plane (worker/). Each module in this package registers one group of commands.

Commands that run work in process import worker/ inside the command body, so `freight submit`,
`status` and `--help` load no torch (tests/jobs/test_import_graph.py). Nothing else imports this
package.
"""

from __future__ import annotations

import typer
from pydantic import ValidationError

from freight_cli import (
    autoscale,
    cache,
    dashboard,
    estimate,
    evals,
    fleet,
    jobs_list,
    keys,
    quantize,
    run,
    serve,
)
from freight_cli.common import fail
from freight_cli.style import FreightGroup, restyle_commands
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


for _module in (run, fleet, jobs_list, estimate, quantize, evals, autoscale, serve, dashboard, keys, cache):
    _module.register(app)
restyle_commands(app)  # capital metavars, no <bool>, one-line errors (freight_cli/style.py)


def main() -> None:
    app()
