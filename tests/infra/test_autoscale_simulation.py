"""The policy driving a simulated spot fleet through a day of jobs: booting takes minutes, workers
take one shard at a time, the group only terminates unprotected instances. Checks behaviour over
time rather than single decisions: every shard finishes, deadlines are met, busy workers are never
terminated, the fleet does not flap and it returns to zero when the work is done."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from jobs.autoscale.policy import Backlog, JobBacklog, ScalerState, ScalingLimits, decide
from jobs.progress import WorkerBeat

STEP_S = 10
TICK_S = 60
BOOT_S = 300  # spot launch + bootstrap
TPS = 1000.0  # tokens per second of one worker
LIMITS = ScalingLimits(
    max_workers=12,
    scale_in_cooldown_s=300,
    idle_to_zero_s=600,
    target_drain_s=1800,
    default_tokens_per_second=800,
)


@dataclass
class Instance:
    id: str
    ready_at: float
    shard: tuple[str, float] | None = None  # (job id, tokens left)
    protected: bool = False
    worked: bool = False


@dataclass
class Job:
    id: str
    arrival: float
    shards: int
    tokens_per_shard: float
    deadline: float | None = None
    queued: int = 0
    running: int = 0
    done: int = 0
    finished_at: float | None = None


@dataclass
class Fleet:
    jobs: list[Job]
    instances: list[Instance] = field(default_factory=list)
    queue: list[tuple[str, float]] = field(default_factory=list)
    desired: int = 0
    launched: int = 0
    instance_seconds: float = 0.0
    busy_terminated: int = 0
    history: list[tuple[float, int, str]] = field(default_factory=list)

    def backlog(self, now: float) -> Backlog:
        jobs = tuple(
            JobBacklog(j.id, "running", j.queued, j.running, j.queued * j.tokens_per_shard, j.deadline, now)
            for j in self.jobs
            if j.arrival <= now and j.finished_at is None
        )
        beats = tuple(
            WorkerBeat(i.id, i.shard is not None, i.id, "q", TPS if i.worked else 0.0, now)
            for i in self.instances
            if i.ready_at <= now
        )
        return Backlog(len(self.queue), jobs, beats)

    def tick(self, state: ScalerState, now: float) -> ScalerState:
        backlog = self.backlog(now)
        decision = decide(backlog, self.desired, state, LIMITS, now)
        busy = {w.instance_id for w in backlog.busy_workers(now)}
        for inst in self.instances:  # protect busy ones, release the others (the adapter's rule)
            inst.protected = inst.id in busy
        self.desired = decision.desired
        self.history.append((now, decision.desired, decision.reason))
        return decision.state

    def reconcile(self, now: float) -> None:
        """The Auto Scaling group: launch up to desired; terminate unprotected instances down to it."""
        while len(self.instances) < self.desired:
            self.launched += 1
            self.instances.append(Instance(f"i-{self.launched:04d}", now + BOOT_S))
        excess = len(self.instances) - self.desired
        for inst in sorted(self.instances, key=lambda i: (i.ready_at <= now, i.shard is not None)):
            if excess <= 0:
                break
            if not inst.protected:
                if inst.shard is not None:
                    self.busy_terminated += 1
                self.instances.remove(inst)
                excess -= 1

    def step(self, now: float) -> None:
        for job in self.jobs:
            if job.arrival == now:
                self.queue += [(job.id, job.tokens_per_shard)] * job.shards
                job.queued = job.shards
        by_id = {j.id: j for j in self.jobs}
        for inst in self.instances:
            if inst.ready_at > now:
                continue
            self.instance_seconds += STEP_S
            if inst.shard is None and self.queue:
                inst.shard = self.queue.pop(0)
                by_id[inst.shard[0]].queued -= 1
                by_id[inst.shard[0]].running += 1
            if inst.shard is not None:
                job_id, left = inst.shard
                left -= TPS * STEP_S
                inst.worked = True
                if left <= 0:
                    job = by_id[job_id]
                    job.running -= 1
                    job.done += 1
                    if job.done == job.shards:
                        job.finished_at = now + STEP_S
                    inst.shard = None
                else:
                    inst.shard = (job_id, left)


def simulate(jobs: list[Job], seconds: int) -> Fleet:
    fleet = Fleet(jobs)
    state = ScalerState()
    for now in range(0, seconds, STEP_S):
        if now % TICK_S == 0:
            state = fleet.tick(state, float(now))
        fleet.reconcile(float(now))
        fleet.step(float(now))
    return fleet


def day_of_jobs() -> list[Job]:
    return [
        Job("burst", arrival=600, shards=40, tokens_per_shard=600_000),  # 24M tokens
        Job("small", arrival=9000, shards=3, tokens_per_shard=200_000),
        Job("urgent", arrival=20000, shards=24, tokens_per_shard=500_000, deadline=20000 + 2400),
        Job("late", arrival=40000, shards=8, tokens_per_shard=900_000),
    ]


def test_every_job_finishes_and_deadlines_hold():
    fleet = simulate(day_of_jobs(), 86400)
    for job in fleet.jobs:
        assert job.finished_at is not None, job.id
        assert job.done == job.shards
    urgent = next(j for j in fleet.jobs if j.id == "urgent")
    assert urgent.finished_at <= urgent.deadline


def test_busy_workers_are_never_terminated_and_limits_hold():
    fleet = simulate(day_of_jobs(), 86400)
    assert fleet.busy_terminated == 0
    assert all(0 <= desired <= LIMITS.max_workers for _, desired, _ in fleet.history)


def test_fleet_returns_to_zero_after_the_idle_period():
    jobs = day_of_jobs()
    fleet = simulate(jobs, 86400)
    last = max(j.finished_at for j in jobs)
    # zero at the first tick after the idle period, give or take a tick and the cooldown
    zero_at = next(t for t, desired, _ in fleet.history if t > last and desired == 0)
    assert zero_at - last <= LIMITS.idle_to_zero_s + LIMITS.scale_in_cooldown_s + 2 * TICK_S
    assert fleet.instances == [] and fleet.desired == 0
    # between jobs (the 'small' job arrives ~2 h after 'burst' ends) it was at zero too
    assert any(desired == 0 and 4000 < t < 9000 for t, desired, _ in fleet.history)


def test_no_flapping():
    fleet = simulate(day_of_jobs(), 86400)
    directions = []
    previous = 0
    for _, desired, _ in fleet.history:
        if desired != previous:
            directions.append(1 if desired > previous else -1)
        previous = desired
    reversals = sum(1 for a, b in zip(directions, directions[1:], strict=False) if a != b)
    # each of the 4 jobs may cause one rise and one fall (plus a rise inside a burst): few reversals
    assert reversals <= 2 * len(day_of_jobs()) + 2, fleet.history


def test_cheaper_than_an_always_on_fleet_and_not_much_slower():
    jobs = day_of_jobs()
    fleet = simulate(jobs, 86400)
    always_on = LIMITS.max_workers * 86400
    assert fleet.instance_seconds < 0.25 * always_on
    # the burst: 24M tokens at 1000 tok/s per worker, at most 12 workers and one per shard
    burst = jobs[0]
    ideal = math.ceil(burst.shards / LIMITS.max_workers) * burst.tokens_per_shard / TPS
    assert burst.finished_at - burst.arrival <= ideal + BOOT_S + LIMITS.target_drain_s
