"""How a distributed job ends: shards marked failed for good, finalize once every shard committed,
the failures manifest once every shard has ended and some failed."""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from jobs.finalize import committed_shards
from jobs.log import get_logger
from jobs.manifest import SUCCESS_KEY, Manifest
from jobs.markers import failed_shards, is_cancelled, write_failure, write_failures_manifest
from jobs.storage import ObjectStore
from worker.runtime import ProcessRuntime

log = get_logger(__name__)

SendFinalize = Callable[[str, str, str], None]  # (job_id, output, model)


def poison_reason(died: int) -> str:
    return (
        f"{died} attempts ended without a result or an error: the worker process died on this shard "
        "each time (killed, out of memory, or crashed). Inspect its rows, then resubmit to retry it."
    )


def mark_failed(rt: ProcessRuntime, store: ObjectStore, manifest: Manifest, shard: int, attempt: int,
                reason: str) -> None:  # fmt: skip
    """Record shard `shard` as failed for good: OUT/failures/<n>.json, Redis state, a log line."""
    write_failure(store, {"job_id": manifest.job_id, "shard": shard, "rows": manifest.shards[shard].rows,
                          "attempts": attempt, "reason": reason, "worker": rt.worker_id, "at": time.time()})  # fmt: skip
    rt.live.transition(manifest.job_id, shard, "failed")
    rt.metrics.outcomes.labels("failed").inc()
    log.error("shard_failed", reason=reason)


def finish_if_done(
    rt: ProcessRuntime, store: ObjectStore, manifest: Manifest, send_finalize: SendFinalize
) -> str:
    """After a shard ends: finalize when all committed, write failures.json when all ended with failures.

    Redis counts are a cheap first check; storage decides. Returns "running", "finalizing", "failed",
    "cancelled" or "succeeded". Any worker may call it any number of times: finalize is idempotent.
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
        send_finalize(job_id, manifest.spec.output, manifest.spec.model)
        return "finalizing"
    failed = failed_shards(store) - committed
    if len(committed) + len(failed) == total:
        failures = write_failures_manifest(store, job_id)
        rt.live.set_job_state(job_id, "failed")
        log.error("job_failed", shards_failed=[f["shard"] for f in failures])
        return "failed"
    return "running"
