"""`freight wait`'s view of one job: its status, and Redis checked against storage while it waits.

Every FREIGHT_WAIT_RECONCILE_S (10 s) the watch runs the reconciler on its job (jobs/reconcile.py: shards with no
message and no live attempt are queued again), so a job whose queue Redis lost finishes while the
user waits, with or without workers' own checks. A job Redis knows nothing about (never submitted
to the fleet, or its state lost with Redis's data) is never polled forever: with every shard
committed the watch finalizes it itself (finalize is idempotent); otherwise it raises
`JobUnknownError` saying how to queue the rest.
"""

from __future__ import annotations

import time

import redis

from jobs.errors import FreightError
from jobs.finalize import committed_shards, finalize
from jobs.fleet_status import FleetStatus, fleet_status
from jobs.live_state import LiveState
from jobs.log import get_logger
from jobs.manifest import Manifest, read_manifest
from jobs.progress import job_key
from jobs.settings import Settings
from jobs.storage import ObjectStore

log = get_logger(__name__)

UNKNOWN_CONFIRM_S = 2.0  # Redis must not know the job on two checks this far apart


class JobUnknownError(FreightError):
    """Redis has no state for an unfinished job."""


class JobWatch:
    def __init__(self, store: ObjectStore, live: LiveState, settings: Settings) -> None:
        self.store = store
        self.live = live
        self.settings = settings
        self.manifest: Manifest = read_manifest(store)
        self._next_reconcile = time.monotonic() + settings.wait_reconcile_s
        self._unknown_since: float | None = None

    def check(self) -> FleetStatus:
        """The job's status now; may re-queue lost shards, finalize, or raise JobUnknownError."""
        st = fleet_status(self.store, self.live, self.manifest)
        if st.done:
            return st
        try:
            known = bool(self.live.client.exists(job_key(st.job_id)))
        except redis.RedisError:
            return st  # Redis away: Celery and the workers wait for it, so does this
        if not known:
            return self._unknown(st)
        self._unknown_since = None
        if time.monotonic() >= self._next_reconcile:
            self._next_reconcile = time.monotonic() + self.settings.wait_reconcile_s
            self._reconcile(st.job_id)
            if self._expire_if_over(st):
                return fleet_status(self.store, self.live, self.manifest)
        return st

    def _expire_if_over(self, st: FleetStatus) -> bool:
        """Past its deadline with nothing queued or running, but not marked expired (the worker whose
        shard ended last could not write it): expire it here. True if it did."""
        from jobs.expiry import expire_job
        from jobs.lifecycle import read_lifecycle

        if st.shards_running or not read_lifecycle(self.store).past_due():
            return False
        states = self.live.shard_states(st.job_id)
        if any(s in ("queued", "running") for s in states.values()):
            return False
        report = expire_job(self.store, self.manifest, self.settings)
        self.live.set_job_state(st.job_id, "expired" if report is not None else "succeeded")
        return True

    def _reconcile(self, job_id: str) -> None:
        from jobs.client import FleetClient
        from jobs.reconcile import Reconciler

        client = FleetClient(self.settings, retry_for_s=5.0)
        try:
            Reconciler(client, self.settings).run(job_ids=[job_id])
        except (redis.RedisError, FreightError, OSError) as exc:  # the next check tries again
            log.warning("wait_reconcile_failed", job_id=job_id, error=str(exc))
        finally:
            client.close()

    def _unknown(self, st: FleetStatus) -> FleetStatus:
        now = time.monotonic()
        if self._unknown_since is None:
            self._unknown_since = now
            return st
        if now - self._unknown_since < UNKNOWN_CONFIRM_S:
            return st
        committed = committed_shards(self.store)
        total = len(self.manifest.shards)
        if len(committed) == total:
            log.warning("wait_finalizing_unknown_job", job_id=st.job_id)
            finalize(self.store, self.manifest)
            return fleet_status(self.store, self.live, self.manifest)
        raise JobUnknownError(
            f"Redis has no state for job {st.job_id} ({len(committed)} of {total} shards committed in "
            f"{self.store.url}): it was never submitted to the fleet, or Redis lost its data; "
            "`freight submit` it again with the same options to queue the rest"
        )
