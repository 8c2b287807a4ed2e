"""Suites with a cron string -> Celery beat schedule entries (the cron parsing: jobs/evals/cron.py).

Every suite with a `schedule` gets one entry that submits it (all its models) on that cron, in
UTC. One more entry, every COLLECT_SECONDS, scores the scheduled runs whose jobs have finished.
The entries name local handlers (see jobs/evals/beat.py); nothing is sent to the workers for them:
the jobs themselves go through jobs.client by task name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobs.evals.cron import to_crontab

if TYPE_CHECKING:
    from jobs.evals.suite import SuiteFile

SUBMIT_TASK = "freight.eval.submit_suite"
COLLECT_TASK = "freight.eval.collect"
COLLECT_SECONDS = 60.0


def entry_name(suite_name: str) -> str:
    return f"freight-eval:{suite_name}"


def build_schedule(suite_file: SuiteFile) -> dict[str, dict[str, Any]]:
    """Celery `beat_schedule` for a suite file: one entry per scheduled suite plus the collector.
    Arguments are plain JSON (the suite file's path and the suite name)."""
    entries: dict[str, dict[str, Any]] = {}
    for suite in suite_file.suites:
        if suite.schedule is None:
            continue
        entries[entry_name(suite.name)] = {
            "task": SUBMIT_TASK,
            "schedule": to_crontab(suite.schedule),
            "args": [str(suite_file.path), suite.name],
        }
    if entries:
        entries["freight-eval:collect"] = {
            "task": COLLECT_TASK,
            "schedule": COLLECT_SECONDS,
            "args": [str(suite_file.path)],
        }
    return entries
