"""`freight eval run --submit` on a real fleet: Redis (DB 14, flushed) and a `freight worker`
subprocess. The report waits for the jobs, then scores exactly what the embedded run scores."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
import redis
from eval_workdir import freight, make_workdir, suite_text
from processes import stop_process

from jobs.client import queue_for_model
from jobs.evals.collect import read_scores
from jobs.evals.plan import job_specs, read_plan
from jobs.manifest import read_manifest
from jobs.settings import get_settings
from jobs.storage import open_store

REDIS_URL = "redis://127.0.0.1:6379/14"
SUITES = suite_text(
    "fleet",
    "data.parquet",
    """\
sampling = { max_tokens = 5, seed = 11 }
shard_rows = 6
metrics = [{ type = "contains", lowercase = true }, { type = "multiple_choice", choices_column = "options", reference_column = "right" }]
""",
)


@pytest.fixture
def fleet_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    monkeypatch.setenv("FREIGHT_REDIS_URL", REDIS_URL)
    get_settings.cache_clear()
    yield client
    client.flushdb()
    client.close()
    get_settings.cache_clear()


def _start_worker(model: Path, log: Path) -> subprocess.Popen[bytes]:
    exe = Path(sys.executable).with_name("freight")
    args = [
        str(exe),
        "worker",
        "--queues",
        queue_for_model(str(model)),
        "--hostname",
        "evals@test",
        "--loglevel",
        "WARNING",
    ]
    with open(log, "wb") as out:
        return subprocess.Popen(
            args, env={**os.environ, "FREIGHT_REDIS_URL": REDIS_URL}, stdout=out, stderr=subprocess.STDOUT
        )


def test_submitted_eval_scores_like_the_embedded_one(tmp_path: Path, fleet_env: redis.Redis) -> None:
    table = pa.table(
        {
            "prompt": [f"Item {i}: the colour is" for i in range(7)],
            "answer": ["e", "a", "o", "r", "blue", "t", "i"],
            "options": [["red", "blue"], ["green", "grey", "gold"]] * 3 + [["cyan", "magenta"]],
            "right": [0, 2, 1, 0, 1, 2, 1],
        }
    )
    make_workdir(tmp_path, SUITES, "data.parquet", table, seed=5)
    model, suites = tmp_path / "model", tmp_path / "suites.toml"
    embedded, fleet = str(tmp_path / "embedded"), str(tmp_path / "fleet")

    code, output = freight("eval", "run", str(suites), "--output", fleet, "--submit")
    assert code == 0 and "queued eval run" in output, output
    shards = sum(len(read_manifest(open_store(spec.output)).shards) for spec in job_specs(read_plan(fleet)))
    # every shard is queued (Redis keeps one list per priority step under the queue's name)
    queued = sum(
        fleet_env.llen(k)
        for k in fleet_env.keys(queue_for_model(str(model)) + "*")
        if fleet_env.type(k) == b"list"
    )
    assert shards >= 2 and queued == shards
    code, output = freight("eval", "report", fleet)
    assert code == 2 and "not finished yet" in output

    worker = _start_worker(model, tmp_path / "worker.log")
    try:
        deadline = time.monotonic() + 180
        while (code := freight("eval", "report", fleet))[0] == 2 and time.monotonic() < deadline:
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            time.sleep(0.5)
    finally:
        stop_process(worker)
    assert code[0] == 0, code[1]

    code, output = freight("eval", "run", str(suites), "--output", embedded)
    assert code == 0, output
    on_fleet, here = read_scores(fleet, "fleet", str(model)), read_scores(embedded, "fleet", str(model))
    columns = ["id", "completion", "contains", "multiple_choice", "multiple_choice_norm", "error"]
    assert on_fleet.select(columns).equals(here.select(columns))
    assert read_plan(fleet).run_id < read_plan(embedded).run_id
