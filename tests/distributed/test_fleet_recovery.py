"""Lost shards come back and live attempts are never billed as lost: real `freight worker` processes
with freight's DEFAULT settings (heartbeats every 10 s, visibility timeout 300 s) on a private
redis-server, the "small" demo model (shards of 3,000-token rows last seconds on any machine)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_jobs import Fleet, make_input, result_rows, submit
from fleet_servers import wait_for

from jobs.client import FleetClient
from jobs.leases import UNACKED_KEY, LeaseReaper, decode_task
from jobs.progress import LEASES_KEY, WORKER_GONE_AFTER_S, WorkerBeat
from jobs.settings import Settings
from jobs.storage import open_store


@pytest.fixture()
def fleet(redis_url: str, tmp_path: Path, small_model: Path) -> Iterator[Fleet]:
    f = Fleet(redis_url, tmp_path, small_model, defaults=True)
    yield f
    f.stop()


def _leased_by(fleet: Fleet, hostname: str) -> list[str]:
    """Delivery tags whose lease names a node of `hostname` (node ids are `<hostname>/<pid>-<token>`)."""
    leases = fleet.live.client.hgetall(LEASES_KEY)
    return [tag for tag, node in leases.items() if node.startswith(hostname + "/")]


def _running(fleet: Fleet, worker_id: str) -> WorkerBeat | None:
    raw = fleet.live.client.hget("freight:workers", worker_id)
    beat = WorkerBeat.from_json(worker_id, raw) if raw else None
    return beat if beat is not None and beat.shard is not None else None


def _long_job(
    fleet: Fleet, tmp_path: Path, rows: int, shard_rows: int, tokens: int = 3000
) -> tuple[dict, Path]:
    """Rows of 3,000 tokens each on the small model: a shard runs for seconds, long enough to be
    caught mid-way on any machine (a delivered message is leased at once: worker/node.py's poke)."""
    inp = make_input(tmp_path / "input.parquet", rows, max_tokens=(tokens,))
    out = tmp_path / "out"
    return submit(fleet.env(), inp, fleet.model, out, shard_rows, max_tokens=tokens), out


def _caught(fleet: Fleet, hostname: str) -> tuple[str, int] | None:
    """(delivery tag, shard) once `hostname`'s node has leased the message of the shard it runs."""
    beat = _running(fleet, f"{hostname}#0")
    for tag in _leased_by(fleet, hostname) if beat is not None else ():
        raw = fleet.live.client.hget(UNACKED_KEY, tag)
        task = decode_task(json.loads(raw)[0]) if raw else None
        if task is not None and task.shard == (beat.job_id, beat.shard):
            return tag, beat.shard
    return None


def _kill_mid_shard(fleet: Fleet, tmp_path: Path) -> tuple[dict, Path, int, str, float]:
    """Submit 8 long shards, let the victim lease one and run it, SIGKILL it (main + pool process)."""
    victim = fleet.start("victim")
    sub, out = _long_job(fleet, tmp_path, 16, 2)
    tag, shard = wait_for(lambda: _caught(fleet, "victim@test"), 120, "the victim's lease on its shard")
    victim.kill_all()
    return sub, out, shard, tag, time.time()


def _restarted(fleet: Fleet, job_id: str, shard: int) -> tuple[float, str] | None:
    """(start time, worker) of the shard's second attempt, once it began."""
    raw = fleet.live.client.hget(f"freight:started:{job_id}", str(shard))
    info = json.loads(raw) if raw else {}
    return (float(info["at"]), str(info["worker"])) if info.get("attempt", 0) >= 2 else None


def test_reaper_puts_a_killed_workers_shard_back(fleet: Fleet, tmp_path: Path) -> None:
    """The reaper restores the shard of a node whose beat is over 60 s old, and only then, once; the
    next worker takes it.

    Waiting a real minute is the slow test below (which also sees the job finish); here the reaper
    is handed the clock a minute on (no setting is shortened). The new attempt then waits, as it
    should, until the killed attempt's own heartbeat is a minute old, so this test stops once the
    second attempt has begun."""
    sub, out, shard, tag, killed_at = _kill_mid_shard(fleet, tmp_path)
    reaper = LeaseReaper(fleet.live.client)
    assert reaper.reap(time.time()) == []  # its beat is at most 10 s old: not gone yet
    assert fleet.live.client.hexists(UNACKED_KEY, tag)
    (restored,) = reaper.reap(killed_at + WORKER_GONE_AFTER_S + 1)
    assert (restored.job_id, restored.shard, restored.tag) == (sub["job_id"], shard, tag)
    assert restored.holder is not None and restored.holder.startswith("victim@test/")
    assert reaper.reap(killed_at + WORKER_GONE_AFTER_S + 1) == []  # idempotent: back once
    assert not fleet.live.client.hexists(UNACKED_KEY, tag) and fleet.live.client.llen(fleet.queue) >= 1
    assert fleet.live.shard_states(sub["job_id"])[shard] == "queued"
    fleet.start("survivor")
    _, worker = wait_for(lambda: _restarted(fleet, sub["job_id"], shard), 120, "the shard's next attempt")
    assert worker == "survivor@test#0"


@pytest.mark.slow
def test_killed_workers_shard_restarts_within_two_minutes(fleet: Fleet, tmp_path: Path) -> None:
    """In real time with default settings: one worker SIGKILLed mid-shard, another started at once;
    the shard's next attempt starts within 2 minutes of the kill (the lease reaper, not the 1-hour
    visibility timeout), the job finishes on its own, every row once, the killed attempt billed as
    lost."""
    sub, out, shard, _, killed_at = _kill_mid_shard(fleet, tmp_path)
    fleet.start("survivor")
    at, _ = wait_for(lambda: _restarted(fleet, sub["job_id"], shard), 180, "the next attempt", interval=0.5)
    assert at - killed_at < 120, f"shard {shard} restarted {at - killed_at:.0f} s after the kill"
    done = fleet.wait_done(out, timeout=600)
    assert done.returncode == 0, done.stderr
    assert sorted(r["id"] for r in result_rows(out)) == sorted(str(i) for i in range(16))  # every row once
    assert fleet.live.attempts(sub["job_id"])[shard] == 2
    lost = [k for k in open_store(str(out)).list("waste/") if k.endswith("-lost.json")]
    assert lost == [f"waste/{shard:05d}-1-lost.json"]


@pytest.mark.slow
def test_duplicate_delivery_waits_for_the_live_attempt_and_bills_nothing_as_lost(
    fleet: Fleet, tmp_path: Path
) -> None:
    """A second delivery of a shard whose first attempt is alive (a restore by mistake, a visibility
    timeout passed without a renewal) neither bills that attempt as lost nor computes the shard again:
    it waits, sees the commit, and ends."""
    workers = {"a": fleet.start("a"), "b": fleet.start("b")}
    wait_for(lambda: len(fleet.live.client.hgetall("freight:workers")) == 2, 120, "both workers up")
    # one shard of 4 rows of 500 tokens: the duplicate is taken within a second of the first attempt's
    # start, while that one still loads the model (2 s and more), so rows this long are plenty
    sub, out = _long_job(fleet, tmp_path, 4, 4, tokens=500)
    holder = wait_for(lambda: next((n for n in workers if _running(fleet, f"{n}@test#0")), None), 120,
                      "a worker running the shard")  # fmt: skip
    client = FleetClient(Settings(redis_url=fleet.redis_url))
    client.requeue(job_id=sub["job_id"], output=sub["output"], queue=sub["queue"], shards=[0])
    client.close()  # the idle worker takes the duplicate at once, while the holder still runs
    done = fleet.wait_done(out, timeout=600)
    assert done.returncode == 0, done.stderr
    other = workers["b" if holder == "a" else "a"]
    assert '"duplicate_delivery_waiting"' in other.log_text(), "the duplicate arrived while the shard ran"
    store = open_store(str(out))
    assert store.list("waste/") == []  # no "lost" bill for the live attempt, no lost race for the other
    cost = json.loads(store.get("cost.json"))
    assert cost["uncommitted_attempts"] == 0 and cost["wasted_cost_usd"] == 0
    assert json.loads(store.get("costs/00000.json"))["attempt"] == 1  # the first attempt committed
    assert fleet.live.attempts(sub["job_id"])[0] == 2
    assert len(result_rows(out)) == 4
