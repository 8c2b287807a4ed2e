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
from worker.deadline import AttemptSlots, DeadlineWatch, ProgressDeadline, attempt_deadline


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


def test_finished_rows_move_the_deadline_and_a_stall_is_still_killed() -> None:
    """An attempt that keeps finishing rows outlives its first deadline; once rows stop, it is killed
    that allowance (here the 1 s floor) after its last row. A real child process and a real SIGKILL;
    the clocks are given, so nothing here waits on them."""
    s = Settings(shard_deadline_margin=5.0, shard_deadline_floor_s=1.0, shard_deadline_unmeasured_s=30.0)
    slots = AttemptSlots(2)
    watch = DeadlineWatch(slots)
    slow = subprocess.Popen(["sleep", "60"])
    try:
        t0 = time.time()
        slots.begin(0, pid=slow.pid, job_id="00ff00ff00ff00ff", shard=3, attempt=1, deadline=t0 + 1.0)
        clock = [t0]
        # 4 rows x 2 tokens at 1,000 tokens/s: 5 x 8 ms, under the 1 s floor
        progress = ProgressDeadline(s, 4, 2, 1000.0, lambda d: slots.extend(0, d), clock=lambda: clock[0])
        for k in range(1, 4):  # a row every 0.8 s: slower than the estimate, but progress
            clock[0] = t0 + 0.8 * k
            progress()
            assert watch.check(clock[0] + 0.5) == []  # past the first deadline (t0 + 1) from row 2 on
        got = slots.get(0)
        assert got is not None and got.deadline == pytest.approx(t0 + 2.4 + 1.0)  # the last row + the floor
        slots.extend(0, t0)  # never earlier
        assert slots.get(0).deadline == pytest.approx(t0 + 3.4)
        (killed,) = watch.check(t0 + 3.5)  # no row for the floor: a stall, killed
        assert killed.pid == slow.pid and slow.wait(10) == -9
        off = ProgressDeadline(Settings(shard_deadline_margin=0), 4, 2, 1000.0, lambda d: pytest.fail("moved"))
        off()  # deadlines turned off: nothing to move
    finally:
        slow.kill()
        slow.wait()


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
    w, sub, out = _four_rows_poisoning_shard_1(fleet, tmp_path, "hang_once", timeout=300)
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


@pytest.mark.slow
def test_a_slow_attempt_that_keeps_finishing_rows_is_not_killed(fleet: Fleet, tmp_path: Path) -> None:
    """As above, shard 0 measures the rate; attempt 1 of shard 1 then finishes a row only every 2.5 s
    (the test-only worker sleeps before reporting each row), so with the 4 s floor it runs past its
    first deadline. Each finished row moves the deadline: no kill, one attempt, no strike."""
    w, sub, out = _four_rows_poisoning_shard_1(fleet, tmp_path, "slow_rows_once", timeout=120)
    log = w.log_text()
    assert '"attempt_deadline_exceeded"' not in log and "test poison: slow row" in log
    attempts = {s: n for s, n in fleet.live.attempts(sub["job_id"]).items() if s >= 0}
    assert attempts == {0: 1, 1: 1}
    assert int(fleet.live.client.hget(f"freight:strikes:{sub['job_id']}", "1")) == 0


def _four_rows_poisoning_shard_1(fleet: Fleet, tmp_path: Path, kind: str, timeout: float) -> tuple:
    """A 4-row job of 2 shards on one worker whose first attempt of shard 1 misbehaves as `kind`, with
    the deadline floor at 4 s and the unmeasured allowance at 30 s; waits for it to finish with every
    row. (worker, submission, output folder)."""
    out = tmp_path / "out"
    inp = make_input(tmp_path / "input.parquet", 4, max_tokens=(2,))
    w = fleet.start(kind[0], poison_shard=1, poison_kind=kind, serve_all=True,
                    FREIGHT_SHARD_DEADLINE_FLOOR_S="4", FREIGHT_SHARD_DEADLINE_UNMEASURED_S="30")  # fmt: skip
    sub = submit(fleet.env(), inp, fleet.model, out, 2, max_tokens=2)
    done = fleet.wait_done(out, timeout=timeout)
    assert done.returncode == 0, done.stderr
    assert len(result_rows(out)) == 4
    return w, sub, out
