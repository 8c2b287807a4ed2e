"""JobBoard: every job under the store, as the jobs page lists it, rebuilt at most once a `refresh_s`.

One snapshot serves every client: fifty browsers polling each second cost the store what one does
(bench/dashboard_load.py), and a rebuild runs on a thread of its own while requests get the
snapshot before it. A job's line holds what `freight jobs` shows (state in its vocabulary,
shards and rows done, cost so far) plus rows/s, ETA, errors and, for a served batch, its tenant,
batch id and status. Storage decides; Redis, when given, adds the live state of fleet jobs.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

import redis

from jobs.api.batches import BatchRecord
from jobs.api.layout import batch_record, job_prefix, sub_store
from jobs.dashboard.job_reader import JobReader, JobTotals
from jobs.dashboard.objects import ObjectCache
from jobs.dashboard.scan import OutKeys, StoreIndex, StoreListing, tenant_of
from jobs.errors import FreightError, ObjectNotFoundError
from jobs.expiry import EXPIRED_KEY
from jobs.live_state import LiveState
from jobs.log import get_logger
from jobs.manifest import SUCCESS_KEY, Manifest
from jobs.markers import CANCEL_KEY, FAILURES_KEY
from jobs.progress import FINISHED_JOB_STATES
from jobs.settings import Settings
from jobs.storage import ObjectStore

log = get_logger(__name__)

# a served batch's status -> the job list's state word, before its job is planned
_BATCH_STATE = {"validating": "validating", "failed": "failed", "expired": "expired", "cancelled": "cancelled",
                "cancelling": "cancelled", "in_progress": "running", "finalizing": "finalizing",
                "completed": "succeeded"}  # fmt: skip
STATES = ("validating", "queued", "running", "finalizing", "incomplete", "succeeded", "failed", "cancelled",
          "expired")  # fmt: skip
LOCAL_TENANT = "-"  # the tenant filter's value for jobs outside tenants/ (`freight run`, `submit` OUTs); no tenant's name


@dataclass(frozen=True)
class JobSummary:
    """One line of the jobs page. `ref` names the job in the dashboard's URLs: the batch id of a
    served batch, else the job id. `cost_usd`: cost.json's once finalized, else so far."""

    ref: str
    job_id: str | None  # None: a batch not planned yet
    out: str  # the OUT's key under the store ("" when the store itself is the OUT)
    tenant: str | None
    batch_id: str | None
    batch_status: str | None
    state: str
    model: str
    kind: str  # generate | embed | likelihood; a served batch: its endpoint (/v1/chat/completions, ...)
    shards_total: int
    shards_committed: int
    shards_failed: int
    shards_running: int
    rows_total: int
    rows_done: int
    rows_failed: int
    rows_per_second: float | None
    eta_seconds: float | None
    cost_usd: float
    submitted_at: float
    mode: str  # "fleet" (Redis knows it), "embedded" or "batch"

    @property
    def progress(self) -> float:
        """Rows done of the job's rows (a succeeded job with no rows is done)."""
        if self.rows_total:
            return min(self.rows_done / self.rows_total, 1.0)
        return 1.0 if self.state == "succeeded" else 0.0

    @property
    def done(self) -> bool:
        return self.state in FINISHED_JOB_STATES

    @property
    def errors(self) -> int:
        return self.rows_failed + self.shards_failed

    def as_dict(self) -> dict[str, Any]:
        """The line as /ui/jobs.json gives it (built once per line: a line never changes)."""
        return self._dict

    @cached_property
    def _dict(self) -> dict[str, Any]:
        return {**asdict(self), "progress": round(self.progress, 4), "errors": self.errors}


@dataclass(frozen=True)
class Snapshot:
    jobs: tuple[JobSummary, ...]  # newest first
    listing: StoreListing
    at: float

    def visible(self, tenant: str | None) -> list[JobSummary]:
        """The jobs `tenant` may see: its own; None (no API keys: one local user) sees every job."""
        return list(self.jobs) if tenant is None else [j for j in self.jobs if j.tenant == tenant]

    def find(self, ref: str, tenant: str | None) -> JobSummary | None:
        """The job `ref` names, when `tenant` may see it (another tenant's job is as absent as none)."""
        return next((j for j in self.visible(tenant) if j.ref == ref), None)


