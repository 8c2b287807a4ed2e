"""Eval jobs on the fleet: queue a JobSpec the way `freight submit` does.

Never imports worker/ or torch: shards are sent by task name through jobs.client.
"""

from __future__ import annotations

from jobs.planner import prepare_job
from jobs.settings import Settings
from jobs.spec import JobSpec
from jobs.submission import submit_job

PRIORITY = 5  # nightly evals yield to interactive jobs submitted at the default 0


def submit_spec(spec: JobSpec, settings: Settings, priority: int = PRIORITY) -> str:
    """Write the job's manifest and queue its uncommitted shards; returns the job id.

    Submitting again re-queues only what is not committed (as `freight submit` does)."""
    return submit_job(prepare_job(spec, settings), settings, priority=priority, retry_for_s=60.0).job_id
