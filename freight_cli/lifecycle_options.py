"""The lifecycle flags of `freight run` and `freight submit`: completion window / deadline, notify.

Kept apart from job_options (the spec's flags): these do not change the job, only its submission.
"""

from __future__ import annotations

from typing import Annotated

import typer

from freight_cli.job_options import parse_deadline
from jobs.errors import FreightError
from jobs.lifecycle import MIN_WINDOW_S, Lifecycle, check_notify_target, parse_window
from jobs.notify_targets import submit_targets
from jobs.settings import get_settings

CompletionWindowOpt = Annotated[
    str | None,
    typer.Option(
        metavar="DURATION",
        help="the job must end within this long from now (24h, 30m, 1h30m, 2d; 1m at least): past "
        "it, it stops at the next engine step, keeps and bills its committed rows, and ends 'expired'",
    ),
]
NotifyOpt = Annotated[
    list[str] | None,
    typer.Option(
        metavar="TARGET",
        help="tell TARGET when the job ends (succeeded, failed, cancelled, expired): an http(s):// "
        "webhook (JSON POST, signed with FREIGHT_WEBHOOK_SECRET) or sns:<topic ARN>; repeatable",
    ),
]
RunDeadlineOpt = Annotated[
    str | None,
    typer.Option(
        "--deadline",
        metavar="WHEN",
        help="like --completion-window, as an ISO-8601 time (2025-06-01T18:00+00:00) or a duration",
    ),
]


def lifecycle_from_options(
    completion_window: str | None, deadline: str | None, notify: list[str] | None, now: float
) -> Lifecycle:
    """The lifecycle flags as a Lifecycle; FreightError with one line when one is bad (nothing written)."""
    if completion_window is not None and deadline is not None:
        raise FreightError("give --completion-window or --deadline, not both")
    try:
        due = None
        if completion_window is not None:
            due = now + parse_window(completion_window)
        elif deadline is not None:
            due = parse_deadline(deadline, now)
            if due - now < MIN_WINDOW_S:
                raise ValueError(f"--deadline {deadline!r} is under a minute away: give a later time")
        for target in notify or ():
            check_notify_target(target)
        targets = submit_targets(notify or (), get_settings())
    except ValueError as exc:
        raise FreightError(str(exc)) from None
    return Lifecycle(deadline=due, notify=targets, submitted_at=now)
