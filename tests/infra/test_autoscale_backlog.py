"""The Redis backlog reader and the policy's state store, against a real Redis (DB 13)."""

from __future__ import annotations

import json

import kombu
import pytest

from jobs.autoscale.backlog import RedisBacklogReader, queue_lists
from jobs.autoscale.policy import ScalerState
from jobs.autoscale.state import RedisStateStore

NOW = 1_800_000_000.0


def test_counts_shards_that_kombu_queued_with_priorities(redis_url, rdb):
    """Messages published by kombu itself, at several priorities, land in lists the reader counts."""
    rdb.sadd("freight:queues", "freight.model-a", "freight.model-b")
    with kombu.Connection(redis_url) as conn:
        for queue_name, priorities in (("freight.model-a", [0, 5, 9, 9]), ("freight.model-b", [3])):
            queue = kombu.Queue(queue_name, routing_key=queue_name, max_priority=9)
            producer = conn.Producer(serializer="json")
            for priority in priorities:
                producer.publish(
                    {"shard": priority},
                    routing_key=queue_name,
                    declare=[queue],
                    priority=priority,
                    exchange="",
                )
        other = kombu.Queue("celery", routing_key="celery")
        conn.Producer(serializer="json").publish({"x": 1}, routing_key="celery", declare=[other], exchange="")
    # kombu really did use sub-queues (so the test checks the naming, not only the plain list)
    assert any(rdb.llen(name) for name in queue_lists("freight.model-a")[1:])
    assert RedisBacklogReader(rdb).queued_shards() == 5  # "celery" is not a freight queue


def test_no_queues_no_shards(rdb):
    assert RedisBacklogReader(rdb).queued_shards() == 0


def test_reads_job_hashes_as_documented(rdb):
    rdb.hset(
        "freight:job:j1",
        mapping={
            "state": "running",
            "shards_total": 10,
            "shards_queued": 6,
            "shards_running": 2,
            "shards_committed": 2,
            "est_tokens_queued": 120000,
            "updated_at": NOW,
        },
    )
    rdb.hset("freight:job:j2", mapping={"state": "queued", "shards_queued": 3, "est_tokens_queued": "9000.5"})
    rdb.hset("freight:job:j2", "deadline", NOW + 3600)
    rdb.hset("freight:job:j3", mapping={"state": "running", "shards_queued": "lots", "shards_running": 1})
    rdb.set("freight:job:j1:cancel", "1")  # a deeper key is not a job hash
    jobs = {j.job_id: j for j in RedisBacklogReader(rdb).jobs()}
    assert set(jobs) == {"j1", "j2", "j3"}
    assert (jobs["j1"].shards_queued, jobs["j1"].shards_running, jobs["j1"].est_tokens_queued) == (
        6,
        2,
        120000.0,
    )
    assert jobs["j1"].deadline is None and jobs["j1"].updated_at == NOW
    assert jobs["j2"].updated_at is None
    assert (jobs["j2"].state, jobs["j2"].est_tokens_queued, jobs["j2"].deadline) == (
        "queued",
        9000.5,
        NOW + 3600,
    )
    assert (jobs["j3"].shards_queued, jobs["j3"].shards_running) == (0, 1)  # malformed field -> 0


def test_a_non_hash_job_key_is_skipped(rdb):
    rdb.set("freight:job:weird", "not a hash")
    rdb.hset("freight:job:ok", mapping={"state": "running", "shards_queued": 1})
    assert [j.job_id for j in RedisBacklogReader(rdb).jobs()] == ["ok"]


def test_reads_worker_heartbeats_and_skips_malformed_ones(rdb):
    beat = {
        "busy": True,
        "instance_id": "i-0abc",
        "queue": "freight.m",
        "tokens_per_second": 812.5,
        "heartbeat": NOW,
    }
    rdb.hset(
        "freight:workers",
        mapping={
            "w1": json.dumps(beat),
            "w2": json.dumps({**beat, "busy": False, "instance_id": None, "tokens_per_second": 0.0}),
            "w3": "{not json",
            "w4": json.dumps({"busy": True}),  # no heartbeat
        },
    )
    workers = {w.worker_id: w for w in RedisBacklogReader(rdb).workers()}
    assert set(workers) == {"w1", "w2"}
    assert (workers["w1"].busy, workers["w1"].instance_id, workers["w1"].tokens_per_second) == (
        True,
        "i-0abc",
        812.5,
    )
    assert (workers["w2"].busy, workers["w2"].instance_id) == (False, None)


def test_read_builds_the_backlog_snapshot(rdb):
    rdb.sadd("freight:queues", "freight.m")
    rdb.rpush("freight.m", "a", "b", "c")
    rdb.rpush("freight.m\x06\x166", "d")
    rdb.hset(
        "freight:job:j",
        mapping={"state": "running", "shards_queued": 4, "shards_running": 1, "est_tokens_queued": 4000},
    )
    rdb.hset("freight:job:old", mapping={"state": "succeeded", "shards_running": 0, "est_tokens_queued": 999})
    beat = {
        "busy": True,
        "instance_id": "i-1",
        "queue": "freight.m",
        "tokens_per_second": 100.0,
        "heartbeat": NOW,
    }
    rdb.hset("freight:workers", "w1", json.dumps(beat))
    backlog = RedisBacklogReader(rdb).read()
    assert backlog.queued_shards == 4
    assert backlog.est_tokens_queued == 4000.0  # the finished job's leftover estimate is not work
    assert backlog.running_shards(NOW) == 1
    assert [w.instance_id for w in backlog.busy_workers(NOW)] == ["i-1"]
    assert backlog.busy_workers(NOW + 61) == ()  # heartbeat older than 60 s: gone


def test_state_store_round_trip(rdb):
    store = RedisStateStore(rdb, "freight-workers")
    assert store.load() == ScalerState()
    store.save(ScalerState(idle_since=NOW - 5.25, scale_in_pending_since=None), NOW)
    assert store.load() == ScalerState(idle_since=NOW - 5.25)
    assert 0 < rdb.ttl("freight:autoscaler:freight-workers") <= 7 * 24 * 3600
    store.save(ScalerState(scale_in_pending_since=NOW), NOW)
    assert store.load() == ScalerState(scale_in_pending_since=NOW)


def test_state_store_needs_a_group(rdb):
    with pytest.raises(ValueError, match="group_name"):
        RedisStateStore(rdb, "")
