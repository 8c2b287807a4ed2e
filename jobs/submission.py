"""Queue a prepared job on the fleet: the one submit path shared by `freight submit` and evals.

Never imports worker/ or torch: shards are sent by task name through jobs.client.
"""

from __future__ import annotations

from jobs.client import FleetClient, Submission
from jobs.expiry import reopen
from jobs.finalize import committed_shards
from jobs.lifecycle import Lifecycle, write_lifecycle
from jobs.manifest import SUCCESS_KEY
from jobs.markers import CANCEL_KEY, FAILURES_KEY, FAILURES_PREFIX
from jobs.planner import PreparedJob
from jobs.settings import Settings


def submit_job(
    prepared: PreparedJob,
    settings: Settings,
    priority: int = 0,
    retry_for_s: float = 5.0,
    deadline: float | None = None,
    lifecycle: Lifecycle | None = None,
) -> Submission:
    """Queue every shard of `prepared` not yet committed; returns what was queued.

    `deadline` (unix seconds) is when the job should be done: the autoscaler sizes the fleet for it,
    and past it the job stops and expires (jobs/expiry.py). It belongs to this submission, not to the
    job: a resubmit without one clears it. `lifecycle` (its deadline should equal `deadline`) also
    names the notification targets; it is written to OUT/lifecycle.json.

    Submitting the same job again resumes it: a cancel marker is lifted, failed shards get a fresh
    attempt budget, committed shards are skipped, and a job whose shards are all committed but
    which has no _SUCCESS yet gets its finalize task. Raises redis / kombu errors when the broker
    is unreachable (the manifest in OUT is kept, so the caller can say "submit again").
    """
    store, manifest = prepared.store, prepared.manifest
    spec = manifest.spec
    reopen(store)  # an expired job runs its missing shards; this submission's end notifies again
    write_lifecycle(store, lifecycle or Lifecycle(deadline=deadline))
    store.delete(CANCEL_KEY)
    for key in [*store.list(FAILURES_PREFIX), FAILURES_KEY]:
        store.delete(key)
    committed = committed_shards(store)
    # Estimated tokens per shard for the autoscaler: rows * max_tokens (generation dominates).
    tokens = {s.index: s.rows * spec.sampling.max_tokens for s in manifest.shards}
    client = FleetClient(settings, retry_for_s=retry_for_s)
    try:
        client.live.clear_cancel(manifest.job_id)
        client.live.reset_strikes(manifest.job_id)
        sub = client.enqueue(
            job_id=manifest.job_id,
            output=spec.output,
            model=spec.model,
            shard_tokens=tokens,
            committed=committed,
            failed=(),
            priority=priority,
            deadline=deadline,
        )
        if store.exists(SUCCESS_KEY):
            client.live.set_job_state(manifest.job_id, "succeeded")
        elif len(committed) == len(manifest.shards):
            client.send_finalize(job_id=manifest.job_id, output=spec.output, queue=sub.queue)
    finally:
        client.close()
    return sub