class JobBoard:
    """The jobs under one store (and, given, the Redis of its fleet); thread-safe."""

    def __init__(
        self,
        store: ObjectStore,
        settings: Settings,
        live: LiveState | None = None,
        *,
        refresh_s: float = 1.0,
        scan_s: float = 5.0,
        cache: ObjectCache | None = None,
    ) -> None:
        if refresh_s <= 0:
            raise ValueError(f"refresh_s must be > 0, got {refresh_s}")
        self.store, self.settings, self.live, self.refresh_s = store, settings, live, refresh_s
        self.cache = cache or ObjectCache()
        self.index = StoreIndex(store, scan_s)
        self._stores: dict[str, ObjectStore] = {}
        self._totals: dict[str, JobTotals] = {}
        self._snapshot = Snapshot((), StoreListing(), 0.0)
        # finished jobs' lines, by OUT, with the OutKeys they were built from (kept while those stand)
        self._done: dict[str, tuple[OutKeys, JobSummary]] = {}
        self._lock = threading.Lock()

    def snapshot(self) -> Snapshot:
        """The latest snapshot. One older than refresh_s is served as it is while a thread rebuilds
        it, so no request waits on the store (only the very first, which has nothing to serve)."""
        current = self._snapshot
        if current.at == 0.0:
            return self.refresh()
        if time.time() - current.at >= self.refresh_s and self._lock.acquire(blocking=False):
            threading.Thread(target=self._rebuild, name="dashboard-refresh", daemon=True).start()
        return current

    def refresh(self) -> Snapshot:
        """Rebuild the snapshot now (waiting for a rebuild under way) and return it."""
        with self._lock:
            self._snapshot = self._build(time.time())
            return self._snapshot

    def _rebuild(self) -> None:
        """The background rebuild snapshot() starts, holding the lock it took."""
        try:
            self._snapshot = self._build(time.time())
        except Exception as exc:  # the store failed us: serve the last snapshot, try again next poll
            log.error("dashboard_refresh_failed", error=str(exc))
        finally:
            self._lock.release()

    def out_store(self, prefix: str) -> ObjectStore:
        """The OUT at `prefix` as a store of its own (an S3 store shares the root's client)."""
        if prefix not in self._stores:
            self._stores[prefix] = sub_store(self.store, prefix, self.settings) if prefix else self.store
        return self._stores[prefix]

    def reader(self, out: OutKeys) -> JobReader:
        store = self.out_store(out.prefix)
        totals = self._totals.setdefault(store.url, JobTotals())
        return JobReader(store, out, self.cache, totals)

    def _build(self, now: float) -> Snapshot:
        changing = [j.out for j in self._snapshot.jobs if not j.done]
        listing = self.index.refresh(changing, now)
        batches = {b: self.batch(*b) for b in listing.batches}
        rows = []
        for out in listing.outs.values():
            owner = out.tenant_batch
            record = batches.pop(owner, None) if owner else None
            kept = self._done.get(out.prefix)
            if kept is not None and kept[0] is out:  # a finished job whose keys did not change: its line stands
                rows.append(kept[1])
                continue
            try:
                row = self._job(out, record, now)
            except (FreightError, ValueError) as exc:  # ValueError: an unreadable manifest or record
                log.warning("dashboard_job_skipped", out=self.store.url_of(out.prefix), error=str(exc))
                continue
            rows.append(row)
            if row.done and (record is None or record.final):
                self._done[out.prefix] = (out, row)
            else:
                self._done.pop(out.prefix, None)
        for prefix in self._done.keys() - listing.outs.keys():  # deleted since
            del self._done[prefix]
        rows += [self._unplanned(r) for r in batches.values() if r is not None]
        rows.sort(key=lambda r: (-r.submitted_at, r.ref))
        return Snapshot(tuple(rows), listing, now)

    def batch(self, tenant: str, batch_id: str) -> BatchRecord | None:
        """The batch's record: read again each time until it is final (the batch process rewrites
        it until then), then kept."""
        key = batch_record(tenant, batch_id)
        url = self.store.url_of(key)
        final = self.cache.peek(url)
        if final is not None:
            return final
        try:
            record = BatchRecord.model_validate(json.loads(self.store.get(key)))
        except (ObjectNotFoundError, ValueError) as exc:  # deleted meanwhile, or unreadable
            log.warning("dashboard_batch_skipped", batch=url, error=str(exc))
            return None
        return self.cache.get(url, lambda: record) if record.final else record

    def _job(self, out: OutKeys, batch: BatchRecord | None, now: float) -> JobSummary:
        reader = self.reader(out)
        manifest = reader.manifest()
        totals = reader.totals()
        committed, failed = out.committed, out.failed - out.committed
        total = len(manifest.shards)
        state, running, mode = _storage_state(out, len(committed), len(failed), total), 0, "embedded"
        if batch is not None:
            mode = "batch"
            if state == "incomplete" and batch.status == "in_progress":
                state = "running"
        live = self._live(manifest.job_id) if not out.ended else {}
        if live:
            mode, running = "fleet", int(live.get("shards_running", 0))
            if state == "incomplete":
                state = str(live.get("state") or "running")
                state = "running" if state in FINISHED_JOB_STATES else state  # Redis ahead of storage
        rows_done = totals.rows
        report = reader.report()
        rate = eta = None
        if totals.first_started_at is not None and state not in FINISHED_JOB_STATES:
            rate = rows_done / max(now - totals.first_started_at, 1e-9)
            eta = max(manifest.input.rows - rows_done, 0) / rate if rate > 0 else None
        return JobSummary(
            ref=batch.id if batch is not None else manifest.job_id, job_id=manifest.job_id, out=out.prefix,
            tenant=tenant_of(out.prefix), batch_id=batch.id if batch is not None else None,
            batch_status=batch.status if batch is not None else None, state=state, model=_model_name(manifest, batch),
            kind=batch.endpoint if batch is not None else _kind(manifest), shards_total=total, shards_committed=len(committed), shards_failed=len(failed),
            shards_running=running, rows_total=manifest.input.rows, rows_done=rows_done,
            rows_failed=totals.rows_failed, rows_per_second=rate, eta_seconds=eta,
            cost_usd=float(report.get("cost_usd") or 0.0),
            submitted_at=float(batch.created_at) if batch is not None else manifest.created_at, mode=mode,
        )  # fmt: skip

    def _unplanned(self, batch: BatchRecord) -> JobSummary:
        """A batch whose job is not planned yet (validating), or never was (failed validation)."""
        return JobSummary(
            ref=batch.id, job_id=None, out=job_prefix(batch.tenant, batch.id), tenant=batch.tenant,
            batch_id=batch.id, batch_status=batch.status, state=_BATCH_STATE.get(batch.status, batch.status),
            model=batch.model or "", kind=batch.endpoint, shards_total=0, shards_committed=0,
            shards_failed=0, shards_running=0, rows_total=batch.request_counts.total,
            rows_done=batch.request_counts.completed, rows_failed=batch.request_counts.failed,
            rows_per_second=None, eta_seconds=None, cost_usd=0.0, submitted_at=float(batch.created_at),
            mode="batch",
        )  # fmt: skip

    def _live(self, job_id: str) -> dict[str, Any]:
        if self.live is None:
            return {}
        try:
            return self.live.job(job_id)
        except redis.RedisError as exc:
            log.warning("dashboard_redis_unavailable", error=str(exc))
            return {}


def _storage_state(out: OutKeys, committed: int, failed: int, total: int) -> str:
    """The job's state from its storage markers, in the precedence jobs.status.job_status uses, in the
    words of `freight jobs`."""
    if out.has(SUCCESS_KEY):
        return "succeeded"
    if out.has(FAILURES_KEY) and committed + failed >= total:
        return "failed"
    if out.has(EXPIRED_KEY):
        return "expired"
    if out.has(CANCEL_KEY):
        return "cancelled"
    if committed >= total:
        return "finalizing"
    return "incomplete"


def _model_name(manifest: Manifest, batch: BatchRecord | None) -> str:
    if batch is not None and batch.model:
        return batch.model
    return manifest.spec.model_name or manifest.spec.model


def _kind(manifest: Manifest) -> str:
    return "likelihood" if manifest.spec.continuation_column is not None else manifest.spec.task
