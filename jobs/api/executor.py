"""Executor: what runs a batch's planned job, for the batch process (jobs/api/batch_process.py).

Two exist: the embedded one (the `freight serve` command builds it: the embedded runner, one job at
a time, in the batch process) and FleetExecutor (jobs/api/fleet_executor.py: the job's shards go to
the fleet's queue). The batch process calls them from one thread.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import Protocol

from jobs.manifest import Manifest
from jobs.storage import ObjectStore

# how a job ended: the run's own words; "interrupted" means the batch process is stopping (the job
# resumes at the next start), every other kind ends the batch (jobs/api/batch_export.py)
ENDINGS = ("succeeded", "cancelled", "expired", "failed", "interrupted")


@dataclass(frozen=True)
class BatchJob:
    """A planned batch job: the batch (`tenant`, `batch_id`), its job's store and manifest, its deadline."""

    tenant: str
    batch_id: str
    store: ObjectStore  # the job's OUT
    manifest: Manifest
    deadline: float  # unix seconds: the batch's expires_at
    cancel_key: str  # the key of the job's _CANCELLED marker in the serve store


@dataclass(frozen=True)
class Outcome:
    """A job's end: `kind` (ENDINGS) and, for "failed", why."""

    kind: str
    message: str | None = None


class Executor(Protocol):
    def start(self, job: BatchJob, *, resumed: bool) -> None:
        """Run `job` (queued behind earlier ones). `resumed`: a job a previous batch process had taken up
        (the fleet keeps running those itself)."""

    def outcome(self, job: BatchJob) -> Outcome | None:
        """The job's end once it has one (reported once), else None."""

    def withdraw(self, job: BatchJob) -> bool:
        """Take back a job that has not begun running; False when it runs (or ran) already."""

    def cancel(self, job: BatchJob) -> None:
        """The batch's cancel marker is written: stop the job's running work soon."""

    def progress(self, job: BatchJob) -> tuple[int, int] | None:
        """(requests completed, requests failed) so far, or None when unknown."""

    def close(self) -> None:
        """Stop running; unfinished jobs resume at the next start."""


# A run of a job in a batch process leaves `OUT/serve-runs/<token>` while it runs and deletes it when
# it ends by itself (done, stopped, failed); a process that dies mid-run (killed, out of memory)
# leaves it. A job that has left MAX_UNCLEAN_RUNS is not run again: its batch fails, rather than
# take the batch process down for good.
RUNS_PREFIX = "serve-runs/"
MAX_UNCLEAN_RUNS = 3


def begin_run(job: BatchJob) -> str:
    """Mark a run of `job` as begun; returns the marker's key (for `end_run`)."""
    key = f"{RUNS_PREFIX}{uuid.uuid4().hex}"
    job.store.put(key, json.dumps({"pid": os.getpid(), "at": time.time()}).encode())
    return key


def end_run(job: BatchJob, key: str) -> None:
    job.store.delete(key)


def unclean_runs(job: BatchJob) -> int:
    """Runs of `job` whose process died before they ended (markers left behind)."""
    return len(job.store.list(RUNS_PREFIX))
