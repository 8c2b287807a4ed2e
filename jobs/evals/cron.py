"""Cron strings of suites: parsed and checked once, turned into Celery crontabs (UTC).

Both the suite loader (validation at load) and the beat schedule read this module, so neither
imports the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from croniter import croniter

if TYPE_CHECKING:
    from celery.schedules import crontab

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_HELP = "write five fields 'minute hour day-of-month month day-of-week' in UTC, e.g. '0 2 * * *' for 02:00 every day"


def cron_fields(expression: str) -> list[str]:
    """The five fields of a cron string (aliases such as @daily expanded); ValueError if invalid."""
    text = _ALIASES.get(expression.strip().lower(), expression.strip())
    fields = text.split()
    if len(fields) != 5:
        raise ValueError(f"schedule {expression!r} has {len(fields)} field(s): {_HELP}")
    if not croniter.is_valid(text):
        raise ValueError(f"schedule {expression!r} is not a valid cron expression: {_HELP}")
    return fields


def validate_cron(expression: str) -> None:
    """Raise ValueError with what to write when `expression` is not a schedule beat can run."""
    to_crontab(expression)


def to_crontab(expression: str) -> crontab:
    """The Celery crontab of a cron string (UTC: the app's timezone)."""
    from celery.schedules import crontab

    minute, hour, day_of_month, month, day_of_week = cron_fields(expression)
    try:
        return crontab(
            minute=minute, hour=hour, day_of_month=day_of_month, month_of_year=month, day_of_week=day_of_week
        )
    except ValueError as exc:
        raise ValueError(
            f"schedule {expression!r} is not a cron expression Celery accepts ({exc}): {_HELP}"
        ) from exc
