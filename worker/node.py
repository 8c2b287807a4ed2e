"""The worker's main process ("node"): what it keeps up while its pool processes run shards.

`NodeState` is created in the main process before the pool forks (worker_init): its id (new on
each start: `<celery hostname>/<pid>-<token>`, so a restarted worker never inherits the leases of
the one before), whether it serves every queue, the model to preload, the attempt slots the
deadline watch reads, and the queues it consumes right now (kept by worker/queue_sync.py).

`NodeKeeper`, a main-process thread, every `interval_s` (min(FREIGHT_HEARTBEAT_S, visibility / 4)),
and at once when the worker receives a message (`poke`, from Celery's task_received), so a delivered
shard names its holder within milliseconds rather than up to a beat later:
1. beats `freight:nodes` (the node's queues, for `freight status` and the reaper);
2. renews the leases of the messages this node holds: kombu's `unacked_index` score and the
   `freight:leases` holder, so a running shard is never restored while its node lives;
3. reaps: restores the unacked messages of nodes whose beat is older than 60 s (jobs/leases.py);
4. on the first tick at least RECONCILE_S (15 s) after its last turn (so about every 20 s with 10 s
   ticks), unless another node took a turn in the last 12 s, starts a pass that checks Redis against
   storage and redelivers unconfirmed notifications (jobs/reconcile.py) on a thread of its own
   (worker/reconcile_turns.py): the tick does not wait for it, so a hanging storage endpoint never
   holds back the beat and the lease renewals (a tick only talks to Redis). At most one pass per
   node runs; while one is still running no other starts here (`reconcile_still_running`).

`stop` (the worker's clean exit) lets the tick under way end (a few seconds at most), then deletes
the node's entry; it does not wait for a running reconcile pass (a daemon thread).
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from jobs.leases import LeaseReaper, beat_node, forget_node, renew_leases
from jobs.log import get_logger
from jobs.progress import NodeBeat
from jobs.settings import Settings
from worker.deadline import AttemptSlots
from worker.reconcile_turns import RECONCILE_S, ReconcileTurns

log = get_logger(__name__)

STOP_WAIT_S = 5.0  # how long `stop` lets the tick under way end (its Redis calls time out at 10 s)


def new_node_id(hostname: str) -> str:
    return f"{hostname}/{os.getpid()}-{secrets.token_hex(3)}"


@dataclass
class NodeState:
    """The main process's own state (one per worker process tree; see the module docstring)."""

    hostname: str
    serve_all: bool
    preload: str | None = None
    node_id: str = ""
    slots: AttemptSlots = field(default_factory=AttemptSlots)
    queues: tuple[str, ...] = ()  # consumed right now

    def __post_init__(self) -> None:
        self.node_id = self.node_id or new_node_id(self.hostname)

    def beat(self, now: float) -> NodeBeat:
        return NodeBeat(self.node_id, self.hostname, now, self.queues, self.serve_all)


class NodeKeeper:
    """Main-process thread: node beat, lease renewal, reaper, reconcile (see the module docstring)."""

    def __init__(
        self,
        node: NodeState,
        settings: Settings,
        held_tags: Callable[[], list[str]],
        reconcile_s: float = RECONCILE_S,
    ) -> None:
        self.node = node
        self.settings = settings
        self.held_tags = held_tags
        self.client = redis.Redis.from_url(
            settings.redis_url, decode_responses=True, socket_timeout=10, socket_connect_timeout=10
        )
        self.reaper = LeaseReaper(self.client)
        self.interval_s = max(0.2, min(settings.heartbeat_s, settings.visibility_timeout_s / 4))
        self.reconcile_turns = ReconcileTurns(self.client, node.node_id, settings, every_s=reconcile_s)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._delivered: set[str] = set()  # tags poked since the last tick (maybe not yet "reserved")
        self._thread: threading.Thread | None = None

    def poke(self, tag: str | None) -> None:
        """Run the next tick now: the message `tag` was just delivered, record its lease."""
        if tag is not None:
            self._delivered.add(tag)
        self._wake.set()

    def tick(self, now: float) -> None:
        beat_node(self.client, self.node.beat(now))
        delivered, self._delivered = self._delivered, set()
        renew_leases(self.client, self.node.node_id, set(self.held_tags()) | delivered, now)
        self.reaper.reap(now)
        self.reconcile_turns.tick(now)  # starts a pass on its own thread when due; never waits for one

    def run(self) -> None:
        while True:
            try:
                self.tick(time.time())
            except (redis.RedisError, RuntimeError) as exc:  # RuntimeError: a set changed size mid-copy
                log.warning("node_upkeep_failed", error=str(exc))
            except Exception:  # a bug: the next tick tries again
                log.exception("node_upkeep_error")
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return

    def start(self) -> NodeKeeper:
        self._thread = threading.Thread(target=self.run, name="freight-node-keeper", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """A clean exit: the node's entry goes (its unacked messages are restored by kombu). Waits up
        to STOP_WAIT_S for the tick under way (a beat after the delete would bring the entry back),
        never for a reconcile pass."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(STOP_WAIT_S)
        try:
            forget_node(self.client, self.node.node_id)
        except redis.RedisError as exc:
            log.warning("node_forget_failed", error=str(exc))
