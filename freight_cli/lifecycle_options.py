"""The lifecycle flags of `freight run` and `freight submit`: completion window / deadline, notify.

Kept apart from job_options (the spec's flags): these do not change the job, only its submission.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

import typer

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
DeadlineOpt = Annotated[
    str | None,
    typer.Option(
        "--deadline",
        metavar="WHEN",
        help="like --completion-window, as a time to end by: an ISO-8601 time (2025-06-01T18:00, local "
        "unless it has an offset) or a duration from now (2h, 30m, 1h30m, 1d); on a fleet the autoscaler "
        "sizes the fleet to meet it",
    ),
]

_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def parse_deadline(text: str, now: float) -> float:
    """`--deadline` as unix seconds: a duration from `now` (1d, 2h, 30m, 90s, or a run like 1h30m)
    or an ISO-8601 time. ValueError, with one line for the user, when it is neither or not in the
    future."""
    value = text.strip()
    duration = _DURATION.fullmatch(value.lower())
    if value and duration:
        days, hours, minutes, seconds = (int(g or 0) for g in duration.groups())
        deadline = now + days * 86400 + hours * 3600 + minutes * 60 + seconds
    else:
        try:
            deadline = datetime.fromisoformat(value).timestamp()
        except ValueError:
            raise ValueError(
                f"--deadline {text!r} is neither an ISO-8601 time (2025-06-01T18:00+00:00) nor a "
                "duration (2h, 30m, 1h30m)"
            ) from None
    if deadline <= now:
        raise ValueError(f"--deadline {text!r} is not in the future")
    return deadline


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
