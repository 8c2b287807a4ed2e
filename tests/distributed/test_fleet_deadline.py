"""Per-attempt deadlines: the worker's main process kills a pool process whose attempt hangs, the
shard is retried and the hung attempt keeps its strike."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_jobs import Fleet, make_input, result_rows, submit

from jobs.settings import Settings
from jobs.storage import open_store
from worker.deadline import AttemptSlots, DeadlineWatch, attempt_deadline


def test_deadline_from_the_token_estimate_and_the_measured_rate() -> None:
    s = Settings(shard_deadline_margin=5.0, shard_deadline_floor_s=600.0, shard_deadline_unmeasured_s=3600.0)
    assert attempt_deadline(s, 100.0, None, None) == 3700.0  # engine not ready / rate not measured yet
    assert attempt_deadline(s, 100.0, 32_000, None) == 3700.0
    assert attempt_deadline(s, 100.0, 32_000, 1000.0) == 700.0  # 5 x 32 s is under the floor
    assert attempt_deadline(s, 100.0, 1_000_000, 500.0) == 100.0 + 5 * 2000.0
    assert attempt_deadline(Settings(shard_deadline_margin=0), 100.0, 10, 1.0) is None  # turned off
    with pytest.raises(ValueError):
        Settings(shard_deadline_floor_s=0)


def test_watch_kills_a_child_past_its_deadline_and_only_that_one() -> None:
    slots = AttemptSlots(4)
    hung = subprocess.Popen(["sleep", "60"])
    fine = subprocess.Popen(["sleep", "60"])
    try:
        now = time.time()
        slots.begin(0, pid=hung.pid, job_id="00ff00ff00ff00ff", shard=7, attempt=2, deadline=now - 1)
        slots.begin(1, pid=fine.pid, job_id="00ff00ff00ff00ff", shard=8, attempt=1, deadline=now + 60)
        slots.step(0, now - 30)
        got = slots.get(0)
        assert got is not None and (got.job_id, got.shard, got.attempt, got.last_step) == (
            "00ff00ff00ff00ff", 7, 2, now - 30)  # fmt: skip
        (killed,) = DeadlineWatch(slots).check(time.time())
        assert killed.pid == hung.pid and hung.wait(10) == -9
        assert fine.poll() is None and slots.get(0) is None and slots.get(1) is not None
        slots.end(1)
        assert DeadlineWatch(slots).check(time.time() + 120) == []  # ended attempts are never killed
    finally:
        for p in (hung, fine):
            p.kill()
            p.wait()


@pytest.fixture()
def fleet(redis_url: str, tmp_path: Path, demo_model: Path) -> Iterator[Fleet]:
    f = Fleet(redis_url, tmp_path, demo_model, defaults=True)
    yield f
    f.stop()


def test_a_hung_attempt_is_killed_retried_and_struck(fleet: Fleet, tmp_path: Path) -> None:
    """Shard 0 runs and measures the model's rate; attempt 1 of shard 1 then hangs with no engine step
    (the test-only poison worker). The deadline floor and the allowance before a measured rate default
    to 10 and 60 minutes; this test sets them to 4 s and 30 s, so the hang, which comes after a measured
    rate, is cut at the floor (not at the allowance). The allowance covers the model load of each
    fresh pool process, which took over 8 s on a loaded 2-core machine (every attempt was cut then).
    Everything else runs with default settings."""
    out = tmp_path / "out"
    inp = make_input(tmp_path / "input.parquet", 4, max_tokens=(2,))
    w = fleet.start("h", poison_shard=1, poison_kind="hang_once", serve_all=True,
                    FREIGHT_SHARD_DEADLINE_FLOOR_S="4", FREIGHT_SHARD_DEADLINE_UNMEASURED_S="30")  # fmt: skip
    sub = submit(fleet.env(), inp, fleet.model, out, 2, max_tokens=2)
    done = fleet.wait_done(out, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(result_rows(out)) == 4
    (late,) = [json.loads(line) for line in w.log_text().splitlines() if '"attempt_deadline_exceeded"' in line]
    assert (late["job_id"], late["shard"], late["attempt"]) == (sub["job_id"], 1, 1)
    assert late["last_step_age_s"] is None  # not one engine step in that attempt
    assert 4 <= late["ran_s"] < 30, late  # cut at the floor: shard 0 had measured the rate
    attempts = {s: n for s, n in fleet.live.attempts(sub["job_id"]).items() if s >= 0}
    assert attempts == {0: 1, 1: 2}  # shard 1 retried once, shard 0 ran once
    strikes = fleet.live.client.hget(f"freight:strikes:{sub['job_id']}", "1")
    assert int(strikes) == 1  # the killed attempt never ended cleanly: its strike stays
    waste = open_store(str(out)).list("waste/")
    assert waste == ["waste/00001-1-lost.json"]  # billed as lost: its process is gone
