"""Live state in Redis (jobs/progress.py) against a private redis-server: the documented keys."""

from __future__ import annotations

import json
import time

import pytest

from jobs.live_state import LiveState
from jobs.progress import JOB_TTL_S, JOBS_KEY, QUEUES_KEY, WORKERS_KEY, WorkerBeat, job_key


def test_job_counts_follow_shard_transitions(redis_url: str) -> None:
    live = LiveState(redis_url)
    live.init_job("j1", output="/out", queue="freight-q", model="/m", est_tokens={0: 10, 1: 20, 2: 30},
                  committed=[2])  # fmt: skip
    raw = live.client.hgetall(job_key("j1"))
    assert set(raw) == {"state", "shards_total", "shards_queued", "shards_running", "shards_committed",
                        "shards_failed", "rows_done", "tokens_done", "est_tokens_queued", "updated_at"}  # fmt: skip
    job = live.job("j1")
    assert (job["state"], job["shards_total"], job["shards_queued"], job["shards_committed"]) == (
        "queued",
        3,
        2,
        1,
    )
    assert job["est_tokens_queued"] == 30
    assert live.client.sismember(QUEUES_KEY, "freight-q") and live.client.sismember(JOBS_KEY, "j1")

    assert live.transition("j1", 0, "running") == "queued"
    assert live.transition("j1", 0, "running") == "running"  # a redelivery changes nothing
    job = live.job("j1")
    assert (job["state"], job["shards_queued"], job["shards_running"], job["est_tokens_queued"]) == (
        "running",
        1,
        1,
        20,
    )
    live.transition("j1", 0, "queued")  # handed back by an interrupted worker
    assert live.job("j1")["est_tokens_queued"] == 30
    live.transition("j1", 0, "running")
    live.transition("j1", 0, "committed", rows=5, tokens=50)
    live.transition("j1", 0, "committed", rows=5, tokens=50)  # counted once
    live.transition("j1", 0, "running")  # a late duplicate cannot un-commit
    live.transition("j1", 1, "running")
    live.transition("j1", 1, "failed")
    job = live.job("j1")
    assert (job["shards_queued"], job["shards_running"], job["shards_committed"], job["shards_failed"]) == (
        0,
        0,
        2,
        1,
    )
    assert (job["rows_done"], job["tokens_done"], job["est_tokens_queued"]) == (5, 50, 0)
    assert live.shard_states("j1") == {0: "committed", 1: "failed", 2: "committed"}
    assert live.find_job("/out") == "j1" and live.find_job("/elsewhere") is None
    with pytest.raises(ValueError, match="unknown shard state"):
        live.transition("j1", 0, "done")


def test_attempts_count_at_start_and_strikes_only_unclean_ends(redis_url: str) -> None:
    live = LiveState(redis_url)
    assert live.begin_attempt("j", 4) == (1, 1)
    live.end_attempt_clean("j", 4)  # e.g. handed back after a spot notice
    assert live.begin_attempt("j", 4) == (2, 1)
    assert live.begin_attempt("j", 4) == (3, 2)  # the previous one never ended: a crash
    assert live.attempts("j") == {4: 3}


def test_a_billed_attempts_start_is_dropped_but_never_a_later_ones(redis_url: str) -> None:
    live = LiveState(redis_url)
    assert live.swap_attempt_start("j", 4, {"attempt": 1, "worker": "w1", "at": 10.0}) is None
    assert live.end_attempt_start("j", 4, 1)  # attempt 1 raised and was billed: nothing left to bill
    assert live.swap_attempt_start("j", 4, {"attempt": 2, "worker": "w2", "at": 20.0}) is None
    assert not live.end_attempt_start("j", 4, 1)  # a late call for attempt 1 leaves attempt 2's start
    assert live.swap_attempt_start("j", 4, {"attempt": 3, "worker": "w1", "at": 30.0})["attempt"] == 2


def test_cancel_flag_and_state(redis_url: str) -> None:
    live = LiveState(redis_url)
    live.init_job("j2", output="/o", queue="q", model="/m", est_tokens={0: 1})
    assert not live.is_cancelled("j2")
    live.request_cancel("j2")
    assert live.is_cancelled("j2") and live.job("j2")["state"] == "cancelled"


def test_worker_heartbeats_and_staleness(redis_url: str) -> None:
    live = LiveState(redis_url)
    now = time.time()
    live.heartbeat(WorkerBeat("w1", True, "i-1", "freight-q", 12.5, now))
    live.heartbeat(WorkerBeat("w2", False, None, "freight-q", 0.0, now - 120))
    live.heartbeat(WorkerBeat("w3", True, None, "freight-q", 1.0, now, job_id="j", shard=4, attempt=2,
                              last_step=now - 1, model="/m", node="h/1-ab"))  # fmt: skip
    assert json.loads(live.client.hget(WORKERS_KEY, "w1")) == {
        "busy": True, "instance_id": "i-1", "queue": "freight-q", "tokens_per_second": 12.5, "heartbeat": now,
        "job_id": None, "shard": None, "attempt": None, "last_step": None, "model": None, "node": None}  # fmt: skip
    # the optional fields round-trip, and an older worker's beat without them still reads
    w3 = WorkerBeat.from_json("w3", live.client.hget(WORKERS_KEY, "w3"))
    assert w3.runs("j", 4, 2) and not w3.runs("j", 4, 1) and (w3.model, w3.node) == ("/m", "h/1-ab")
    old = WorkerBeat.from_json("w0", json.dumps({"busy": False, "heartbeat": now}))
    assert old.job_id is None and old.last_step is None
    live.remove_worker("w3")
    assert [w.worker_id for w in live.workers()] == ["w1"]
    live.remove_worker("w1")
    assert live.workers() == []


def test_finished_jobs_expire_and_a_resubmit_revives_them(redis_url: str) -> None:
    live = LiveState(redis_url)
    live.init_job("j3", output="/o3", queue="q", model="/m", est_tokens={0: 1})
    live.begin_attempt("j3", 0)
    assert live.client.ttl(job_key("j3")) == -1  # a live job never expires
    live.set_job_state("j3", "succeeded")
    for key in (job_key("j3"), "freight:meta:j3", "freight:attempts:j3", "freight:shards:j3"):
        assert 0 < live.client.ttl(key) <= JOB_TTL_S
    live.init_job("j3", output="/o3", queue="q", model="/m", est_tokens={0: 1})
    assert live.client.ttl(job_key("j3")) == -1 and live.client.ttl("freight:attempts:j3") == -1
    live.client.delete("freight:meta:j3")  # as if expired
    assert live.find_job("/o3") is None and not live.client.sismember(JOBS_KEY, "j3")
