"""The Celery app of freight workers and its reliability settings.

Exactly-once comes from storage commits (put_if_absent), never from the queue: Celery on Redis may
deliver a shard twice, and every task is idempotent. The settings below make a lost worker's shard
come back (acks_late + reject on worker lost + a visibility timeout), make a worker hold one shard at a
time (prefetch 1), and hand a running shard back when the worker stops (see worker/tasks.py).

`celery -A worker.celery_app worker` and `freight worker` both use `app` below.
"""

from __future__ import annotations

import threading
from typing import Any

import redis
from celery import Celery, signals
from celery.worker import state as worker_state

from jobs.client import celery_config
from jobs.log import configure_logging, get_logger
from jobs.settings import Settings, get_settings
from worker import runtime as rt

log = get_logger(__name__)

# kombu's Redis transport indexes unacked messages here: ZSET delivery_tag -> delivered-at (unix s).
UNACKED_INDEX_KEY = "unacked_index"
SOFT_SHUTDOWN_S = 60.0


def worker_config(settings: Settings) -> dict[str, Any]:
    """Worker-side settings on top of the shared broker config."""
    return {
        **celery_config(settings),
        "include": ["worker.tasks"],
        "task_acks_late": True,  # ack after the shard commits (or hands itself back)
        "task_reject_on_worker_lost": True,  # a pool child killed mid-shard: requeue, don't drop
        "task_acks_on_failure_or_timeout": True,  # tasks catch their own errors and count attempts
        "worker_prefetch_multiplier": 1,  # hold one shard at a time; others stay for other workers
        "worker_concurrency": 1,  # one engine per GPU
        # A cold shutdown first waits this long for the running shard to checkpoint and hand itself
        # back (it stops at its next engine step), then requeues whatever is still unacked.
        "worker_soft_shutdown_timeout": SOFT_SHUTDOWN_S,
        "worker_enable_soft_shutdown_on_idle": False,
        # On a lost broker connection, keep computing: the commit goes to storage, not Redis.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "worker_hijack_root_logger": False,
        "worker_redirect_stdouts": False,  # structlog writes its JSON lines to stderr itself
        "worker_disable_rate_limits": True,
        "worker_send_task_events": False,
        "task_send_sent_event": False,
        "worker_max_tasks_per_child": None,  # keep the loaded model
    }


def make_app(settings: Settings) -> Celery:
    app = Celery("freight", set_as_current=True)
    app.conf.update(worker_config(settings))
    return app


app = make_app(get_settings())


class LeaseRenewer:
    """Main-process thread: keeps the unacked entries of this worker's shards fresh.

    kombu restores an unacked message once its delivered-at score is older than the visibility
    timeout. Refreshing the score of messages this worker still holds means a long shard is never
    redelivered while its worker lives, and a vanished worker's shard comes back after one timeout.
    """

    def __init__(self, redis_url: str, interval_s: float) -> None:
        self.client = redis.Redis.from_url(redis_url, socket_timeout=10, socket_connect_timeout=10)
        self.interval_s = interval_s

    def held_tags(self) -> list[str]:
        held = tuple(worker_state.active_requests) + tuple(worker_state.reserved_requests)
        return [r.message.delivery_tag for r in held if getattr(r, "message", None) is not None]

    def renew(self, now: float) -> int:
        tags = self.held_tags()
        if not tags:
            return 0
        # XX: only refresh entries that still exist (acked or restored ones stay gone).
        return int(self.client.zadd(UNACKED_INDEX_KEY, dict.fromkeys(tags, now), xx=True, ch=True) or 0)

    def run(self) -> None:
        import time

        while True:
            time.sleep(self.interval_s)
            try:
                self.renew(time.time())
            except (redis.RedisError, RuntimeError) as exc:  # RuntimeError: set changed size mid-copy
                log.warning("lease_renew_failed", error=str(exc))

    def start(self) -> LeaseRenewer:
        threading.Thread(target=self.run, name="freight-lease-renewer", daemon=True).start()
        return self


@signals.worker_init.connect
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    """Main process, before the pool forks: logging, the queues this worker consumes."""
    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    queues = tuple(sorted(sender.app.amqp.queues.consume_from or {})) if sender is not None else ()
    rt.configure(getattr(sender, "hostname", None) or rt.socket.gethostname(), queues)


@signals.worker_ready.connect
def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    settings = get_settings()
    interval = max(1.0, min(60.0, settings.visibility_timeout_s / 4))
    LeaseRenewer(settings.redis_url, interval).start()


@signals.worker_shutting_down.connect
def _on_shutting_down(**_: Any) -> None:
    """Runs in the main process's signal handler: tell every pool child to hand its shard back."""
    rt.SHUTDOWN_FLAG.raise_()


@signals.worker_process_init.connect
def _on_process_init(**_: Any) -> None:
    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    rt.runtime()


@signals.worker_process_shutdown.connect
def _on_process_shutdown(**_: Any) -> None:
    rt.close_runtime()
