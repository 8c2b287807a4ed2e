"""State of a distributed job: storage markers decide the end state, Redis adds live progress.

end states from storage: succeeded (_SUCCESS), failed (failures.json: every shard ended, some failed),
expired (_EXPIRED: past its completion window), cancelled (_CANCELLED). Otherwise Redis says queued / running with per-state shard counts.
Redis also says which attempts storage did not answer (`freight:outages:<job>`, worker/outages.py).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from jobs.client import queue_for_model
from jobs.expiry import EXPIRED_KEY
from jobs.finalize import committed_shards
from jobs.leases import live_nodes
from jobs.live_state import LiveState
from jobs.manifest import SUCCESS_KEY, Manifest, read_manifest
from jobs.markers import FAILURES_KEY, is_cancelled, read_failures
from jobs.progress import FINISHED_JOB_STATES
from jobs.storage import ObjectStore


@dataclass(frozen=True)
class FleetStatus:
    job_id: str
    output: str
    state: str  # queued | running | finalizing | succeeded | failed | cancelled | unknown
    shards_total: int
    shards_queued: int
    shards_running: int
    shards_committed: int
    shards_failed: int
    rows_total: int
    rows_done: int
    rows_per_second: float | None
    eta_seconds: float | None
    failures: list[dict[str, Any]] = field(default_factory=list)
    live: bool = True  # False when Redis did not answer or does not know the job
    queue: str = ""  # the job's Celery queue
    workers_live: int = 0  # worker main processes with a beat younger than 60 s
    workers_consuming: int = 0  # of those, the ones consuming the job's queue now
    workers_ready: int = 0  # pool processes with the job's model loaded (ready to serve it)
    workers_serving_all: int = 0  # live workers that add any queue with work (no --model/--queues)
    # shard -> its attempts that ended because storage did not answer (no strikes: their own budget,
    # FREIGHT_MAX_SHARD_STORAGE_OUTAGES a shard); -1: finalize's. Only shards with one at least.
    storage_outages: dict[int, int] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.state in FINISHED_JOB_STATES

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def fleet_status(store: ObjectStore, live: LiveState | None, manifest: Manifest | None = None) -> FleetStatus:
    manifest = manifest or read_manifest(store)
    job_id, total = manifest.job_id, len(manifest.shards)
    committed = committed_shards(store)
    failures = read_failures(store)
    counts: dict[str, Any] = {}
    meta: dict[str, str] = {}
    outages: dict[int, int] = {}
    if live is not None:
        try:
            counts, meta = live.job(job_id), live.job_meta(job_id)
            outages = live.all_storage_outages(job_id)
        except redis.RedisError:
            counts = {}
    failed = {int(f["shard"]) for f in failures} - committed
    if store.exists(SUCCESS_KEY):
        state = "succeeded"
    elif store.exists(FAILURES_KEY) and len(committed) + len(failed) >= total:
        state = "failed"
    elif store.exists(EXPIRED_KEY):
        state = "expired"
    elif is_cancelled(store):
        state = "cancelled"
    elif len(committed) == total:
        state = "finalizing"
    else:
        state = str(counts.get("state", "unknown"))
        if state in FINISHED_JOB_STATES:  # Redis ahead of storage (a cancel whose marker is not in yet)
            state = "running"
    rows_done = sum(manifest.shards[i].rows for i in committed if i < total)
    rate = eta = None
    submitted = float(meta.get("submitted_at", 0) or 0)
    if submitted and rows_done and state not in FINISHED_JOB_STATES:
        rate = rows_done / max(time.time() - submitted, 1e-9)
        eta = (manifest.input.rows - rows_done) / rate
    running = int(counts.get("shards_running", 0))
    workers = _workers(live, manifest, meta.get("queue") or queue_for_model(manifest.spec.model))
    return FleetStatus(
        job_id=job_id,
        output=store.url,
        state=state,
        shards_total=total,
        shards_queued=max(total - len(committed) - len(failed) - running, 0) if counts else 0,
        shards_running=running,
        shards_committed=len(committed),
        shards_failed=len(failed),
        rows_total=manifest.input.rows,
        rows_done=rows_done,
        rows_per_second=rate,
        eta_seconds=eta,
        failures=failures,
        live=bool(counts),
        storage_outages=outages,
        **workers,
    )


def _workers(live: LiveState | None, manifest: Manifest, queue: str) -> dict[str, Any]:
    """Who can serve the job now: live nodes, those consuming its queue, processes with its model."""
    out: dict[str, Any] = {"queue": queue}
    if live is None:
        return out
    now = time.time()
    try:
        nodes = live_nodes(live.client, now)
        beats = live.workers()
    except redis.RedisError:
        return out
    out["workers_live"] = len(nodes)
    out["workers_consuming"] = sum(1 for n in nodes if queue in n.queues)
    out["workers_serving_all"] = sum(1 for n in nodes if n.serve_all)
    out["workers_ready"] = sum(1 for b in beats if b.model == manifest.spec.model)
    return out


def worker_lines(st: FleetStatus, model: str) -> list[str]:
    """The status lines about workers for an unfinished job, warnings first."""
    if st.done or not st.live:
        return []
    lines = []
    if st.workers_consuming == 0:
        if st.workers_serving_all:
            lines.append(f"no live worker consumes {st.queue} now: {st.workers_serving_all} serve every queue "
                         "and take it once their own model's queue is empty (or the autoscaler adds one)")  # fmt: skip
        else:
            lines.append(f"no live worker consumes {st.queue} (model {model}): start `freight worker` "
                         f"(serves every queue) or `freight worker --model {model}`")  # fmt: skip
    lines.append(f"workers: {st.workers_live} live, {st.workers_consuming} consuming {st.queue}, "
                 f"{st.workers_ready} with the model loaded")  # fmt: skip
    return lines


def outage_lines(st: FleetStatus, budget: int, shown: int = 8) -> list[str]:
    """The status lines about storage outages, when the job had any: attempts in all, shards hit, then
    each shard's outages against `budget` (FREIGHT_MAX_SHARD_STORAGE_OUTAGES), most first, `shown` at most."""
    if not st.storage_outages:
        return []
    shards = [s for s in st.storage_outages if s >= 0]
    total = sum(st.storage_outages.values())
    hit = " and ".join(([f"{len(shards)} shard{'s' if len(shards) != 1 else ''}"] if shards else [])
                       + (["finalize"] if -1 in st.storage_outages else []))  # fmt: skip
    lines = [f"storage outages: {total} attempt{'s' if total != 1 else ''} of {hit} found storage unavailable "
             f"(no strikes; a shard fails after {budget}, FREIGHT_MAX_SHARD_STORAGE_OUTAGES)"]  # fmt: skip
    worst = sorted(st.storage_outages.items(), key=lambda kv: (-kv[1], kv[0]))
    parts = [f"{'finalize' if s < 0 else f'shard {s}'} {n}/{budget}" for s, n in worst[:shown]]
    if len(worst) > shown:
        parts.append(f"{len(worst) - shown} more")
    lines.append("  " + ", ".join(parts))
    if not st.done:
        lines.append("  storage did not answer those attempts: check the storage endpoint "
                     "(FREIGHT_S3_ENDPOINT_URL), the network and the credentials if this count grows")  # fmt: skip
    return lines
