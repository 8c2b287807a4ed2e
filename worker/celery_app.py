"""The Celery app of freight workers and its reliability settings.

Exactly-once comes from storage commits (put_if_absent), never from the queue: Celery on Redis may
deliver a shard twice, and every task is idempotent. The settings below make a lost worker's shard
come back (acks_late + reject on worker lost + a visibility timeout; the lease reaper of worker/node.py
within about a minute), make a worker hold one shard at a time (prefetch 1), and hand a running shard
back when the worker stops (see worker/tasks.py).

`celery -A worker.celery_app worker` and `freight worker` both use `app` below.
"""

from __future__ import annotations

from typing import Any

from celery import Celery, signals
from celery.worker import state as worker_state

from jobs.client import celery_config
from jobs.log import configure_logging, get_logger
from jobs.settings import Settings, get_settings
from worker import runtime as rt
from worker.deadline import DeadlineWatch
from worker.node import NodeKeeper, NodeState
from worker.queue_sync import QueueSync

log = get_logger(__name__)

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
app.steps["consumer"].add(QueueSync)  # serve-all workers follow the jobs' queues (worker/queue_sync.py)


def held_tags() -> list[str]:
    """Delivery tags of the messages this worker holds (running and reserved): main process only."""
    held = tuple(worker_state.active_requests) + tuple(worker_state.reserved_requests)
    return [r.message.delivery_tag for r in held if getattr(r, "message", None) is not None]


@signals.worker_init.connect
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    """Main process, before the pool forks: logging, the node's state (its id, the attempt slots the
    deadline watch reads, serve-all or fixed queues, the model to preload)."""
    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    app_conf = sender.app.conf if sender is not None else app.conf
    queues = tuple(sorted(sender.app.amqp.queues.consume_from or {})) if sender is not None else ()
    node = NodeState(
        hostname=getattr(sender, "hostname", None) or rt.socket.gethostname(),
        serve_all=bool(app_conf.get("freight_serve_all", False)),
        preload=app_conf.get("freight_preload_model") or None,
    )
    node.queues = () if node.serve_all else queues
    rt.configure(node, queues)


@signals.worker_ready.connect
def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    """Main process: start the node keeper (beat, leases, reaper, reconcile) and the deadline watch."""
    node = rt.node_state()
    if node is None:
        return
    keeper = NodeKeeper(node, get_settings(), held_tags).start()
    watch = DeadlineWatch(node.slots).start()

    def _stop(**_: Any) -> None:
        watch.stop()
        keeper.stop()

    def _received(request: Any = None, **_: Any) -> None:  # main process, as the consumer takes a message
        message = getattr(request, "message", None)
        keeper.poke(getattr(message, "delivery_tag", None))

    signals.worker_shutdown.connect(_stop, weak=False)
    signals.task_received.connect(_received, weak=False)


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
