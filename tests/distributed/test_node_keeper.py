"""The node keeper's beat and lease renewal never wait for a reconcile pass: a pass stuck on an S3
endpoint that accepts the connection and never answers (a real loopback server, boto3 over HTTP)
runs on its own thread while the keeper ticks on; no second pass starts beside it; once it ends the
next one runs; a clean stop does not wait for it. The Redis turn lock still spaces the fleet's
passes. A private redis-server (conftest)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import redis
from structlog.testing import capture_logs
from stuck_s3 import StuckS3

from jobs.leases import UNACKED_INDEX_KEY, UNACKED_KEY
from jobs.live_state import LiveState
from jobs.progress import LEASES_KEY, NODES_KEY, NodeBeat, aux_key
from jobs.settings import Settings
from worker.node import NodeKeeper, NodeState
from worker.reconcile_turns import RECONCILE_LOCK

EVERY_S = 0.5  # the keeper's reconcile period here (RECONCILE_S is 15 s); it ticks every 0.2 s
TAGS = ["tag-a", "tag-b"]


@pytest.fixture()
def stuck(monkeypatch: pytest.MonkeyPatch) -> Iterator[StuckS3]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    server = StuckS3()
    yield server
    server.close()


def _settings(redis_url: str, stuck: StuckS3) -> Settings:
    return Settings(
        redis_url=redis_url, s3_endpoint_url=stuck.url, heartbeat_s=0.2, notify_redeliver_grace_s=0.05
    )


def _finished_job(redis_url: str, job_id: str) -> None:
    """A failed job whose OUT is in the stuck bucket: the pass's notification sweep reads it there."""
    live = LiveState(redis_url)
    live.init_job(job_id, output=f"s3://stuck/{job_id}", queue="q", model="m", est_tokens={0: 1}, failed=[0])
    live.set_job_state(job_id, "failed")
    live.close()


def _held_messages(r: redis.Redis) -> None:
    """Two delivered, unacked messages (as kombu keeps them), delivered 100 s ago."""
    for tag in TAGS:
        r.hset(UNACKED_KEY, tag, json.dumps([{"body": "", "headers": {}, "properties": {}}, "", "q"]))
        r.zadd(UNACKED_INDEX_KEY, {tag: time.time() - 100})


def _keeper(redis_url: str, stuck: StuckS3, name: str = "keeper") -> NodeKeeper:
    settings = _settings(redis_url, stuck)
    return NodeKeeper(NodeState(name, serve_all=False), settings, lambda: list(TAGS), reconcile_s=EVERY_S)


def _beat(r: redis.Redis, node_id: str) -> float:
    return NodeBeat.from_json(node_id, r.hget(NODES_KEY, node_id)).heartbeat


def _wait(predicate, timeout: float, what: str) -> None:  # noqa: ANN001
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def _settle(stuck: StuckS3, *keepers: NodeKeeper) -> None:
    """Release the endpoint and let the stopped keepers' passes end (none writes into the next test)."""
    stuck.release()
    _wait(lambda: not any(k.reconcile_turns.running for k in keepers), 5, "the passes to end")


