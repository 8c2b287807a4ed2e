"""Table-driven tests of the pure scaling policy: burst, drain, idle to zero, deadline pressure, limits."""

from __future__ import annotations

import pytest

from jobs.autoscale.policy import (
    Backlog,
    JobBacklog,
    ScalerState,
    ScalingLimits,
    decide,
    demand,
)
from jobs.progress import WorkerBeat

NOW = 1_800_000_000.0
LIMITS = ScalingLimits(
    min_workers=0,
    max_workers=16,
    scale_in_cooldown_s=300,
    idle_to_zero_s=600,
    target_drain_s=1800,
    default_tokens_per_second=500,
)


def workers(
    busy: int = 0, idle: int = 0, tps: float = 0.0, age: float = 5.0, at: float = NOW
) -> tuple[WorkerBeat, ...]:
    beats = []
    for i in range(busy + idle):
        beats.append(
            WorkerBeat(
                worker_id=f"w{i}",
                busy=i < busy,
                instance_id=f"i-{i:04d}",
                queue="freight.tiny",
                tokens_per_second=tps,
                heartbeat=at - age,
            )
        )
    return tuple(beats)


def job(
    queued: int,
    running: int = 0,
    tokens: float = 0.0,
    deadline: float | None = None,
    state: str = "running",
    updated_at: float | None = None,
):
    return JobBacklog(
        f"job-{queued}-{running}-{tokens}", state, queued, running, tokens, deadline, updated_at
    )


