"""How shards and jobs end in distributed mode: shards marked failed for good, attempts lost to a crash
recorded as waste, finalize once every shard committed, the failures manifest once every shard has
ended and some failed."""

from __future__ import annotations

import contextlib
import time
from typing import Literal

import redis
from celery import Celery

from jobs.client import queue_for_model, send_finalize
from jobs.cost import AttemptRecord
from jobs.expiry import expire_job
from jobs.finalize import committed_shards, report_now
from jobs.lifecycle import read_lifecycle
from jobs.log import get_logger
from jobs.manifest import SUCCESS_KEY, Manifest, waste_key
from jobs.markers import failed_shards, is_cancelled, write_failure, write_failures_manifest
from jobs.notify import notify_final
from jobs.storage import ObjectStore
from worker.outages import outages_spent
from worker.runtime import ProcessRuntime
from worker.shard import default_pricing

log = get_logger(__name__)


def poison_verdict(strikes: int, node_losses: int, max_crashes: int, max_node_losses: int) -> str | None:
    """Why a shard fails for good before this attempt runs, or None to run it.

    strikes: the shard's attempts that have not ended cleanly, this one included
    (LiveState.begin_attempt); node_losses: how many attempts the lease reaper restored because
    their whole worker stopped beating (a lost machine: spot loss without notice, a host crash).
    The other unclean attempts died in a worker that lived on (its deadline killed them, out of
    memory, a crash): evidence against the shard, so `max_crashes` of them make it poison. A lost
    machine says little about the shard, so those count against the larger `max_node_losses`
    (a shard that takes its machine down every time must still end).
    """
    crashed = max(0, strikes - 1 - node_losses)  # earlier attempts only
    if crashed >= max_crashes:
        return (
            f"{crashed} attempts ended without a result or an error: the worker process died on this "
            "shard each time (killed, out of memory, or crashed). Inspect its rows, then resubmit to retry it."
        )
    if node_losses >= max_node_losses:
        return (
            f"{node_losses} attempts were lost with their worker (the machine stopped without a notice "
            "each time). Check the fleet's instances and this shard's rows, then resubmit to retry it."
        )
    return None


def poison_reason(rt: ProcessRuntime, job_id: str, shard: int, strikes: int) -> str | None:
    """Why the shard fails before this attempt runs: poison_verdict with this job's
    node-loss count and the settings' limits, or its storage outages past their budget (worker/outages.py)."""
    s = rt.settings
    if strikes > 1 and (verdict := poison_verdict(strikes, rt.live.node_losses(job_id, shard),
                                                  s.max_shard_attempts, s.max_shard_node_losses)) is not None:  # fmt: skip
        return verdict
    return outages_spent(rt, job_id, shard)


def mark_failed(rt: ProcessRuntime, store: ObjectStore, manifest: Manifest, shard: int, attempt: int,
                reason: str) -> None:  # fmt: skip
    """Record shard `shard` as failed for good: OUT/failures/<n>.json, Redis state, a log line."""
    write_failure(store, {"job_id": manifest.job_id, "shard": shard, "rows": manifest.shards[shard].rows,
                          "attempts": attempt, "reason": reason, "worker": rt.worker_id, "at": time.time()})  # fmt: skip
    rt.live.transition(manifest.job_id, shard, "failed")
    rt.metrics.outcomes.labels("failed").inc()
    log.error("shard_failed", reason=reason)


def finish_if_done(rt: ProcessRuntime, store: ObjectStore, manifest: Manifest, app: Celery) -> str:
    """After a shard ends: finalize when all committed, write failures.json when all ended with failures.

    Redis counts are a cheap first check; storage decides; `app` publishes freight.finalize. Returns
    "running", "finalizing", "failed", "cancelled" or "succeeded". Any worker may call it any number of
    times: finalize is idempotent.
    """
    job_id, total = manifest.job_id, len(manifest.shards)
    try:
        live = rt.live.job(job_id)
    except redis.RedisError:
        live = {}
    if live and live.get("shards_committed", 0) + live.get("shards_failed", 0) < total:
        return "running"
    if is_cancelled(store):
        return "cancelled"
    if store.exists(SUCCESS_KEY):
        return "succeeded"
    committed = committed_shards(store)
    if len(committed) == total:
        log.info("job_complete_sending_finalize")
        send_finalize(
            app, job_id=job_id, output=manifest.spec.output, queue=queue_for_model(manifest.spec.model)
        )
        return "finalizing"
    failed = failed_shards(store) - committed
    if len(committed) + len(failed) == total:
        failures = write_failures_manifest(store, job_id)
        rt.live.set_job_state(job_id, "failed")
        log.error("job_failed", shards_failed=[f["shard"] for f in failures])
        if read_lifecycle(store).notify:  # the report only for a notification
            report = report_now(store, manifest, sorted(committed))
            notify_final(store, manifest, "failed", report, rt.settings)
        return "failed"
    return "running"


