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
4. on the first tick at least RECONCILE_S after its last pass (so about every 20 s with 10 s ticks),
   unless another node took a turn in the last 12 s, checks Redis against storage and redelivers
   unconfirmed notifications (jobs/reconcile.py).
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

log = get_logger(__name__)

RECONCILE_S = 15.0  # how often some node of the fleet checks Redis against storage
RECONCILE_LOCK = "freight:lock:reconcile"


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

    def __init__(self, node: NodeState, settings: Settings, held_tags: Callable[[], list[str]]) -> None:
        self.node = node
        self.settings = settings
        self.held_tags = held_tags
        self.client = redis.Redis.from_url(
            settings.redis_url, decode_responses=True, socket_timeout=10, socket_connect_timeout=10
        )
        self.reaper = LeaseReaper(self.client)
        self.interval_s = max(0.2, min(settings.heartbeat_s, settings.visibility_timeout_s / 4))
        self._next_reconcile = time.monotonic() + RECONCILE_S / 2
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._delivered: set[str] = set()  # tags poked since the last tick (maybe not yet "reserved")
        self._fleet = None

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
        if time.monotonic() >= self._next_reconcile:
            self._next_reconcile = time.monotonic() + RECONCILE_S
            self.reconcile(now)

    def reconcile(self, now: float) -> None:
        """One pass of jobs/reconcile.py, unless another node took this turn."""
        if not self.client.set(RECONCILE_LOCK, self.node.node_id, nx=True, ex=int(RECONCILE_S * 0.8)):
            return
        from jobs.client import FleetClient
        from jobs.reconcile import Reconciler

        if self._fleet is None:
            self._fleet = FleetClient(self.settings, retry_for_s=5.0)
        Reconciler(self._fleet, self.settings).run(now)

    def run(self) -> None:
        while True:
            try:
                self.tick(time.time())
            except (redis.RedisError, RuntimeError) as exc:  # RuntimeError: a set changed size mid-copy
                log.warning("node_upkeep_failed", error=str(exc))
            except Exception:  # storage away during a reconcile, or a bug: the next tick tries again
                log.exception("node_upkeep_error")
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return

    def start(self) -> NodeKeeper:
        threading.Thread(target=self.run, name="freight-node-keeper", daemon=True).start()
        return self

    def stop(self) -> None:
        """A clean exit: the node's entry goes (its unacked messages are restored by kombu)."""
        self._stop.set()
        self._wake.set()
        try:
            forget_node(self.client, self.node.node_id)
        except redis.RedisError as exc:
            log.warning("node_forget_failed", error=str(exc))
