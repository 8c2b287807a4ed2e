"""The beat schedule built from a suite file, and the one-beat-per-file lock in Redis (DB 14)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from celery import Celery

from jobs.evals.beat import scheduler_class
from jobs.evals.cron import cron_fields, to_crontab
from jobs.evals.lock import BeatLock, LockHeldError, lock_key
from jobs.evals.schedule import COLLECT_SECONDS, COLLECT_TASK, SUBMIT_TASK, build_schedule
from jobs.evals.suite_loader import load_suite_file

SUITES = """\
[[suite]]
name = "nightly-qa"
dataset = "data/qa.parquet"
models = ["m1", "m2"]
reference_column = "answer"
schedule = "30 2 * * *"
metrics = [{ type = "exact_match" }]

[[suite]]
name = "weekday-qa"
dataset = "data/qa.parquet"
models = ["m1"]
reference_column = "answer"
schedule = "0 */6 * * 1-5"
metrics = [{ type = "contains" }]

[[suite]]
name = "manual-only"
dataset = "data/qa.parquet"
models = ["m1"]
reference_column = "answer"
metrics = [{ type = "contains" }]
"""


def test_schedule_has_one_entry_per_scheduled_suite_plus_the_collector(
    qa_dataset: Path, write_suites
) -> None:
    suite_file = load_suite_file(write_suites(SUITES))
    schedule = build_schedule(suite_file)
    assert sorted(schedule) == ["freight-eval:collect", "freight-eval:nightly-qa", "freight-eval:weekday-qa"]
    nightly, weekday = schedule["freight-eval:nightly-qa"], schedule["freight-eval:weekday-qa"]
    assert nightly["task"] == weekday["task"] == SUBMIT_TASK
    assert nightly["args"] == [str(suite_file.path), "nightly-qa"]
    assert nightly["schedule"].minute == {30} and nightly["schedule"].hour == {2}
    assert nightly["schedule"].day_of_week == set(range(7))
    assert weekday["schedule"].hour == {0, 6, 12, 18} and weekday["schedule"].day_of_week == {1, 2, 3, 4, 5}
    assert schedule["freight-eval:collect"] == {
        "task": COLLECT_TASK,
        "schedule": COLLECT_SECONDS,
        "args": [str(suite_file.path)],
    }
    # the next due time agrees with croniter's reading of the same string
    from croniter import croniter

    now = datetime(2026, 11, 27, 13, 7, tzinfo=UTC)  # a Friday
    expected = croniter("0 */6 * * 1-5", now).get_next(datetime)
    cron = weekday["schedule"]
    cron.nowfun = lambda: now  # read the schedule as if it were `now`
    remaining = cron.remaining_estimate(now)
    assert now + remaining == expected


def test_no_scheduled_suite_means_no_entries(qa_dataset: Path, write_suites) -> None:
    text = SUITES.replace('schedule = "30 2 * * *"\n', "").replace('schedule = "0 */6 * * 1-5"\n', "")
    assert build_schedule(load_suite_file(write_suites(text))) == {}


def test_cron_helpers() -> None:
    assert cron_fields("@daily") == ["0", "0", "*", "*", "*"]
    assert to_crontab("@hourly").minute == {0}
    with pytest.raises(ValueError, match="5|field"):
        cron_fields("* * *")


def test_scheduler_runs_entries_in_process(qa_dataset: Path, write_suites) -> None:
    suite_file = load_suite_file(write_suites(SUITES))
    calls: list[tuple] = []
    handlers = {
        SUBMIT_TASK: lambda *a: calls.append(("submit", *a)),
        COLLECT_TASK: lambda *a: calls.append(("collect", *a)),
    }
    app = Celery("test-beat", set_as_current=False)
    app.conf.beat_schedule = build_schedule(suite_file)
    scheduler = scheduler_class(handlers, lock=None)(app=app, lazy=False)
    for name in ("freight-eval:nightly-qa", "freight-eval:collect"):
        scheduler.apply_entry(scheduler.schedule[name])
    assert calls == [("submit", str(suite_file.path), "nightly-qa"), ("collect", str(suite_file.path))]


@pytest.fixture
def redis_db14() -> redis.Redis:
    client = redis.Redis.from_url("redis://127.0.0.1:6379/14")
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def test_second_beat_for_the_same_file_is_refused(redis_db14: redis.Redis) -> None:
    first = BeatLock(redis_db14, "/srv/suites.toml", ttl_seconds=30)
    second = BeatLock(redis_db14, "/srv/suites.toml", ttl_seconds=30)
    other_file = BeatLock(redis_db14, "/srv/other.toml", ttl_seconds=30)
    with first:
        with pytest.raises(LockHeldError, match="another beat already runs") as info:
            second.acquire()
        assert first.token in str(info.value) and lock_key("/srv/suites.toml") in str(info.value)
        other_file.acquire()  # a different suite file has its own lock
        assert 0 < redis_db14.pttl(first.key) <= 30_000
    assert redis_db14.get(first.key) is None  # released on exit
    second.acquire()
    assert not first.refresh() and first.lost.is_set()  # no longer the holder: cannot extend
    first.release()  # and cannot delete the new holder's lease
    assert second.holder() == second.token


def test_lease_is_refreshed_while_held_and_expires_when_the_holder_dies(redis_db14: redis.Redis) -> None:
    lock = BeatLock(redis_db14, "suites", ttl_seconds=1.2)
    with lock:
        time.sleep(1.8)  # longer than the ttl: the refresher thread kept it
        assert lock.holder() == lock.token and not lock.lost.is_set()
    dead = BeatLock(redis_db14, "suites", ttl_seconds=1)
    dead.acquire()  # never refreshed, as if its process was killed
    with pytest.raises(LockHeldError):
        BeatLock(redis_db14, "suites").acquire()
    time.sleep(1.1)
    BeatLock(redis_db14, "suites").acquire()


def test_refresh_failure_is_noticed(redis_db14: redis.Redis) -> None:
    lock = BeatLock(redis_db14, "suites", ttl_seconds=1.5)
    with lock:
        redis_db14.delete(lock.key)  # e.g. an operator removed it, or Redis lost it
        assert lock.lost.wait(2.0)


def test_freight_beat_refuses_a_second_beat_for_the_same_file(
    qa_dataset: Path, write_suites, redis_db14: redis.Redis
) -> None:
    """Two real `freight beat` processes on one suite file: the second exits 2 naming the first;
    SIGTERM stops the first and frees the lock."""
    suites = write_suites(SUITES)
    exe = Path(sys.executable).with_name("freight")
    env = {**os.environ, "FREIGHT_REDIS_URL": "redis://127.0.0.1:6379/14", "FREIGHT_LOG_FORMAT": "json"}
    key = lock_key(load_suite_file(suites).lock_id)
    first = subprocess.Popen(
        [str(exe), "beat", str(suites)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 60
        while redis_db14.get(key) is None:
            assert first.poll() is None and time.monotonic() < deadline, (
                first.stdout.read().decode() if first.stdout else ""
            )
            time.sleep(0.1)
        holder = redis_db14.get(key).decode()
        assert holder.split(":")[1] == str(first.pid)
        second = subprocess.run(
            [str(exe), "beat", str(suites)], env=env, capture_output=True, text=True, timeout=60
        )
        assert second.returncode == 2
        assert "another beat already runs" in second.stderr and holder in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(30)
    assert first.returncode == 0
    assert redis_db14.get(key) is None  # released on the way out, not left to expire
