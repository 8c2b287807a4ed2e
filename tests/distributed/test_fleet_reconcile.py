"""Redis state checked against storage: shards whose messages Redis lost are queued again, a job
Redis forgot is never waited on forever. A private redis-server, real storage, real workers."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fleet_jobs import Fleet, embedded_run, freight, make_input, result_rows, submit
from fleet_servers import wait_for

from jobs.client import FleetClient
from jobs.leases import UNACKED_INDEX_KEY, UNACKED_KEY
from jobs.reconcile import Reconciler
from jobs.settings import Settings

QUEUE_KEYS = (UNACKED_KEY, UNACKED_INDEX_KEY)


@pytest.fixture()
def fleet(redis_url: str, tmp_path: Path, demo_model: Path) -> Iterator[Fleet]:
    f = Fleet(redis_url, tmp_path, demo_model, defaults=True)
    yield f
    f.stop()


def _flush_queue_keys(fleet: Fleet) -> int:
    """What a failover without AOF or an operator's flush does to the queue: every message gone."""
    r = fleet.live.client
    keys = [fleet.queue, *(f"{fleet.queue}\x06\x16{p}" for p in range(1, 10)), *QUEUE_KEYS]
    return int(r.delete(*keys))


def _queued(fleet: Fleet) -> int:
    r = fleet.live.client
    return sum(r.llen(k) for k in [fleet.queue, *(f"{fleet.queue}\x06\x16{p}" for p in range(1, 10))])


def test_reconciler_queues_lost_shards_again_after_the_grace(fleet: Fleet, tmp_path: Path) -> None:
    out = tmp_path / "out"
    sub = submit(fleet.env(), make_input(tmp_path / "input.parquet", 8), fleet.model, out, 2)  # 4 shards
    assert _queued(fleet) == 4 and _flush_queue_keys(fleet) >= 1 and _queued(fleet) == 0
    client = FleetClient(Settings(redis_url=fleet.redis_url))
    try:
        reconciler = Reconciler(client, Settings(redis_url=fleet.redis_url))
        grace = reconciler.grace_s
        assert grace == 10.0  # FREIGHT_ORPHAN_GRACE_S's default
        now = time.time()
        assert reconciler.run(now) == []  # first seen missing: maybe a message in flight, wait
        assert _queued(fleet) == 0
        (repair,) = reconciler.run(now + grace + 1)
        assert repair.job_id == sub["job_id"] and repair.requeued == (0, 1, 2, 3)
        assert _queued(fleet) == 4 and set(fleet.live.shard_states(sub["job_id"]).values()) == {"queued"}
        assert reconciler.run(now + 2 * grace + 2) == []  # messages exist now: nothing twice
        assert _queued(fleet) == 4
        # a job whose OUT is gone is let go, not re-queued forever
        fleet.live.client.delete(fleet.queue)
        (out / "manifest.json").unlink()
        reconciler.run(now + 3 * grace)
        (gone,) = reconciler.run(now + 5 * grace)
        assert gone.state == "failed" and fleet.live.job(sub["job_id"])["state"] == "failed"
    finally:
        client.close()


@pytest.fixture()
def quick_fleet(redis_url: str, tmp_path: Path, demo_model: Path) -> Iterator[Fleet]:
    """Default settings but the grace before a requeue and `freight wait`'s check interval (10 s
    each), shortened to 1 s: the grace's own rule is the test above."""
    f = Fleet(redis_url, tmp_path, demo_model, defaults=True,
              overrides={"FREIGHT_ORPHAN_GRACE_S": "1", "FREIGHT_WAIT_RECONCILE_S": "1"})  # fmt: skip
    yield f
    f.stop()


@pytest.mark.slow
def test_a_job_whose_queue_redis_lost_finishes_on_its_own(quick_fleet: Fleet, tmp_path: Path) -> None:
    """A worker runs; after the first commit every queue key is flushed (the running shard's unacked
    entry included). `freight wait` (and the workers' own checks) notice the shards that nothing will
    run, queue them again, and the job ends equal to an uninterrupted run."""
    fleet = quick_fleet
    inp = make_input(tmp_path / "input.parquet", 12, max_tokens=(2, 30, 300))
    reference = embedded_run(inp, fleet.model, tmp_path / "embedded", 2, max_tokens=300)
    out = tmp_path / "out"
    w = fleet.start("r")
    sub = submit(fleet.env(), inp, fleet.model, out, 2, max_tokens=300)  # 6 shards, each with a long row
    wait_for(lambda: any(p.suffix == ".parquet" for p in (out / "shards").glob("*")), 120, "one commit")
    assert _flush_queue_keys(fleet) >= 1
    done = fleet.wait_done(out, timeout=300)
    assert done.returncode == 0, done.stderr
    assert result_rows(out) == reference
    requeued = [json.loads(line) for text in (done.stderr, w.log_text()) for line in text.splitlines()
                if line.startswith("{") and '"shards_requeued"' in line]  # fmt: skip
    assert requeued and all(e["job_id"] == sub["job_id"] for e in requeued)
    assert fleet.live.job(sub["job_id"])["state"] == "succeeded"


@pytest.mark.slow
def test_wait_never_polls_a_job_redis_does_not_know(fleet: Fleet, tmp_path: Path) -> None:
    out = tmp_path / "out"
    inp = make_input(tmp_path / "input.parquet", 4)
    sub = submit(fleet.env(), inp, fleet.model, out, 2)
    fleet.live.client.flushall()  # Redis lost everything: the job was queued, then forgotten
    with ThreadPoolExecutor(1) as pool:  # the second case's job (an embedded run) meanwhile
        second = pool.submit(embedded_run, inp, fleet.model, tmp_path / "emb", 2)
        t0 = time.monotonic()
        done = freight(["wait", str(out), "--poll", "0.5", "--timeout", "120"], fleet.env(), timeout=150)
        assert done.returncode == 2 and time.monotonic() - t0 < 60, done.stderr
        assert f"Redis has no state for job {sub['job_id']} (0 of 2 shards committed" in done.stderr
        assert "`freight submit` it again" in done.stderr
        second.result()
    # a job whose every shard is committed but Redis forgot: wait finalizes it and succeeds
    (tmp_path / "emb" / "_SUCCESS").unlink()
    (tmp_path / "emb" / "cost.json").unlink()
    done = freight(["wait", str(tmp_path / "emb"), "--poll", "0.5", "--timeout", "120"], fleet.env(), timeout=150)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "emb" / "_SUCCESS").exists()