# (case, backlog, current, state, limits, expected desired, expected reason)
CASES = [
    # burst: the queue sizes the fleet from the estimated tokens at the default throughput
    ("burst_from_zero", Backlog(40, (job(40, tokens=4e6),)), 0, ScalerState(), LIMITS, 5, "scale_out"),
    ("burst_no_estimate_one_per_shard", Backlog(3, (job(3),)), 0, ScalerState(), LIMITS, 3, "scale_out"),
    (
        "burst_never_more_than_shards",
        Backlog(2, (job(2, tokens=1e12),)),
        0,
        ScalerState(),
        LIMITS,
        2,
        "scale_out",
    ),
    (
        "burst_capped_by_max",
        Backlog(100, (job(100, tokens=1e12),)),
        3,
        ScalerState(),
        LIMITS,
        16,
        "scale_out",
    ),
    (
        "burst_tiny_backlog_gets_one",
        Backlog(5, (job(5, tokens=10),)),
        0,
        ScalerState(),
        LIMITS,
        1,
        "scale_out",
    ),
    (
        # 4 busy workers measure 2000 tok/s each: 36M tokens in 1800 s need 10 more
        "burst_uses_measured_throughput",
        Backlog(20, (job(20, 4, tokens=36e6),), workers(busy=4, tps=2000)),
        4,
        ScalerState(),
        LIMITS,
        14,
        "scale_out",
    ),
    (
        "stale_heartbeats_do_not_count",
        Backlog(0, (), workers(busy=3, tps=2000, age=120)),
        3,
        ScalerState(idle_since=NOW - 700),
        LIMITS,
        0,
        "idle_to_min",
    ),
    # drain: queue empty, a few shards still running; shrink only after the cooldown
    (
        "drain_holds_during_cooldown",
        Backlog(0, (job(0, 3),), workers(busy=3, idle=7)),
        10,
        ScalerState(),
        LIMITS,
        10,
        "hold_cooldown",
    ),
    (
        "drain_scales_in_after_cooldown",
        Backlog(0, (job(0, 3),), workers(busy=3, idle=7)),
        10,
        ScalerState(scale_in_pending_since=NOW - 300),
        LIMITS,
        3,
        "scale_in",
    ),
    (
        "never_below_busy_workers_even_if_counters_lag",
        Backlog(0, (job(0, 0),), workers(busy=5, idle=1)),
        6,
        ScalerState(scale_in_pending_since=NOW - 1000),
        LIMITS,
        5,
        "scale_in",
    ),
    (
        "never_below_busy_workers_when_max_lowered",
        Backlog(0, (job(0, 6),), workers(busy=6)),
        6,
        ScalerState(),
        ScalingLimits(max_workers=4),
        6,
        "steady",
    ),
    # idle: hold warm workers for idle_to_zero_s, then go to min_workers
    ("idle_holds_fleet", Backlog(0), 3, ScalerState(), LIMITS, 3, "idle_hold"),
    ("idle_holds_until_period", Backlog(0), 3, ScalerState(idle_since=NOW - 599), LIMITS, 3, "idle_hold"),
    (
        "idle_to_zero",
        Backlog(0, (), workers(idle=3)),
        3,
        ScalerState(idle_since=NOW - 600),
        LIMITS,
        0,
        "idle_to_min",
    ),
    (
        "idle_to_min_workers",
        Backlog(0),
        3,
        ScalerState(idle_since=NOW - 600),
        ScalingLimits(min_workers=1, max_workers=4),
        1,
        "idle_to_min",
    ),
    ("idle_at_zero_stays", Backlog(0), 0, ScalerState(idle_since=NOW - 9999), LIMITS, 0, "steady"),
    (
        "finished_jobs_are_not_work",
        Backlog(0, (job(0, 0, tokens=5e6, state="succeeded"),)),
        2,
        ScalerState(idle_since=NOW - 600),
        LIMITS,
        0,
        "idle_to_min",
    ),
    # deadline pressure: 3M tokens at 500 tok/s need 4 workers in 1800 s but 10 in 600 s
    ("no_deadline_baseline", Backlog(20, (job(20, tokens=3e6),)), 0, ScalerState(), LIMITS, 4, "scale_out"),
    (
        "deadline_raises_fleet",
        Backlog(20, (job(20, tokens=3e6, deadline=NOW + 600),)),
        0,
        ScalerState(),
        LIMITS,
        10,
        "scale_out",
    ),
    (
        "deadline_passed_takes_all_parallelism",
        Backlog(12, (job(12, tokens=3e6, deadline=NOW - 1),)),
        0,
        ScalerState(),
        LIMITS,
        12,
        "scale_out",
    ),
    (
        # the deadline job needs 10, the other job keeps its own 2 beside it
        "deadline_job_beside_other_job",
        Backlog(30, (job(20, tokens=3e6, deadline=NOW + 600), job(10, tokens=1.5e6))),
        0,
        ScalerState(),
        LIMITS,
        12,
        "scale_out",
    ),
    (
        "far_deadline_changes_nothing",
        Backlog(20, (job(20, tokens=3e6, deadline=NOW + 86400),)),
        0,
        ScalerState(),
        LIMITS,
        4,
        "scale_out",
    ),
    # stale counters: a worker killed mid-shard leaves shards_running behind; it must not hold the fleet
    (
        "fresh_running_counter_counts_before_first_busy_beat",
        Backlog(0, (job(0, 2, updated_at=NOW - 5),)),
        0,
        ScalerState(),
        LIMITS,
        2,
        "scale_out",
    ),
    (
        # the job still counts 2 running shards that no queue, unacked message or busy worker shows
        # (Redis lost them): one worker stays for the reconciler that queues them again
        "unaccounted_shards_keep_one_worker_for_the_reconciler",
        Backlog(0, (job(0, 2, updated_at=NOW - 121),), workers(idle=2)),
        2,
        ScalerState(idle_since=NOW - 600),
        LIMITS,
        2,
        "hold_cooldown",
    ),
    (
        "unaccounted_shards_bring_a_worker_back_from_zero",
        Backlog(0, (job(1, updated_at=NOW - 3600),)),
        0,
        ScalerState(idle_since=NOW - 6000),
        LIMITS,
        1,
        "scale_out",
    ),
    (
        # a vanished worker's delivered shard (unacked, no busy heartbeat) is work: never zero under it
        "unacked_shard_of_a_vanished_worker_is_demand",
        Backlog(0, (job(0, 1, updated_at=NOW - 600),), unacked_shards=1),
        1,
        ScalerState(),
        LIMITS,
        1,
        "steady",
    ),
    # limits
    (
        "min_workers_floor_with_work",
        Backlog(1, (job(1, tokens=10),)),
        0,
        ScalerState(),
        ScalingLimits(min_workers=2),
        2,
        "scale_out",
    ),
    (
        "scale_out_clears_pending_scale_in",
        Backlog(50, (job(50, tokens=1e12),)),
        4,
        ScalerState(scale_in_pending_since=NOW - 100),
        LIMITS,
        16,
        "scale_out",
    ),
    (
        "demand_back_to_fleet_is_steady",
        Backlog(2, (job(2, 3, tokens=1e12),), workers(busy=3)),
        5,
        ScalerState(scale_in_pending_since=NOW - 100),
        LIMITS,
        5,
        "steady",
    ),
    (
        "lowered_max_scales_in_at_once",
        Backlog(100, (job(100, tokens=1e12),)),
        10,
        ScalerState(),
        ScalingLimits(max_workers=4),
        4,
        "scale_in",
    ),
]


