"""Distributed jobs end to end: real redis-server, real `freight worker` processes, tiny demo model.

Every test compares the fleet's results row for row with the embedded `freight run` of the same input.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from fleet_jobs import Fleet, embedded_run, freight, make_input, result_rows, submit
from fleet_servers import FakeImds, RedisServer, WorkerProcess, wait_for

from jobs.cost import AttemptRecord, ShardRecord
from jobs.storage import open_store
from worker.demo_model import make_demo_model

ROWS, SHARD_ROWS = 40, 2  # 20 shards


@dataclass(frozen=True)
class Fixture:
    model: Path
    input: Path
    reference: list[dict]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    root = tmp_path_factory.mktemp("fleet")
    model = make_demo_model(root / "model")
    inp = make_input(root / "input.parquet", ROWS)
    return Fixture(
        Path(model).resolve(), inp, embedded_run(inp, Path(model).resolve(), root / "embedded", SHARD_ROWS)
    )


@pytest.fixture()
def fleet(redis_url: str, tmp_path: Path, job: Fixture) -> Iterator[Fleet]:
    f = Fleet(redis_url, tmp_path, job.model)
    yield f
    f.stop()


def _records(out: Path) -> list[ShardRecord]:
    store = open_store(str(out))
    return [
        ShardRecord.model_validate_json(store.get(k)) for k in store.list("costs/") if k.endswith(".json")
    ]


def _waste(out: Path) -> list[AttemptRecord]:
    store = open_store(str(out))
    return [AttemptRecord.model_validate_json(store.get(k)) for k in store.list("waste/")]


def test_two_workers_match_embedded_run(fleet: Fleet, job: Fixture, tmp_path: Path) -> None:
    out = tmp_path / "out"
    fleet.start("a"), fleet.start("b")
    sub = submit(fleet.env(), job.input, job.model, out, SHARD_ROWS)
    assert sub["shards"] == 20 and sub["queue"] == fleet.queue
    done = fleet.wait_done(out)
    assert done.returncode == 0, done.stderr
    assert result_rows(out) == job.reference
    assert (out / "_SUCCESS").exists() and (out / "cost.json").exists()
    workers = {r.worker for r in _records(out)}
    assert len(workers) == 2, "both workers took shards"
    assert fleet.live.job(sub["job_id"])["state"] == "succeeded"
    # Each shard ran once: the 4 s visibility timeout did not redeliver running shards (leases renewed).
    # (the first shard on each worker includes the model load, longer than 4 s under load)
    shard_attempts = {s: n for s, n in fleet.live.attempts(sub["job_id"]).items() if s >= 0}
    assert len(shard_attempts) == 20 and set(shard_attempts.values()) == {1}
    assert fleet.metric("a", "freight_rows_total") + fleet.metric("b", "freight_rows_total") == ROWS
    # the engine is loaded once per worker process, then reused shard after shard (not "each worker ran
    # two shards": a worker whose load takes a second or two longer on a busy machine finds the other
    # one has run all but its first shard, a shard here takes about 0.1 s)
    for w in fleet.workers:
        assert len([e for e in _log_events(w, "model_loaded") if "key" in e]) == 1
    assert sum(len(_log_events(w, "shard_done")) for w in fleet.workers) == 20


def test_sigkill_worker_mid_shard(fleet: Fleet, job: Fixture, tmp_path: Path) -> None:
    out = tmp_path / "out"
    victim = fleet.start("victim")
    sub = submit(fleet.env(), job.input, job.model, out, SHARD_ROWS)
    wait_for(lambda: fleet.busy("victim@test#0"), 120, "the victim to run a shard")
    running = [s for s, st in fleet.live.shard_states(sub["job_id"]).items() if st == "running"]
    victim.kill_all()  # no notice, no goodbye: its shard's message stays unacked in Redis
    fleet.start("survivor")
    done = fleet.wait_done(out)
    assert done.returncode == 0, done.stderr
    rows = result_rows(out)
    assert sorted(r["id"] for r in rows) == sorted(r["id"] for r in job.reference)  # each row exactly once
    assert rows == job.reference
    attempts = fleet.live.attempts(sub["job_id"])
    assert running and all(attempts[s] >= 2 for s in running), (running, attempts)  # redelivered
    # the killed attempt's work is billed as waste (start -> the victim's last heartbeat)
    lost = [w for w in _waste(out) if w.worker == "victim@test#0" and w.rows_saved == 0]
    assert {w.shard for w in lost} == set(running) and all(w.billed_seconds > 0 for w in lost)
    assert json.loads((out / "cost.json").read_text())["wasted_cost_usd"] == pytest.approx(
        sum(w.wasted_usd for w in _waste(out)))  # fmt: skip


def test_spot_notice_checkpoints_and_resumes_elsewhere(
    fleet: Fleet, job: Fixture, tmp_path: Path, imds: FakeImds
) -> None:
    out = tmp_path / "out"
    # long rows keep the shard running well past the notice (the engine is fast on the tiny model)
    inp = make_input(tmp_path / "input.parquet", 12, max_tokens=(1, 3, 6, 600, 1000, 1500))
    reference = embedded_run(inp, job.model, tmp_path / "embedded", 12)
    spot = fleet.start("spot", FREIGHT_IMDS_URL=imds.url)
    sub = submit(fleet.env(), inp, job.model, out, 12)  # one shard of 12 rows, staggered lengths
    wait_for(lambda: fleet.metric("spot", "freight_rows_total") >= 2, 180, "rows finished on the spot worker")
    imds.announce("terminate")
    wait_for(lambda: not spot.alive(), 60, "the spot worker to hand its shard back and stop")
    assert spot.proc.returncode == 0
    # handed back, not abandoned: the message is on the queue again (no worker is left to restore it)
    assert fleet.live.client.llen(fleet.queue) == 1 and fleet.live.client.hlen("unacked") == 0
    fleet.start("ondemand")
    done = fleet.wait_done(out)
    assert done.returncode == 0, done.stderr
    assert result_rows(out) == reference
    (interrupted,) = [w for w in _waste(out) if w.reason == "interrupted"]
    (record,) = _records(out)
    assert interrupted.rows_saved >= 2 and record.rows_from_partial == interrupted.rows_saved
    assert record.attempt > interrupted.attempt and record.worker != interrupted.worker
    # No committed row computed twice: the second worker computed exactly the rows not saved.
    assert fleet.metric("ondemand", "freight_rows_total") == 12 - interrupted.rows_saved
    cost = json.loads((out / "cost.json").read_text())
    assert cost["wasted_cost_usd"] >= 0 and "spot_notice" in spot.log_text()
    assert fleet.live.attempts(sub["job_id"])[0] == 2


def _log_events(worker: WorkerProcess, event: str) -> list[dict]:
    events = []
    for line in worker.log_text().splitlines():
        if line.startswith("{") and f'"{event}"' in line:
            events.append(json.loads(line))
    return events


@pytest.mark.slow
def test_cancel_stops_the_running_shard_promptly(fleet: Fleet, job: Fixture, tmp_path: Path) -> None:
    out = tmp_path / "out"
    # 6 shards of 2 rows x 1,000 tokens: long enough that the cancel finds one running even on a
    # machine where the tiny model's steps take well under a millisecond
    inp = make_input(tmp_path / "input.parquet", 12, max_tokens=(1000,))
    w = fleet.start("c")
    sub = submit(fleet.env(), inp, job.model, out, 2, max_tokens=1000)
    store = open_store(str(out))
    wait_for(lambda: any(k.endswith(".parquet") for k in store.list("shards/")) and fleet.busy("c@test#0"),
             240, "one committed shard and the next one running")  # fmt: skip
    proc = freight(["cancel", str(out)], fleet.env())
    assert proc.returncode == 0, proc.stderr
    committed_at_cancel = {k for k in store.list("shards/") if k.endswith(".parquet")}
    (stopped,) = wait_for(lambda: _log_events(w, "shard_stopped"), 60, "the running shard to stop")
    assert stopped["reason"] == "cancelled" and stopped["job_id"] == sub["job_id"]
    # stopped within the cancel poll (CANCEL_CHECK_S, 50 ms; steps in between depend on the machine)
    cancelled_at = fleet.live.cancelled_at(sub["job_id"])
    assert cancelled_at is not None and stopped["steps_after_cancel"] >= 0, stopped
    assert datetime.fromisoformat(stopped["timestamp"]).timestamp() - cancelled_at < 1.0, stopped
    done = fleet.wait_done(out, timeout=60)
    assert done.returncode == 1 and "cancelled" in done.stderr
    # the queue drains: queued shards are skipped, none commits after the cancel
    wait_for(
        lambda: fleet.live.client.llen(fleet.queue) == 0 and not fleet.busy("c@test#0"), 60, "queue drained"
    )
    committed = {k for k in store.list("shards/") if k.endswith(".parquet")}
    assert committed == committed_at_cancel and 1 <= len(committed) < 6
    assert (out / "_CANCELLED").exists() and not (out / "_SUCCESS").exists()
    assert fleet.live.job(sub["job_id"])["state"] == "cancelled"


@pytest.mark.slow
def test_poison_shard_fails_after_bounded_attempts(fleet: Fleet, job: Fixture, tmp_path: Path) -> None:
    out = tmp_path / "out"
    inp = make_input(tmp_path / "input.parquet", 8, max_tokens=(2,))
    fleet.start("p", poison_shard=1, FREIGHT_MAX_SHARD_ATTEMPTS="2")
    sub = submit(fleet.env(), inp, job.model, out, 2, max_tokens=2)  # 4 shards, shard 1 kills its process
    done = fleet.wait_done(out, timeout=240)
    assert done.returncode == 1, done.stderr
    assert "shard 1 failed after 3 attempts" in done.stderr
    failures = json.loads((out / "failures.json").read_text())
    assert [f["shard"] for f in failures["failures"]] == [1]
    assert "worker process died" in failures["failures"][0]["reason"]
    store = open_store(str(out))
    assert sorted(k for k in store.list("shards/") if k.endswith(".parquet")) == [
        "shards/00000.parquet", "shards/00002.parquet", "shards/00003.parquet"]  # fmt: skip
    assert fleet.live.attempts(sub["job_id"])[1] == 3  # two deaths, then the third attempt gives up
    assert sorted(w.attempt for w in _waste(out) if w.shard == 1) == [1, 2]  # both deaths billed as waste
    job_state = fleet.live.job(sub["job_id"])
    assert (job_state["state"], job_state["shards_failed"], job_state["shards_committed"]) == ("failed", 1, 3)
    status = freight(["status", sub["job_id"]], fleet.env())  # by job id: Redis knows its OUT
    assert status.returncode == 0, status.stderr
    assert "fleet: failed" in status.stdout and "shard 1 failed after 3 attempts" in status.stdout
    # The cause is fixed (a worker without the poison): a resubmit retries only the failed shard.
    fleet.workers[0].stop()
    fleet.start("fixed")
    again = submit(fleet.env(), inp, job.model, out, 2, max_tokens=2)
    assert again["shards_enqueued"] == 1
    done = fleet.wait_done(out, timeout=240)
    assert done.returncode == 0, done.stderr
    assert len(result_rows(out)) == 8 and not (out / "failures.json").exists()


@pytest.mark.slow
def test_an_attempt_that_raises_is_billed_as_an_error_not_as_lost(
    fleet: Fleet, job: Fixture, tmp_path: Path
) -> None:
    """Attempt 1 of shard 0 raises (requeued, retried): its time is waste of reason "error", billed
    once by its own worker, and the retry does not bill it again as a lost (vanished) attempt."""
    out = tmp_path / "out"
    inp = make_input(tmp_path / "input.parquet", 4, max_tokens=(2,))
    fleet.start("e", poison_shard=0, poison_kind="raise_once")
    sub = submit(fleet.env(), inp, job.model, out, 2, max_tokens=2)  # 2 shards
    done = fleet.wait_done(out, timeout=240)
    assert done.returncode == 0, done.stderr
    assert {s: n for s, n in fleet.live.attempts(sub["job_id"]).items() if s >= 0} == {0: 2, 1: 1}
    (error,) = _waste(out)
    assert (error.shard, error.attempt, error.reason, error.worker) == (0, 1, "error", "e@test#0")
    assert error.billed_seconds > 0 and error.rows_saved == 0 and error.wasted_usd == error.cost_usd > 0
    assert not any(k.endswith("-lost.json") for k in open_store(str(out)).list("waste/"))
    cost = json.loads((out / "cost.json").read_text())
    assert cost["uncommitted_attempts"] == 1 and cost["wasted_cost_usd"] == pytest.approx(error.wasted_usd)
    assert cost["cost_usd"] == pytest.approx(sum(r.cost_usd for r in _records(out)) + error.cost_usd)
    started = fleet.live.client.hget(f"freight:started:{sub['job_id']}", "0")
    assert json.loads(started)["attempt"] == 2  # the committed attempt's start; attempt 1's was dropped


@pytest.mark.slow
def test_redis_restart_during_job(
    fleet: Fleet, job: Fixture, tmp_path: Path, redis_server: RedisServer
) -> None:
    out = tmp_path / "out"
    fleet.start("a"), fleet.start("b")
    sub = submit(fleet.env(), job.input, job.model, out, SHARD_ROWS)
    store = open_store(str(out))
    wait_for(
        lambda: sum(k.endswith(".parquet") for k in store.list("shards/")) >= 3, 240, "3 shards committed"
    )
    redis_server.restart(down_s=2.0)  # SIGTERM (AOF flushed), 2 s away, back on the same port
    done = fleet.wait_done(out)
    assert done.returncode == 0, done.stderr
    assert result_rows(out) == job.reference
    assert all(w.alive() for w in fleet.workers)
    assert fleet.live.job(sub["job_id"])["state"] == "succeeded"


@pytest.mark.slow
def test_sigterm_hands_the_running_shard_back(fleet: Fleet, job: Fixture, tmp_path: Path) -> None:
    """A stopping worker (SIGTERM to its main process: an ASG scale-in, a deploy) does not sit on its
    shard: the pool process sees the shutdown flag at its next engine step, saves its finished rows and
    requeues the shard, and the worker exits cleanly."""
    out = tmp_path / "out"
    inp = make_input(tmp_path / "input.parquet", 8, max_tokens=(1, 2, 600, 1000))
    w = fleet.start("term")
    sub = submit(fleet.env(), inp, job.model, out, 8, max_tokens=40)
    wait_for(lambda: fleet.metric("term", "freight_rows_total") >= 2, 180, "rows finished")
    w.proc.send_signal(signal.SIGTERM)
    w.proc.wait(60)
    assert w.proc.returncode == 0
    assert fleet.live.client.llen(fleet.queue) == 1 and fleet.live.client.hlen("unacked") == 0
    (stopped,) = [a for a in _waste(out) if a.reason == "interrupted"]
    assert stopped.rows_saved >= 2 and (out / "partial" / "00000").is_dir()
    assert fleet.live.shard_states(sub["job_id"]) == {0: "queued"}
