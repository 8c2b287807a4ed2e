"""`freight jobs`: one line per job, newest first, from Redis (fleet jobs) or a storage prefix
(embedded runs: every OUT/manifest.json under it). Storage decides each job's state and numbers,
as `freight status` does; Redis adds the live state of a fleet job that has not ended."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import redis

from jobs.errors import FreightError
from jobs.finalize import report_now
from jobs.live_state import LiveState
from jobs.log import get_logger
from jobs.manifest import MANIFEST_KEY, read_manifest
from jobs.settings import Settings
from jobs.storage import ObjectStore, open_store

log = get_logger(__name__)

# job_status's storage words -> the job states fleet jobs use, so one vocabulary lists both
_STORAGE_STATE = {"complete": "succeeded", "incomplete": "incomplete", "finalizing": "finalizing"}
JOB_LIST_STATES = ("queued", "running", "finalizing", "incomplete", "succeeded", "failed", "cancelled", "expired")


@dataclass(frozen=True)
class JobRow:
    """One job of the list. `cost_usd`: cost.json's once finalized (or expired), else so far."""

    job_id: str
    state: str
    shards_committed: int
    shards_total: int
    rows_total: int
    rows_done: int
    rows_failed: int
    cost_usd: float
    submitted_at: float
    model: str
    output: str
    mode: str  # "fleet" (Redis knows it) or "embedded"

    @property
    def progress(self) -> float:
        return self.shards_committed / self.shards_total if self.shards_total else 1.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "progress": round(self.progress, 4)}


def job_row(store: ObjectStore, live: LiveState | None, mode: str, submitted_at: float | None = None) -> JobRow:
    """The list's line for the job in `store` (live: Redis, for the state of a fleet job)."""
    from jobs.fleet_status import fleet_status
    from jobs.status import job_status, read_cost

    manifest = read_manifest(store)
    st = job_status(store, manifest)
    state = _STORAGE_STATE.get(st.state, st.state)
    if live is not None and state in ("incomplete", "finalizing"):
        state = fleet_status(store, live, manifest).state
    report = read_cost(store) or report_now(store, manifest, sorted(_committed(store)))
    return JobRow(
        job_id=manifest.job_id, state=state, shards_committed=st.shards_committed,
        shards_total=st.shards_total, rows_total=st.rows_total, rows_done=st.rows_done,
        rows_failed=st.rows_failed, cost_usd=float(report.get("cost_usd", 0.0)),
        submitted_at=submitted_at or manifest.created_at, model=manifest.spec.model,
        output=manifest.spec.output, mode=mode,
    )  # fmt: skip


def _committed(store: ObjectStore) -> set[int]:
    from jobs.finalize import committed_shards

    return committed_shards(store)


def fleet_jobs(live: LiveState, settings: Settings) -> list[JobRow]:
    """Every job Redis knows (`freight:jobs`), read from its OUT; a job whose OUT is gone is skipped."""
    rows = []
    for job_id in sorted(live.client.smembers("freight:jobs")):
        meta = live.job_meta(job_id)
        if not meta.get("output"):
            continue  # its keys expired
        try:
            store = open_store(meta["output"], settings)
            rows.append(job_row(store, live, "fleet", float(meta.get("submitted_at") or 0) or None))
        except (FreightError, ValueError) as exc:  # ValueError: an unreadable manifest.json
            log.warning("job_list_skipped", job_id=job_id, error=str(exc))
    return rows


def stored_jobs(prefix: str, settings: Settings, live: LiveState | None = None) -> list[JobRow]:
    """Every job whose manifest.json lies under `prefix` (a folder or s3:// prefix), at any depth."""
    root = open_store(prefix, settings)
    outs = sorted(k[: -len(MANIFEST_KEY)].rstrip("/") for k in root.list("") if k.split("/")[-1] == MANIFEST_KEY)
    rows = []
    for sub in outs:
        url = root.url_of(sub) if sub else root.url
        try:
            rows.append(job_row(open_store(url, settings), live, "embedded"))
        except (FreightError, ValueError) as exc:  # ValueError: an unreadable manifest.json
            log.warning("job_list_skipped", output=url, error=str(exc))
    return rows


def list_jobs(settings: Settings, prefix: str | None = None, states: tuple[str, ...] = ()) -> list[JobRow]:
    """Jobs newest first: under `prefix` when given, else the ones this Redis knows; `states` filters."""
    live = LiveState(settings.redis_url, socket_timeout=2.0, retry_for_s=0)
    try:
        if prefix is not None:
            try:
                live.client.ping()
            except redis.RedisError:
                live.close()
                live = None  # type: ignore[assignment]
            rows = stored_jobs(prefix, settings, live)
        else:
            try:
                rows = fleet_jobs(live, settings)
            except redis.RedisError as exc:
                raise FreightError(
                    f"cannot list the fleet's jobs: Redis did not answer ({exc}); start it or set "
                    "FREIGHT_REDIS_URL, or list embedded runs with --prefix FOLDER"
                ) from None
    finally:
        if live is not None:
            live.close()
    if states:
        rows = [r for r in rows if r.state in states]
    return sorted(rows, key=lambda r: (-r.submitted_at, r.job_id))
