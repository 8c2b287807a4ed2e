"""The scaling policy: a pure function from the backlog to a desired worker count.

No I/O here: the caller reads the backlog (Redis), the group's current desired capacity (AWS) and the
policy's own small state, and passes `now` explicitly, so every rule is a table-driven unit test.

Units: tokens are completion (generated) tokens on both sides. A job's `est_tokens_queued` is the
sum over its queued shards of rows x max_tokens (the most those rows can generate); a worker's
`tokens_per_second` is the completion tokens it generated over the last minute, per second. Prompt
tokens are in neither: their cost shows as a lower completion rate. Times are unix seconds. One
worker runs one shard at a time (`freight worker --concurrency 1`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from jobs.progress import FINISHED_JOB_STATES, WORKER_GONE_AFTER_S, WorkerBeat

# A job's shards_running counter is trusted only this long after the hash last changed: a running
# shard's worker is busy and heartbeating, so the counter matters only in the seconds before that
# worker's next beat. Stale counters (a worker killed mid-shard) must not keep the fleet up.
JOB_COUNTERS_FRESH_S = 2 * WORKER_GONE_AFTER_S


@dataclass(frozen=True)
class JobBacklog:
    """The part of one `freight:job:<id>` hash that sizes the fleet."""

    job_id: str
    state: str
    shards_queued: int
    shards_running: int
    est_tokens_queued: float
    deadline: float | None = None  # unix seconds by which the job should finish; None: no deadline
    updated_at: float | None = None  # unix seconds of the hash's last change; None: unknown (trusted)

    @property
    def is_active(self) -> bool:
        return self.state not in FINISHED_JOB_STATES and self.shards_queued + self.shards_running > 0


@dataclass(frozen=True)
class Backlog:
    """Everything the policy reads from Redis at one instant.

    `queued_shards` is the queue's own truth (LLEN of every freight queue and its priority sub-queues);
    the job hashes add the token estimates, running counts and deadlines.
    """

    queued_shards: int
    jobs: tuple[JobBacklog, ...] = ()
    workers: tuple[WorkerBeat, ...] = ()
    unacked_shards: int = 0  # messages delivered to a worker and not yet acked (kombu's `unacked`)

    def __post_init__(self) -> None:
        if self.queued_shards < 0:
            raise ValueError(f"queued_shards must be >= 0, got {self.queued_shards}")
        if self.unacked_shards < 0:
            raise ValueError(f"unacked_shards must be >= 0, got {self.unacked_shards}")

    @property
    def est_tokens_queued(self) -> float:
        return float(sum(max(j.est_tokens_queued, 0.0) for j in self.jobs if j.is_active))

    def live_workers(self, now: float) -> tuple[WorkerBeat, ...]:
        return tuple(w for w in self.workers if w.is_live(now))

    def busy_workers(self, now: float) -> tuple[WorkerBeat, ...]:
        return tuple(w for w in self.live_workers(now) if w.busy)

    def running_shards(self, now: float) -> int:
        """Shards being worked on: the busy heartbeats, the unacked messages (delivered, not done: a
        running shard, or one of a vanished worker that the reaper puts back), or the fresh job
        counters, whichever says more."""
        counted = sum(
            j.shards_running
            for j in self.jobs
            if j.is_active and (j.updated_at is None or now - j.updated_at <= JOB_COUNTERS_FRESH_S)
        )
        return max(counted, len(self.busy_workers(now)), self.unacked_shards)

    def unfinished_jobs(self) -> bool:
        """True while some job's live state still counts queued or running shards."""
        return any(j.is_active for j in self.jobs)