def test_a_pass_stuck_on_storage_leaves_beats_and_leases_going(redis_url: str, stuck: StuckS3) -> None:
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    _held_messages(r)
    _finished_job(redis_url, "job-one")
    keeper = _keeper(redis_url, stuck)
    node_id = keeper.node.node_id
    with capture_logs() as logs:
        keeper.start()
        try:
            assert stuck.wait_held(1, timeout=8), "the first pass never reached storage"
            hung_at = time.time()
            beats, leases = [], []
            for _ in range(10):  # 2 s: 4 reconcile periods, 10 keeper ticks
                time.sleep(0.2)
                beats.append(_beat(r, node_id))
                leases.append(min(score for _, score in r.zrange(UNACKED_INDEX_KEY, 0, -1, withscores=True)))
            assert beats == sorted(beats) and beats[0] > hung_at and beats[-1] - beats[0] > 1.0
            assert leases == sorted(leases) and leases[0] > hung_at and leases[-1] - leases[0] > 1.0
            assert set(r.hgetall(LEASES_KEY).values()) == {node_id}
            assert keeper.reconcile_turns.running and stuck.requests[1:] == []  # no second pass
            assert not r.exists(RECONCILE_LOCK)  # the turn expired, and this node took no new one
            assert not r.exists(aux_key("notified", "job-one"))
            stalls = [e for e in logs if e["event"] == "reconcile_still_running"]
            assert len(stalls) == 1 and stalls[0]["node_id"] == node_id and stalls[0]["running_s"] >= EVERY_S

            stuck.release()  # the endpoint answers: an empty bucket, nothing to notify
            _wait(lambda: r.exists(aux_key("notified", "job-one")), 5, "the stuck pass to end")
            _wait(lambda: not keeper.reconcile_turns.running, 2, "the pass thread to end")
            assert any(e["event"] == "reconcile_pass_slow" and e["took_s"] >= 2 for e in logs)  # held >= 10 x 0.2 s (rounded to 0.1)
            _finished_job(redis_url, "job-two")  # the next pass reads it
            _wait(lambda: r.exists(aux_key("notified", "job-two")), 5, "the next pass")
            assert any("job-two" in path for _, path in stuck.requests)
        finally:
            keeper.stop()
            _settle(stuck, keeper)
    assert not r.hexists(NODES_KEY, node_id)
    assert [e for e in logs if e["event"] in ("node_upkeep_failed", "node_upkeep_error")] == []
    r.close()


def test_stop_does_not_wait_for_a_stuck_pass(redis_url: str, stuck: StuckS3) -> None:
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    _finished_job(redis_url, "job-one")
    keeper = _keeper(redis_url, stuck).start()
    assert stuck.wait_held(1, timeout=8)
    started = time.monotonic()
    keeper.stop()
    assert time.monotonic() - started < 1.0
    assert keeper.reconcile_turns.running  # still stuck: a daemon thread, gone with the process
    time.sleep(0.5)  # no beat after the stop brings the node back
    assert not r.hexists(NODES_KEY, keeper.node.node_id)
    _settle(stuck, keeper)
    r.close()


def test_a_node_takes_no_turn_another_node_took(redis_url: str, stuck: StuckS3) -> None:
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    _finished_job(redis_url, "job-one")
    r.set(RECONCILE_LOCK, "another-node", ex=60)
    keeper = _keeper(redis_url, stuck).start()
    try:
        time.sleep(1.5)  # three turns due
        assert stuck.requests == [] and not keeper.reconcile_turns.running
        assert r.get(RECONCILE_LOCK) == "another-node"
        r.delete(RECONCILE_LOCK)  # the other node's turn is over
        assert stuck.wait_held(1, timeout=5)
        assert r.get(RECONCILE_LOCK) == keeper.node.node_id
    finally:
        keeper.stop()
        _settle(stuck, keeper)
    r.close()


def test_a_stuck_node_does_not_hold_the_fleets_turn(redis_url: str, stuck: StuckS3) -> None:
    """Once its turn expires another node takes one, though the first node's pass still hangs."""
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    _finished_job(redis_url, "job-one")
    first = _keeper(redis_url, stuck, "first").start()
    second = None
    try:
        assert stuck.wait_held(1, timeout=8)
        second = _keeper(redis_url, stuck, "second").start()
        assert stuck.wait_held(2, timeout=5)
        assert first.reconcile_turns.running and second.reconcile_turns.running
        time.sleep(1.0)
        assert len(stuck.requests) == 2  # one pass per node, however long they hang
    finally:
        first.stop()
        if second is not None:
            second.stop()
        _settle(stuck, first, *([second] if second is not None else []))
    r.close()
