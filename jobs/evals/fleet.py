"""Eval jobs on the fleet: queue a JobSpec the way `freight submit` does.

Never imports worker/ or torch: shards are sent by task name through jobs.client.
"""

from __future__ import annotations

from jobs.client import FleetClient
from jobs.finalize import committed_shards
from jobs.manifest import SUCCESS_KEY
from jobs.markers import CANCEL_KEY
from jobs.planner import prepare_job
from jobs.settings import Settings
from jobs.spec import JobSpec

PRIORITY = 5  # nightly evals yield to interactive jobs submitted at the default 0


def submit_spec(spec: JobSpec, settings: Settings, priority: int = PRIORITY) -> str:
    """Write the job's manifest and queue its uncommitted shards; returns the job id.

    Submitting again re-queues only what is not committed (as `freight submit` does)."""
    prepared = prepare_job(spec, settings)
    store, manifest = prepared.store, prepared.manifest
    store.delete(CANCEL_KEY)
    committed = committed_shards(store)
    # estimated tokens per shard for the autoscaler: rows * max_tokens
    tokens = {s.index: s.rows * spec.sampling.max_tokens for s in manifest.shards}
    client = FleetClient(settings)
    try:
        client.live.clear_cancel(manifest.job_id)
        submission = client.enqueue(
            job_id=manifest.job_id,
            output=spec.output,
            model=spec.model,
            shard_tokens=tokens,
            committed=committed,
            priority=priority,
        )
        if store.exists(SUCCESS_KEY):
            client.live.set_job_state(manifest.job_id, "succeeded")
        elif len(committed) == len(manifest.shards):
            client.send_finalize(job_id=manifest.job_id, output=spec.output, queue=submission.queue)
    finally:
        client.close()
    return manifest.job_id
