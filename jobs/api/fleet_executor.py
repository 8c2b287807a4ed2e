"""FleetExecutor: a batch's job runs on the fleet (`freight serve --redis`): its shards are queued
by task name (jobs/submission.py) and the fleet's workers and autoscaler run them; the batch
process only reads how it ends, from storage (the truth) and Redis (which shards run).

The fleet expires a job past its deadline itself (jobs/expiry.py); should no worker be there to see
it, the batch process expires it `EXPIRE_GRACE_S` later. A cancelled job ends once Redis says none
of its shards runs (their finished rows saved as partial rows), or `CANCEL_GRACE_S` after the cancel.
"""

from __future__ import annotations

import time

from jobs.api.executor import BatchJob, Outcome
from jobs.expiry import expire_job
from jobs.finalize import committed_shards, load_shard_record
from jobs.fleet_status import fleet_status
from jobs.lifecycle import Lifecycle
from jobs.live_state import LiveState
from jobs.planner import PreparedJob
from jobs.settings import Settings
from jobs.submission import submit_job

EXPIRE_GRACE_S = 120.0
CANCEL_GRACE_S = 60.0


class FleetExecutor:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.live = LiveState(settings.redis_url, socket_timeout=5.0, retry_for_s=5.0)
        self._cancelled: dict[str, float] = {}  # batch id -> when its cancel was passed on
        self._counted: dict[str, dict[int, tuple[int, int]]] = {}  # batch id -> shard -> (rows, failed)

    def start(self, job: BatchJob, *, resumed: bool) -> None:
        if resumed:
            return  # queued by an earlier batch process; the fleet's reconcile requeues lost shards
        submit_job(PreparedJob(job.store, job.manifest, resumed=False), self.settings, deadline=job.deadline,
                   lifecycle=Lifecycle(deadline=job.deadline), retry_for_s=self.settings.submit_redis_retry_s)  # fmt: skip

    def outcome(self, job: BatchJob) -> Outcome | None:
        st = fleet_status(job.store, self.live, job.manifest)
        if st.state == "succeeded":
            return Outcome("succeeded")
        if st.state == "failed":
            reasons = "; ".join(f"shard {f['shard']}: {f.get('reason')}" for f in st.failures[:5])
            return Outcome("failed", f"{len(st.failures)} shard(s) failed on every attempt ({reasons})")
        if st.state == "expired":
            return Outcome("expired")
        if st.state == "cancelled":
            since = self._cancelled.setdefault(job.batch_id, time.time())
            if st.shards_running == 0 or time.time() - since > CANCEL_GRACE_S:
                return Outcome("cancelled")
            return None
        if time.time() > job.deadline + EXPIRE_GRACE_S and st.state != "finalizing":
            self.live.request_cancel(job.manifest.job_id)  # running shards stop; the job expires now
            expire_job(job.store, job.manifest, self.settings)
            return Outcome("expired")
        return None

    def withdraw(self, job: BatchJob) -> bool:
        return False  # queued shards are the fleet's: a cancel or the deadline stops them

    def cancel(self, job: BatchJob) -> None:
        if job.batch_id not in self._cancelled:
            self.live.request_cancel(job.manifest.job_id)
            self._cancelled[job.batch_id] = time.time()

    def progress(self, job: BatchJob) -> tuple[int, int] | None:
        """From the committed shards' records, each read once."""
        counted = self._counted.setdefault(job.batch_id, {})
        for index in committed_shards(job.store) - counted.keys():
            record = load_shard_record(job.store, index)
            counted[index] = (record.rows, record.rows_failed)
        failed = sum(f for _, f in counted.values())
        return sum(r for r, _ in counted.values()) - failed, failed

    def close(self) -> None:
        self.live.close()
