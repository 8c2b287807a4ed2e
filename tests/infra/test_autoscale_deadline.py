"""`freight submit --deadline` reaches the job hash the autoscaler reads, and the fleet is sized for it
(real Redis, DB 13)."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from jobs.autoscale.backlog import RedisBacklogReader
from jobs.autoscale.policy import ScalerState, ScalingLimits, decide
from freight_cli import app
from freight_cli.lifecycle_options import parse_deadline
from jobs.log import configure_logging
from jobs.progress import WorkerBeat, job_key
from jobs.settings import get_settings

# 4 shards of 10 rows at max_tokens 100: 4,000 completion tokens queued. At 1 token/s per worker, one
# worker drains them within the (long) drain target; 30 minutes need ceil(4000 / 1800) = 3 workers.
LIMITS = ScalingLimits(max_workers=8, target_drain_s=86_400.0)


@pytest.fixture
def submit(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A function that runs `freight submit` of one 40-row job with extra args: (exit code, stdout, stderr)."""
    monkeypatch.setenv("FREIGHT_REDIS_URL", redis_url)
    get_settings.cache_clear()
    inp = tmp_path / "in.parquet"
    pq.write_table(pa.table({"prompt": [f"{i:03d} prompt" for i in range(40)]}), inp)
    from worker.demo_model import make_demo_model

    model = make_demo_model(tmp_path / "model")  # submit checks the checkpoint's files; nothing loads it
    base = [
        "submit", str(inp), "--model", str(model), "--output", str(tmp_path / "out"),
        "--shard-rows", "10", "--max-tokens", "100",
    ]  # fmt: skip

    def run(*extra: str) -> tuple[int, str, str]:
        result = CliRunner().invoke(app, [*base, *extra])
        return result.exit_code, result.stdout, result.stderr

    yield run
    get_settings.cache_clear()
    configure_logging("json", "warning")  # CliRunner pointed structlog at its own, now closed, stderr


def _decide(rdb, now: float):
    rdb.hset("freight:workers", "w1", WorkerBeat("w1", False, None, "q", 1.0, now).to_json())
    return decide(RedisBacklogReader(rdb).read(), 0, ScalerState(), LIMITS, now)


def test_deadline_reaches_redis_and_sizes_the_fleet(submit, rdb):
    before = time.time()
    code, out, err = submit("--deadline", "30m")
    assert code == 0, err
    job_id = out.strip().splitlines()[-1]
    deadline = float(rdb.hget(job_key(job_id), "deadline"))
    assert before + 1800 <= deadline <= time.time() + 1800
    assert _decide(rdb, before).demand == 3

    # a resubmit without --deadline clears it: the drain target alone asks for one worker
    code, _, err = submit()
    assert code == 0, err
    assert rdb.hget(job_key(job_id), "deadline") is None
    assert _decide(rdb, time.time()).demand == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [("soon", "neither an ISO-8601 time"), ("2h30", "neither"), ("2020-01-01T00:00Z", "not in the future")],
)
def test_a_bad_deadline_exits_with_one_line_and_queues_nothing(submit, rdb, value, message):
    code, _, err = submit("--deadline", value)
    assert code != 0
    assert len(err.strip().splitlines()) == 1 and message in err
    assert rdb.keys("freight:job:*") == []


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("2h", 7200),
        ("30m", 1800),
        ("1h30m", 5400),
        ("1d", 86400),
        ("45s", 45),
        ("2099-01-01T00:00+00:00", None),
    ],
)
def test_parse_deadline(value, seconds):
    now = 1_700_000_000.0
    expected = now + seconds if seconds is not None else 4_070_908_800.0
    assert parse_deadline(value, now) == expected
