"""freight.run_shard with a result cache, run in process (the real task code, a real Redis and OUT
folder): a worker loads the model only for a shard with rows the cache does not answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import worker.tasks
from jobs import datasets
from jobs.finalize import committed_shards
from jobs.manifest import shard_record_key
from jobs.planner import prepare_job
from jobs.result_cache.options import CacheOptions, write_cache_options
from jobs.settings import Settings
from jobs.spec import JobSpec, SamplingSpec
from tests.engine_loads import count_loads
from worker.local import run_local
from worker.runtime import ProcessRuntime


@pytest.fixture()
def rt(redis_url: str) -> Iterator[ProcessRuntime]:
    runtime = ProcessRuntime(Settings(redis_url=redis_url, metrics_port=0), worker_id="test#0", queues=())
    yield runtime  # not started: no threads
    runtime.live.close()
    runtime.live_fast.close()


def _job(tmp: Path, model: Path, name: str, rows: int, cache: str) -> Any:
    data = tmp / f"{name}.parquet"
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(rows)], "prompt": [f"def task_{i}(x):" for i in range(rows)]}),
                   data)  # fmt: skip
    spec = JobSpec(input=str(data), model=str(model), output=str(tmp / name), id_column="id", shard_rows=4,
                   sampling=SamplingSpec(max_tokens=3))  # fmt: skip
    prepared = prepare_job(spec)
    write_cache_options(prepared.store, CacheOptions(url=cache))
    return prepared


def test_a_worker_loads_the_model_only_for_rows_the_cache_does_not_answer(
    rt: ProcessRuntime, tmp_path: Path, demo_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = str(tmp_path / "cache")
    first = _job(tmp_path, demo_model, "first", 8, cache)
    assert run_local(first.store, first.manifest).report is not None  # fills the cache
    monkeypatch.setattr(worker.tasks, "runtime", lambda: rt)
    monkeypatch.setattr(worker.tasks, "finish_if_done", lambda *a: "running")  # no finalize message
    loads = count_loads(monkeypatch, worker.tasks)
    # rows 0-7 are cached; shard 2 (rows 8-11) is new: only it loads the model, once
    second = _job(tmp_path, demo_model, "second", 12, cache)
    for shard in range(3):
        assert worker.tasks.run_shard_task(second.manifest.job_id, str(tmp_path / "second"), shard)["status"] == "committed"
        assert rt.models.loads == (1 if shard == 2 else 0)
    assert loads == [second.manifest.job_id] and committed_shards(second.store) == {0, 1, 2}
    rows = {r["id"]: r for r in datasets.read_results(second.store).to_pylist()}
    assert [rows[f"q{i}"]["cached"] for i in range(12)] == ["exact"] * 8 + [None] * 4
    records = [json.loads(second.store.get(shard_record_key(s))) for s in range(3)]
    assert [r["cache_hits"] for r in records] == [4, 4, 0]
    assert records[0]["load_seconds"] == records[1]["load_seconds"] == 0 and records[2]["load_seconds"] > 0
    assert records[0]["busy_seconds"] == 0 and records[2]["busy_seconds"] > 0
