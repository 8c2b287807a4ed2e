"""Job state derived from storage alone (the distributed mode adds live progress from Redis)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from jobs.expiry import EXPIRED_KEY
from jobs.finalize import committed_shards, load_attempt_records, load_shard_record
from jobs.manifest import COST_KEY, SUCCESS_KEY, Manifest, read_manifest
from jobs.markers import FAILURES_KEY, failed_shards, is_cancelled
from jobs.storage import ObjectStore


@dataclass(frozen=True)
class JobStatus:
    """state, from storage markers in the precedence jobs.fleet_status uses, so `freight status` and its
    fleet line agree: "complete" (_SUCCESS), "failed" (failures.json and every shard ended),
    "expired" (_EXPIRED), "cancelled" (_CANCELLED), "finalizing" (all shards in), "incomplete"."""

    job_id: str
    state: str
    shards_total: int
    shards_committed: int
    rows_total: int
    rows_done: int
    rows_failed: int
    interrupted_attempts: int
    output: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def job_status(store: ObjectStore, manifest: Manifest | None = None) -> JobStatus:
    manifest = manifest or read_manifest(store)
    done = committed_shards(store)
    records = [load_shard_record(store, i) for i in sorted(done)]
    if store.exists(SUCCESS_KEY):
        state = "complete"
    elif store.exists(FAILURES_KEY) and len(done | failed_shards(store)) >= len(manifest.shards):
        state = "failed"
    elif store.exists(EXPIRED_KEY):
        state = "expired"
    elif is_cancelled(store):
        state = "cancelled"
    elif len(done) >= len(manifest.shards):
        state = "finalizing"
    else:
        state = "incomplete"
    return JobStatus(
        job_id=manifest.job_id,
        state=state,
        shards_total=len(manifest.shards),
        shards_committed=len(done),
        rows_total=manifest.input.rows,
        rows_done=sum(r.rows for r in records),
        rows_failed=sum(r.rows_failed for r in records),
        interrupted_attempts=len(load_attempt_records(store)),
        output=store.url,
    )


def finished_state(store: ObjectStore, manifest: Manifest | None = None) -> str | None:
    """The end state, "succeeded" or "failed", of a job that ended for good (storage markers, read as
    job_status reads them), else None. A cancelled job has not: a resubmit revives it."""
    if store.exists(SUCCESS_KEY):
        return "succeeded"
    if not store.exists(FAILURES_KEY):
        return None
    total = len((manifest or read_manifest(store)).shards)
    return "failed" if len(committed_shards(store) | failed_shards(store)) >= total else None


def read_cost(store: ObjectStore) -> dict[str, Any] | None:
    """cost.json when the job is finalized, else None."""
    return json.loads(store.get(COST_KEY)) if store.exists(COST_KEY) else None