def expire_if_over(rt: ProcessRuntime, store: ObjectStore, manifest: Manifest) -> str:
    """After a shard stopped or was skipped past the job's deadline: once no shard is queued or
    running (Redis counts), write the expired report and _EXPIRED and notify (jobs.expiry.expire_job,
    once). Returns "expired", "succeeded" (every shard was in after all) or "running"."""
    try:
        live = rt.live.job(manifest.job_id)
    except redis.RedisError:
        return "running"  # the next shard to end asks again
    if live and live.get("shards_queued", 0) + live.get("shards_running", 0) > 0:
        return "running"
    report = expire_job(store, manifest, rt.settings)
    state = "expired" if report is not None else "succeeded"
    rt.live.set_job_state(manifest.job_id, state)
    return state


def _unsaved_attempt(
    manifest: Manifest,
    shard: int,
    attempt: int,
    reason: Literal["interrupted", "error"],
    billed: float,
    worker: str,
    now: float,
) -> AttemptRecord:
    """An attempt of which nothing was saved: all of its billed time is waste."""
    pricing = default_pricing(manifest)
    charge = pricing.charge(billed)
    return AttemptRecord(
        job_id=manifest.job_id, shard=shard, attempt=attempt, reason=reason,
        rows_attempted=manifest.shards[shard].rows, rows_saved=0, billed_seconds=billed,
        **charge, wasted_usd=charge["cost_usd"],
        worker=worker, recorded_at=now,
    )  # fmt: skip


def record_lost_attempt(
    rt: ProcessRuntime, store: ObjectStore, manifest: Manifest, shard: int, previous: dict, now: float
) -> AttemptRecord | None:
    """Waste record for an attempt that died without a word (SIGKILL, OOM, a spot loss without notice,
    killed past its deadline). The caller checked that no live heartbeat runs it (worker/attempts.py).

    Its work is billed from its start to its worker's last heartbeat (+ one interval), at most until
    now: the time a vanished machine was still running. Nothing of it was saved. None when the attempt
    did end and was billed by its own worker (an error record whose start Redis failed to forget).
    """
    attempt, worker = int(previous.get("attempt", 0)), str(previous.get("worker", ""))
    if store.exists(waste_key(shard, attempt, "error")):
        return None
    beat = rt.live.last_heartbeat(worker)
    end = min(now, beat + rt.settings.heartbeat_s) if beat is not None else now
    billed = max(0.0, end - float(previous.get("at", now)))
    record = _unsaved_attempt(manifest, shard, attempt, "interrupted", billed, worker, now)
    if not store.put_if_absent(waste_key(shard, attempt, "lost"), record.model_dump_json().encode()):
        return None  # another attempt billed it already
    rt.metrics.wasted_seconds.inc(billed)
    log.warning("attempt_lost", lost_attempt=attempt, lost_worker=worker, billed_s=round(billed, 3))
    return record


def record_failed_attempt(
    rt: ProcessRuntime, store: ObjectStore, manifest: Manifest, shard: int, attempt: int, started: float
) -> AttemptRecord:
    """Waste record for an attempt that raised (then requeued or given up): billed from its start to
    now, nothing saved (`waste/<n>-<attempt>-error.json`). Its start is then dropped from
    `freight:started:<job>`, so the next attempt does not bill it a second time as lost."""
    now = time.time()
    billed = max(0.0, now - started)
    record = _unsaved_attempt(manifest, shard, attempt, "error", billed, rt.worker_id, now)
    store.put(waste_key(shard, attempt, "error"), record.model_dump_json().encode())
    rt.metrics.wasted_seconds.inc(billed)
    with contextlib.suppress(redis.RedisError):  # left behind, record_lost_attempt sees the error record
        rt.live.end_attempt_start(manifest.job_id, shard, attempt)
    return record
