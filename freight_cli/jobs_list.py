"""`freight jobs`: the jobs on this Redis, or under a storage prefix (embedded runs), newest first."""

from __future__ import annotations

import json
import sys
from datetime import datetime

import typer
from rich.console import Console
from rich.table import Table

from freight_cli.common import fail
from jobs.errors import FreightError
from jobs.settings import get_settings


def jobs(
    prefix: str | None = typer.Option(
        None, metavar="PREFIX", help="list the jobs whose OUT lies under this folder or s3:// prefix "
        "(embedded runs) instead of the ones Redis knows"
    ),
    state: list[str] = typer.Option(
        [], "--state", metavar="STATE", help="only jobs in this state (queued, running, finalizing, "
        "incomplete, succeeded, failed, cancelled, expired); repeatable"
    ),
    as_json: bool = typer.Option(False, "--json", help="one JSON array of objects"),
) -> None:
    """Jobs newest first: id, state, progress, rows, failures, cost so far, submitted, model."""
    from jobs.job_list import JOB_LIST_STATES, list_jobs

    bad = [s for s in state if s not in JOB_LIST_STATES]
    if bad:
        raise fail(f"--state {bad[0]!r}: give one of {', '.join(JOB_LIST_STATES)}")
    try:
        rows = list_jobs(get_settings(), prefix, tuple(state))
    except (FreightError, ValueError) as exc:
        raise fail(str(exc)) from None
    if as_json:
        sys.stdout.write(json.dumps([r.as_dict() for r in rows], indent=1) + "\n")
        return
    table = Table(title_justify="left")
    for name, justify in (("job", "left"), ("state", "left"), ("progress", "right"), ("rows", "right"),
                          ("failed", "right"), ("cost", "right"), ("submitted", "left"), ("model", "left")):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        submitted = datetime.fromtimestamp(r.submitted_at).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(r.job_id, r.state, f"{r.shards_committed}/{r.shards_total} ({r.progress:.0%})",
                      f"{r.rows_done:,}/{r.rows_total:,}", f"{r.rows_failed:,}", f"${r.cost_usd:.6f}",
                      submitted, r.model.rstrip("/").split("/")[-1])  # fmt: skip
    Console(highlight=False).print(table)
    if not rows:
        Console(stderr=True).print("no jobs" + (f" under {prefix}" if prefix else " on this Redis"))


def register(app: typer.Typer) -> None:
    """Add this module's commands to `app`."""
    app.command("jobs")(jobs)