@pytest.mark.parametrize(
    ("backlog", "current", "state", "limits", "expected", "reason"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_decide_table(backlog, current, state, limits, expected, reason):
    decision = decide(backlog, current, state, limits, NOW)
    assert (decision.desired, decision.reason) == (expected, reason)
    assert decision.current == current
    assert limits.min_workers <= decision.desired
    assert decision.desired >= len(backlog.busy_workers(NOW))


def test_cooldown_window_starts_when_demand_first_falls():
    backlog = Backlog(0, (job(0, 2),), workers(busy=2, idle=4))
    first = decide(backlog, 6, ScalerState(), LIMITS, NOW)
    assert first.state.scale_in_pending_since == NOW
    later = decide(backlog, 6, first.state, LIMITS, NOW + 299)
    assert (later.desired, later.state.scale_in_pending_since) == (6, NOW)
    done = decide(backlog, 6, later.state, LIMITS, NOW + 300)
    assert (done.desired, done.state) == (2, ScalerState())


def test_timeline_burst_drain_idle_to_zero():
    """A job arrives, runs, drains and the fleet goes back to zero: desired count tick by tick."""
    ticks = [
        # (seconds, queued shards, jobs, busy workers, idle workers); workers measure 1000 tok/s
        (0, 0, (), 0, 0),
        (60, 8, (job(8, tokens=8e6),), 0, 0),  # 8M tokens at the default 500 tok/s: 9 -> one per shard
        (120, 4, (job(4, 4, tokens=4e6),), 4, 0),  # 4 running + ceil(4e6 / 1.8e6) = 7 < 8: hold
        (180, 0, (job(0, 4),), 4, 4),  # still 4 < 8: cooldown runs since 120
        (420, 0, (job(0, 1),), 1, 7),  # 300 s below the fleet: scale in to the one busy worker
        (540, 0, (), 0, 1),  # idle window starts
        (1139, 0, (), 0, 1),
        (1140, 0, (), 0, 1),  # idle 600 s: zero
    ]
    current, state, seen = 0, ScalerState(), []
    for offset, queued, jobs, busy, idle in ticks:
        backlog = Backlog(queued, jobs, workers(busy, idle, tps=1000, at=NOW + offset))
        decision = decide(backlog, current, state, LIMITS, NOW + offset)
        current, state = decision.desired, decision.state
        seen.append((current, decision.reason))
    assert seen == [
        (0, "steady"),
        (8, "scale_out"),
        (8, "hold_cooldown"),
        (8, "hold_cooldown"),
        (1, "scale_in"),
        (1, "idle_hold"),
        (1, "idle_hold"),
        (0, "idle_to_min"),
    ]


def test_demand_counts_priority_of_queue_over_stale_job_counters():
    # the job hash still says 10 queued, but the queue holds 2: at most 2 more workers
    assert demand(Backlog(2, (job(10, tokens=1e12),)), LIMITS, NOW) == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_workers": -1}, "min_workers"),
        ({"max_workers": 0}, "max_workers"),
        ({"min_workers": 5, "max_workers": 4}, "max_workers"),
        ({"scale_in_cooldown_s": -1}, "scale_in_cooldown_s"),
        ({"target_drain_s": 0}, "target_drain_s"),
        ({"default_tokens_per_second": 0}, "default_tokens_per_second"),
    ],
)
def test_limits_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ScalingLimits(**kwargs)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="queued_shards"):
        Backlog(-1)
    with pytest.raises(ValueError, match="current desired capacity"):
        decide(Backlog(0), -1, ScalerState(), LIMITS, NOW)
