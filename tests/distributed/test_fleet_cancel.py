"""`freight cancel` refuses a job that already ended; after a cancel, `freight status` and its fleet
line say the same thing. Against a private redis-server."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from freight_cli import app
from jobs.settings import get_settings


@pytest.fixture
def fleet_env(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("FREIGHT_REDIS_URL", redis_url)
    monkeypatch.setenv("FREIGHT_CACHE_DIR", str(tmp_path / "cache"))
    get_settings.cache_clear()
    yield redis_url
    get_settings.cache_clear()


@pytest.fixture
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from worker.demo_model import make_demo_model

    return make_demo_model(tmp_path_factory.mktemp("model") / "tiny")


def _data(tmp_path: Path) -> Path:
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"prompt": ["def f(x):", "class A:", "import os", "for i in"]}), path)
    return path


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


@pytest.mark.slow
def test_cancel_refuses_a_job_that_succeeded(fleet_env: str, tmp_path: Path, model: Path) -> None:
    out = tmp_path / "out"
    code, output = _invoke("run", str(_data(tmp_path)), "--model", str(model), "--output", str(out), "--max-tokens", "2")
    assert code == 0, output
    code, output = _invoke("cancel", str(out))
    assert code == 2 and "already succeeded: there is nothing to cancel" in output, output
    assert not (out / "_CANCELLED").exists()


def test_cancel_refuses_a_job_that_failed(fleet_env: str, tmp_path: Path, model: Path) -> None:
    from jobs.markers import write_failure, write_failures_manifest
    from jobs.planner import prepare_job
    from jobs.spec import JobSpec

    spec = JobSpec(input=str(_data(tmp_path)), model=str(model), output=str(tmp_path / "out"))
    prepared = prepare_job(spec)
    for shard in prepared.manifest.shards:
        write_failure(prepared.store, {"job_id": spec.job_id, "shard": shard.index, "rows": shard.rows,
                                       "attempts": 3, "reason": "worker lost", "at": 0.0})  # fmt: skip
    write_failures_manifest(prepared.store, spec.job_id)
    code, output = _invoke("cancel", str(tmp_path / "out"))
    assert code == 2 and "already failed" in output, output
    code, output = _invoke("status", str(tmp_path / "out"))
    assert code == 0 and re.search(r"state\s+│\s+failed", output) and "fleet: failed" in output, output


def test_status_and_its_fleet_line_agree_after_a_cancel(fleet_env: str, tmp_path: Path, model: Path) -> None:
    from jobs.planner import prepare_job
    from jobs.spec import JobSpec

    spec = JobSpec(input=str(_data(tmp_path)), model=str(model), output=str(tmp_path / "out"))
    prepare_job(spec)  # submitted, nothing ran yet
    code, output = _invoke("cancel", str(tmp_path / "out"))
    assert code == 0, output
    assert json.loads((tmp_path / "out" / "_CANCELLED").read_text())["job_id"] == spec.job_id
    code, output = _invoke("status", str(tmp_path / "out"))
    assert code == 0, output
    assert re.search(r"state\s+│\s+cancelled", output) and "fleet: cancelled" in output, output
    code, output = _invoke("cancel", str(tmp_path / "out"))  # again (e.g. Redis was down the first time)
    assert code == 0, output
