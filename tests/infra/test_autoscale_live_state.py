"""The autoscaler reads what the distributed mode really writes: shards queued by FleetClient (Celery
messages, with priorities) and progress and heartbeats written by LiveState, on real Redis (DB 13)."""

from __future__ import annotations

import time

from jobs.autoscale.backlog import RedisBacklogReader
from jobs.autoscale.policy import ScalerState, ScalingLimits, decide
from jobs.client import FleetClient
from jobs.live_state import LiveState
from jobs.progress import WorkerBeat
from jobs.settings import Settings


def test_reader_sees_fleet_client_submissions_and_worker_progress(redis_url, rdb):
    client = FleetClient(Settings(redis_url=redis_url))
    try:
        # two jobs of one model: one at the default priority, one at priority 5 (a kombu sub-queue)
        first = client.enqueue(
            job_id="a" * 16,
            output="s3://b/jobs/a/",
            model="s3://b/models/m",
            shard_tokens=dict.fromkeys(range(4), 1000),
        )
        client.enqueue(
            job_id="b" * 16,
            output="s3://b/jobs/b/",
            model="s3://b/models/m",
            shard_tokens=dict.fromkeys(range(3), 2000),
            committed=[0],
            priority=5,
        )
    finally:
        client.close()
    reader = RedisBacklogReader(rdb)
    backlog = reader.read()
    assert backlog.queued_shards == 6  # 4 + (3 - 1 committed), across the priority lists
    assert backlog.est_tokens_queued == 4 * 1000 + 2 * 2000
    assert {j.job_id: (j.state, j.shards_queued) for j in backlog.jobs} == {
        "a" * 16: ("queued", 4),
        "b" * 16: ("queued", 2),
    }

    # a worker takes shard 0 of job a: it leaves the queue list and is counted as running
    live = LiveState(redis_url)
    try:
        rdb.lpop(first.queue)  # what the broker does when a worker reserves the message
        live.transition("a" * 16, 0, "running")
        now = time.time()
        live.heartbeat(WorkerBeat("w1", True, "i-0abc", first.queue, 750.0, now))
        live.heartbeat(WorkerBeat("w2", False, "i-0def", first.queue, 0.0, now))
    finally:
        live.close()
    backlog = reader.read()
    assert backlog.queued_shards == 5
    assert backlog.est_tokens_queued == 3 * 1000 + 2 * 2000
    assert backlog.running_shards(now) == 1
    assert [w.instance_id for w in backlog.busy_workers(now)] == ["i-0abc"]
    # 7000 tokens at 750 tok/s drain in far less than target_drain_s: one more worker is enough
    decision = decide(backlog, 2, ScalerState(), ScalingLimits(), now)
    assert (decision.demand, decision.desired, decision.reason) == (2, 2, "steady")


def test_heartbeat_rate_and_backlog_count_the_same_tokens(redis_url, rdb):
    """A prompt-heavy job: 40 shards of 10 rows, max_tokens 100 (est 40,000 completion tokens).

    The worker's last minute: 60 rows of 900 prompt + 100 completion tokens, i.e. 100 completion
    tokens/s. Draining 40,000 completion tokens in 100 s at that rate takes 4 workers; a rate that
    also counted prompt tokens (1,000/s) would ask for 1.
    """
    from types import SimpleNamespace

    from worker.runtime import ProcessRuntime

    settings = Settings(redis_url=redis_url)
    max_tokens, rows_per_shard = 100, 10
    client = FleetClient(settings)
    try:
        client.enqueue(
            job_id="p" * 16,
            output="s3://b/jobs/p/",
            model="s3://b/models/m",
            shard_tokens=dict.fromkeys(range(40), rows_per_shard * max_tokens),
        )
    finally:
        client.close()
    rt = ProcessRuntime(settings, worker_id="w1", queues=("q",))
    try:
        for _ in range(60):
            rt.record_row(SimpleNamespace(prompt_tokens=900, cached_tokens=0, completion_tokens=max_tokens))
        rt.beat()
    finally:
        rt.live.close()
        rt.live_fast.close()
    now = time.time()
    backlog = RedisBacklogReader(rdb).read()
    assert [w.tokens_per_second for w in backlog.live_workers(now)] == [100.0]
    limits = ScalingLimits(max_workers=10, target_drain_s=100.0)
    decision = decide(backlog, 0, ScalerState(), limits, now)
    assert (decision.demand, decision.desired, decision.reason) == (4, 4, "scale_out")
