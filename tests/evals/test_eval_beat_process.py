"""`freight beat` for real (slow: waits for a cron minute): a beat process and a worker process on
Redis DB 14. The suite is submitted at the next minute, run by the worker, then collected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from processes import stop_process

from jobs.client import queue_for_model
from jobs.evals.beat import PENDING_PREFIX
from jobs.storage import LocalStore

REDIS_URL = "redis://127.0.0.1:6379/14"


@pytest.mark.slow
def test_beat_submits_on_the_cron_and_reports_the_run(tmp_path: Path) -> None:
    from worker.demo_model import make_demo_model

    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    model = make_demo_model(tmp_path / "model", "llama", seed=6)
    pq.write_table(pa.table({"prompt": ["a b", "c d"], "reference": ["x", "y"]}), tmp_path / "d.parquet")
    suites = tmp_path / "suites.toml"
    suites.write_text(
        'history = "history"\noutput = "runs"\n[[suite]]\nname = "every-minute"\ndataset = "d.parquet"\n'
        'models = ["model"]\nschedule = "* * * * *"\nsampling = { max_tokens = 2 }\nmetrics = [{ type = "contains" }]\n'
    )
    exe = str(Path(sys.executable).with_name("freight"))
    env = {**os.environ, "FREIGHT_REDIS_URL": REDIS_URL, "FREIGHT_LOG_FORMAT": "json"}
    logs = {name: open(tmp_path / f"{name}.log", "wb") for name in ("beat", "worker")}  # noqa: SIM115
    beat = subprocess.Popen(
        [exe, "beat", str(suites)], env=env, stdout=logs["beat"], stderr=subprocess.STDOUT
    )
    worker = subprocess.Popen(
        [
            exe,
            "worker",
            "--queues",
            queue_for_model(str(model)),
            "--hostname",
            "beat@test",
            "--loglevel",
            "WARNING",
        ],
        env=env,
        stdout=logs["worker"],
        stderr=subprocess.STDOUT,
    )
    runs = LocalStore(tmp_path / "runs")
    try:
        deadline = time.monotonic() + 240
        reports: list[str] = []
        while not reports and time.monotonic() < deadline:
            assert beat.poll() is None and worker.poll() is None
            reports = [k for k in runs.list("every-minute/") if k.endswith("/report.json")]
            time.sleep(1)
    finally:
        stop_process(beat)
        stop_process(worker)
        for log in logs.values():
            log.close()
        client.flushdb()
        client.close()
    assert reports, (tmp_path / "beat.log").read_text()[-3000:]
    report = json.loads(runs.get(reports[0]))
    assert report["entries"][0]["rows"] == 2 and report["entries"][0]["suite"] == "every-minute"
    assert f"{PENDING_PREFIX}every-minute/{report['run_id']}.json" not in runs.list(
        PENDING_PREFIX
    )  # collected