@dataclass(frozen=True)
class ScalingLimits:
    """Bounds and pacing of the policy. Validated on construction."""

    min_workers: int = 0
    max_workers: int = 8
    scale_in_cooldown_s: float = 300.0  # demand must stay below the fleet this long before it shrinks
    idle_to_zero_s: float = 600.0  # no work at all for this long: go to min_workers
    target_drain_s: float = 1800.0  # size the fleet to finish the queued tokens within this
    default_tokens_per_second: float = 500.0  # per worker, until a live worker reports its own

    def __post_init__(self) -> None:
        if self.min_workers < 0:
            raise ValueError(f"min_workers must be >= 0, got {self.min_workers}")
        if self.max_workers < max(self.min_workers, 1):
            raise ValueError(
                f"max_workers ({self.max_workers}) must be >= 1 and >= min_workers ({self.min_workers})"
            )
        for name in ("scale_in_cooldown_s", "idle_to_zero_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 seconds, got {getattr(self, name)}")
        for name in ("target_drain_s", "default_tokens_per_second"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class ScalerState:
    """What the policy remembers between ticks (persisted by the caller)."""

    idle_since: float | None = None  # first tick with no queued, running or busy work
    scale_in_pending_since: float | None = None  # first tick the demand fell below the fleet


@dataclass(frozen=True)
class Decision:
    desired: int  # the worker count to set on the group
    current: int  # the group's desired capacity before this tick
    demand: int  # workers the backlog asks for, before limits, cooldown and idle rules
    reason: str  # scale_out | scale_in | steady | hold_cooldown | idle_hold | idle_to_min
    state: ScalerState = field(default_factory=ScalerState)

    @property
    def changed(self) -> bool:
        return self.desired != self.current


def measured_tokens_per_second(backlog: Backlog, now: float, default: float) -> float:
    """Mean completion tokens per second of the live workers that report one; `default` until any does."""
    rates = [w.tokens_per_second for w in backlog.live_workers(now) if w.tokens_per_second > 0]
    return sum(rates) / len(rates) if rates else default


def _workers_for(tokens: float, shards: int, tokens_per_second: float, seconds: float) -> int:
    """Workers that finish `tokens` spread over `shards` queued shards within `seconds`.

    At least one worker while shards are queued, never more than one per queued shard. Without a
    token estimate every queued shard gets a worker.
    """
    if shards <= 0:
        return 0
    if tokens <= 0:
        return shards
    if seconds <= 0:  # deadline already passed: all the parallelism the shards allow
        return shards
    return min(shards, max(1, math.ceil(tokens / (tokens_per_second * seconds))))


def demand(backlog: Backlog, limits: ScalingLimits, now: float) -> int:
    """Workers the backlog asks for: those running shards plus those that drain the queue in time."""
    queued = backlog.queued_shards
    running = backlog.running_shards(now)
    tps = measured_tokens_per_second(backlog, now, limits.default_tokens_per_second)
    extra = _workers_for(backlog.est_tokens_queued, queued, tps, limits.target_drain_s)
    # deadline pressure: a job with a deadline gets the workers that finish its queued tokens before
    # it; the jobs without one keep their drain-time share beside them. Capped by the queue.
    pressed = 0
    rest_tokens, rest_shards = 0.0, 0
    for job in backlog.jobs:
        if not job.is_active or job.shards_queued <= 0:
            continue
        if job.deadline is None:
            rest_tokens += max(job.est_tokens_queued, 0.0)
            rest_shards += job.shards_queued
        else:
            pressed += _workers_for(job.est_tokens_queued, job.shards_queued, tps, job.deadline - now)
    if pressed:
        pressed += _workers_for(rest_tokens, rest_shards, tps, limits.target_drain_s)
    want = running + min(max(extra, pressed), queued)
    # A job still counts shards to run while no queue, unacked message or busy worker shows them
    # (Redis lost its queue keys, or a shard's message was dropped): one worker, whose reconciler
    # queues them again (jobs/reconcile.py), so the fleet never scales to zero under unfinished work.
    return max(want, 1) if backlog.unfinished_jobs() else want


def decide(backlog: Backlog, current: int, state: ScalerState, limits: ScalingLimits, now: float) -> Decision:
    """The desired worker count for this tick, and the state to keep for the next one.

    Rules, in order: with no work at all, hold the fleet for `idle_to_zero_s`, then go to
    `min_workers`; scale out at once; scale in only after the demand has stayed below the fleet for
    `scale_in_cooldown_s`; never below the busy workers; within [min_workers, max_workers].
    """
    if current < 0:
        raise ValueError(f"current desired capacity must be >= 0, got {current}")
    busy = len(backlog.busy_workers(now))
    want = demand(backlog, limits, now)
    floor = max(limits.min_workers, busy)
    target = max(min(want, limits.max_workers), floor)

    if want == 0:  # no queued shard, no running shard, no busy worker
        idle_since = state.idle_since if state.idle_since is not None else now
        if now - idle_since >= limits.idle_to_zero_s:
            desired = limits.min_workers
            reason = "idle_to_min" if desired != current else "steady"
        else:
            desired = min(max(current, limits.min_workers), limits.max_workers)
            reason = "idle_hold" if desired > limits.min_workers else "steady"
        return Decision(desired, current, want, reason, ScalerState(idle_since=idle_since))

    if target > current:
        return Decision(target, current, want, "scale_out", ScalerState())
    if target == current:
        return Decision(target, current, want, "steady", ScalerState())
    pending = state.scale_in_pending_since if state.scale_in_pending_since is not None else now
    if now - pending >= limits.scale_in_cooldown_s:
        return Decision(target, current, want, "scale_in", ScalerState())
    held = min(current, limits.max_workers)
    if held <= target:
        return Decision(target, current, want, "scale_in", ScalerState())
    return Decision(held, current, want, "hold_cooldown", ScalerState(scale_in_pending_since=pending))
