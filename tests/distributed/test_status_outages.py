"""`freight status` shows a job's storage outages (worker/outages.py: attempts storage did not answer,
no strikes, FREIGHT_MAX_SHARD_STORAGE_OUTAGES a shard) from `freight:outages:<job>`, and nothing
about them for a job without any. Against a private redis-server; the counts are made with
LiveState's own calls, as a worker makes them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from freight_cli import app
from jobs.client import FleetClient
from jobs.fleet_status import fleet_status, outage_lines
from jobs.live_state import LiveState
from jobs.planner import prepare_job
from jobs.settings import Settings, get_settings
from jobs.spec import JobSpec

FINALIZE_SLOT = -1  # worker.tasks.FINALIZE_SLOT: finalize's attempts and outages


@pytest.fixture
def fleet_env(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("FREIGHT_REDIS_URL", redis_url)
    monkeypatch.setenv("FREIGHT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FREIGHT_MAX_SHARD_STORAGE_OUTAGES", "5")
    get_settings.cache_clear()
    yield redis_url
    get_settings.cache_clear()


def _submitted(tmp_path: Path, model: Path, redis_url: str) -> tuple[str, Path]:
    """A job of 3 shards, planned and on the queue (nothing ran). -> (job id, OUT)."""
    data = tmp_path / "in.parquet"
    pq.write_table(pa.table({"prompt": [f"prompt {i}" for i in range(6)]}), data)
    spec = JobSpec(input=str(data), model=str(model), output=str(tmp_path / "out"), shard_rows=2)
    prepared = prepare_job(spec)
    client = FleetClient(Settings(redis_url=redis_url))
    client.enqueue(job_id=spec.job_id, output=spec.output, model=spec.model,
                   shard_tokens={s.index: 1 for s in prepared.manifest.shards}, committed=[])  # fmt: skip
    client.close()
    return spec.job_id, tmp_path / "out"


def _outages(live: LiveState, job_id: str, shard: int, n: int) -> None:
    for _ in range(n):  # each attempt counted at its start, then its strike turned into an outage
        live.begin_attempt(job_id, shard)
        live.count_storage_outage(job_id, shard, holds_strike=True)


def test_status_shows_outages_against_the_budget(fleet_env: str, tmp_path: Path, demo_model: Path) -> None:
    job_id, out = _submitted(tmp_path, demo_model, fleet_env)
    live = LiveState(fleet_env)
    _outages(live, job_id, 2, 4)
    _outages(live, job_id, 0, 1)
    _outages(live, job_id, FINALIZE_SLOT, 2)
    live.begin_attempt(job_id, 1)  # a strike (an attempt that raised otherwise) is no outage

    from jobs.storage import open_store

    st = fleet_status(open_store(str(out)), live)
    live.close()
    assert st.storage_outages == {-1: 2, 0: 1, 2: 4}
    lines = outage_lines(st, 5)
    assert lines[0] == ("storage outages: 7 attempts of 2 shards and finalize found storage unavailable "
                        "(no strikes; a shard fails after 5, FREIGHT_MAX_SHARD_STORAGE_OUTAGES)")  # fmt: skip
    assert lines[1] == "  shard 2 4/5, finalize 2/5, shard 0 1/5"  # most first
    assert "FREIGHT_S3_ENDPOINT_URL" in lines[2]  # the job is not done: what to check

    result = CliRunner().invoke(app, ["status", str(out)])
    assert result.exit_code == 0, result.output
    assert "storage outages: 7 attempts of 2 shards and finalize" in result.output, result.output
    assert "shard 2 4/5, finalize 2/5, shard 0 1/5" in result.output


def test_status_says_nothing_of_outages_without_any(fleet_env: str, tmp_path: Path, demo_model: Path) -> None:
    job_id, out = _submitted(tmp_path, demo_model, fleet_env)
    live = LiveState(fleet_env)
    live.begin_attempt(job_id, 0)  # a strike
    live.close()
    result = CliRunner().invoke(app, ["status", str(out)])
    assert result.exit_code == 0, result.output
    assert "fleet: queued" in result.output and "storage outages" not in result.output, result.output


def test_outage_lines_cut_a_long_list() -> None:
    from jobs.fleet_status import FleetStatus

    st = FleetStatus(job_id="j", output="o", state="succeeded", shards_total=20, shards_queued=0,
                     shards_running=0, shards_committed=20, shards_failed=0, rows_total=20, rows_done=20,
                     rows_per_second=None, eta_seconds=None, storage_outages={i: 1 + i % 3 for i in range(12)})  # fmt: skip
    lines = outage_lines(st, 20, shown=3)
    assert lines == ["storage outages: 24 attempts of 12 shards found storage unavailable (no strikes; a shard "
                     "fails after 20, FREIGHT_MAX_SHARD_STORAGE_OUTAGES)",
                     "  shard 2 3/20, shard 5 3/20, shard 8 3/20, 9 more"]  # fmt: skip
