"""Submit and cancel distributed jobs: Celery `send_task` by task name, never importing worker/ or torch.

The broker settings shared by this client and the workers live here too (`celery_config`), so both
sides agree on serializer, transport options and task names without the client importing the worker.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from celery import Celery

from jobs.live_state import LiveState
from jobs.settings import Settings

TASK_RUN_SHARD = "freight.run_shard"
TASK_FINALIZE = "freight.finalize"

MAX_PRIORITY = 9


def queue_for_model(model: str) -> str:
    """The Celery queue of a model: shards of one model go to one queue, so a worker keeps its weights."""
    return "freight-" + hashlib.sha256(model.encode()).hexdigest()[:10]


def celery_config(settings: Settings) -> dict[str, Any]:
    """Broker and serialization settings that clients and workers must share."""
    return {
        "broker_url": settings.redis_url,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,  # a restarted Redis is waited for, forever
        "broker_transport_options": {
            # An unacked shard message becomes visible again after this many seconds; running shards
            # renew it (worker/node.py). A backstop: the lease reaper (jobs/leases.py) puts a vanished
            # worker's shard back once its beat is 60 s old.
            "visibility_timeout": settings.visibility_timeout_s,
            "unacked_restore_interval": max(1, min(10, settings.visibility_timeout_s // 4)),
            "unacked_restore_throttle": 1,
            "socket_timeout": 30,
            "socket_connect_timeout": 10,
            "health_check_interval": 10,
            "priority_steps": list(range(MAX_PRIORITY + 1)),
        },
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "task_ignore_result": True,  # results live in storage, never in the broker
        "result_backend": None,
        "task_default_queue": "freight-default",
        "task_create_missing_queues": True,
    }


def make_client_app(settings: Settings) -> Celery:
    """A Celery app that only publishes (no task code registered)."""
    app = Celery("freight-client", set_as_current=False)
    app.conf.update(celery_config(settings))
    return app


def send_finalize(app: Celery, *, job_id: str, output: str, queue: str) -> None:
    """Publish freight.finalize for a job whose shards are all committed (the task is idempotent)."""
    app.send_task(TASK_FINALIZE, kwargs={"job_id": job_id, "output": output}, queue=queue)


@dataclass(frozen=True)
class Submission:
    """What `FleetClient.enqueue` did."""

    job_id: str
    queue: str
    shards_total: int
    shards_enqueued: int
    enqueue_seconds: float


class FleetClient:
    """Publishes shard tasks and cancel requests for jobs whose manifest is already in OUT."""

    def __init__(self, settings: Settings, *, retry_for_s: float = 60.0) -> None:
        self.settings = settings
        self.app = make_client_app(settings)
        self.live = LiveState(settings.redis_url, retry_for_s=retry_for_s)

    def enqueue(
        self,
        *,
        job_id: str,
        output: str,
        model: str,
        shard_tokens: dict[int, int],
        committed: Iterable[int] = (),
        failed: Iterable[int] = (),
        priority: int = 0,
        deadline: float | None = None,
    ) -> Submission:
        """Queue every shard not yet committed or failed; `shard_tokens`: estimated tokens per shard;
        `deadline`: unix seconds the job should finish by (None: none), for the autoscaler.

        Safe to repeat (a resubmit after a Redis loss): committed shards are skipped by the caller's
        list here and, for any task already queued twice, by the storage commit on the worker.
        """
        if not 0 <= priority <= MAX_PRIORITY:
            raise ValueError(f"priority {priority} out of range: use 0 (first) .. {MAX_PRIORITY} (last)")
        done = set(committed) | set(failed)
        queue = queue_for_model(model)
        start = time.perf_counter()
        self.live.init_job(
            job_id,
            output=output,
            queue=queue,
            model=model,
            est_tokens=shard_tokens,
            committed=committed,
            failed=failed,
            deadline=deadline,
            priority=priority,
        )
        todo = sorted(i for i in shard_tokens if i not in done)
        self.requeue(job_id=job_id, output=output, queue=queue, shards=todo, priority=priority)
        return Submission(job_id, queue, len(shard_tokens), len(todo), time.perf_counter() - start)

    def requeue(self, *, job_id: str, output: str, queue: str, shards: Iterable[int], priority: int = 0) -> None:
        """Publish one freight.run_shard message per shard (the job's live state is the caller's)."""
        with self.app.producer_or_acquire() as producer:
            for shard in shards:
                self.app.send_task(
                    TASK_RUN_SHARD,
                    kwargs={"job_id": job_id, "output": output, "shard": shard},
                    queue=queue,
                    priority=priority,
                    producer=producer,
                    headers={"enqueued_at": time.time()},
                )

    def send_finalize(self, *, job_id: str, output: str, queue: str) -> None:
        send_finalize(self.app, job_id=job_id, output=output, queue=queue)

    def cancel(self, *, job_id: str) -> None:
        """Raise the Redis flag; running shards stop at their next engine step, queued ones are skipped.

        The caller also writes the durable marker (CANCEL_KEY) in OUT, which outlives Redis.
        """
        self.live.request_cancel(job_id)

    def close(self) -> None:
        self.live.close()
        self.app.close()
