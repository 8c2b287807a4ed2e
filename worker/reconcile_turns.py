"""This node's turns at the fleet's reconcile pass (jobs/reconcile.py), each on a thread of its own.

A pass reads object storage and may take long: a hanging S3 endpoint holds a boto3 call for its
read timeout times its tries (FREIGHT_S3_READ_TIMEOUT_S x FREIGHT_S3_MAX_ATTEMPTS, 30 s x 5). NodeKeeper (worker/node.py) beats the node and renews its
leases on its own thread, so it only calls `ReconcileTurns.tick(now)`, which returns at once:
- on the first tick at least `every_s` (RECONCILE_S, 15 s) after this node's last turn (the first
  one every_s / 2 after the start), a turn is taken when no other node took one within 0.8 x every_s
  (`freight:lock:reconcile`, SET NX with that expiry; never deleted: it spaces the fleet's passes);
- a taken turn runs `Reconciler(...).run(now)` on a daemon thread (`freight-reconcile`);
- at most one pass of this node runs: a due tick that finds the previous pass still running starts
  none, takes no turn and logs `reconcile_still_running` once per stall; the first tick after that
  pass ends starts the next (if no other node took the turn). A pass that ran longer than every_s
  logs `reconcile_pass_slow` when it ends.

The lock's expiry is shorter than a slow pass: while this node's pass hangs, other nodes take their
turns, so one stuck node does not stop the fleet's reconciling. Passes of different nodes may then
overlap, as they already could with `freight autoscale`'s and `freight wait`'s passes, which take no
turn: a job's repair is under its own lock (`freight:lock:reconcile:<job>`), committed and failed
shard states stick (jobs/live_state.py), a shard published twice costs at most a duplicate attempt
(a task for a committed shard is acked without work, and the commit is put_if_absent), finalize is
idempotent, and a notification's claim and each redelivery are taken with put_if_absent
(jobs/redelivery.py), so one of the racing passes sends.

`stop` (the worker's exit) leaves a running pass to die with the process: its thread is a daemon.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

from jobs.log import get_logger
from jobs.settings import Settings

log = get_logger(__name__)

RECONCILE_S = 15.0  # how often some node of the fleet checks Redis against storage
RECONCILE_LOCK = "freight:lock:reconcile"


class ReconcileTurns:
    """Takes this node's reconcile turns and runs each pass off the caller's thread (module docstring)."""

    def __init__(
        self, client: redis.Redis, node_id: str, settings: Settings, every_s: float = RECONCILE_S
    ) -> None:
        self.client = client
        self.node_id = node_id
        self.settings = settings
        self.every_s = every_s
        self.lock_ms = max(1, int(every_s * 0.8 * 1000))  # another node's turn is not due before this
        self._next = time.monotonic() + every_s / 2
        self._pass: threading.Thread | None = None
        self._started = 0.0  # monotonic start of the latest pass
        self._stall_logged = False
        self._fleet: Any = None  # jobs.client.FleetClient, made on the first pass

    @property
    def running(self) -> bool:
        """A pass of this node is under way."""
        return self._pass is not None and self._pass.is_alive()

    def tick(self, now: float) -> bool:
        """Start a pass at `now` (unix seconds) if one is due, this node's previous one has ended and
        no other node took this turn; True if one started. Returns at once (Redis SET only)."""
        mono = time.monotonic()
        if mono < self._next:
            return False
        if self.running:
            if not self._stall_logged:
                self._stall_logged = True
                running_s = round(mono - self._started, 1)
                why = "storage or Redis is slow to answer; no pass starts here until it ends"
                log.warning("reconcile_still_running", node_id=self.node_id, running_s=running_s, why=why)
            return False
        self._next = mono + self.every_s
        if not self.client.set(RECONCILE_LOCK, self.node_id, nx=True, px=self.lock_ms):
            return False  # another node took this turn
        self._started, self._stall_logged = mono, False
        self._pass = threading.Thread(target=self._run, args=(now,), name="freight-reconcile", daemon=True)
        self._pass.start()
        return True

    def _run(self, now: float) -> None:
        try:
            self.run_pass(now)
        except redis.RedisError as exc:
            log.warning("reconcile_failed", node_id=self.node_id, error=str(exc))
        except Exception:  # storage away, or a bug: the next turn tries again
            log.exception("reconcile_error", node_id=self.node_id)
        took = time.monotonic() - self._started
        if took > self.every_s:
            log.warning("reconcile_pass_slow", node_id=self.node_id, took_s=round(took, 1))

    def run_pass(self, now: float) -> None:
        """One pass of jobs/reconcile.py over every job, on the calling thread."""
        from jobs.client import FleetClient
        from jobs.reconcile import Reconciler

        if self._fleet is None:
            self._fleet = FleetClient(self.settings, retry_for_s=5.0)
        Reconciler(self._fleet, self.settings).run(now)
