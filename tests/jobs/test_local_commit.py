"""The embedded runner commits each shard on its commit thread while the next shard computes: the
result is the same as committing in line, and a failed commit stops the job with that error and
loses nothing (a rerun commits the rest, each row exactly once)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pytest
from pipeline_data import prompts_table, write_parquet

from jobs import datasets
from jobs.manifest import shard_result_key
from jobs.planner import prepare_job
from jobs.spec import JobSpec, SamplingSpec
from jobs.storage.local import LocalStore
from worker.local import run_local


class RecordingStore(LocalStore):
    """A LocalStore that notes which thread commits each shard result, and can fail one commit."""

    def __init__(self, root: Path, fail_key: str | None = None) -> None:
        super().__init__(root)
        self.fail_key = fail_key
        self.committers: dict[str, str] = {}

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if key == self.fail_key:
            raise OSError(f"disk full writing {key}")
        if key.startswith("shards/") and key.endswith(".parquet"):
            self.committers[key] = threading.current_thread().name
        return super().put_if_absent(key, data)


def _ids(store: LocalStore) -> list[str]:
    shards = pads.dataset(store.root / "shards")
    return shards.to_table().column("id").to_pylist()


@pytest.fixture(scope="module")
def engine(demo_model_dir: Path) -> Any:
    from worker.engine import Engine, EngineConfig

    return Engine.from_pretrained(demo_model_dir, EngineConfig(device="cpu", kv_cache_bytes=64 << 20))


def _prepare(tmp_path: Path, model: Path) -> Any:
    data = write_parquet(prompts_table(24, bad=False), tmp_path / "in.parquet")
    spec = JobSpec(
        input=str(data),
        model=str(model),
        output=str(tmp_path / "out"),
        id_column="id",
        sampling=SamplingSpec(max_tokens=4),
        shard_rows=6,
    )
    return prepare_job(spec)


def test_shards_commit_on_the_commit_thread(tmp_path: Path, demo_model_dir: Path, engine: Any) -> None:
    prepared = _prepare(tmp_path, demo_model_dir)
    store = RecordingStore(prepared.store.root)
    run = run_local(store, prepared.manifest, engine=engine)

    assert run.report is not None and [o.status for o in run.outcomes] == ["committed"] * 4
    assert [o.shard for o in run.outcomes] == [0, 1, 2, 3]  # settled in shard order
    assert set(store.committers) == {shard_result_key(i) for i in range(4)}
    assert all(name.startswith("freight-commit") for name in store.committers.values())
    ids = _ids(store)
    assert sorted(ids) == [f"row-{i:04d}" for i in range(24)]


def test_failed_commit_stops_the_job_and_a_rerun_finishes_it(
    tmp_path: Path, demo_model_dir: Path, engine: Any
) -> None:
    prepared = _prepare(tmp_path, demo_model_dir)
    failing = RecordingStore(prepared.store.root, fail_key=shard_result_key(1))
    with pytest.raises(OSError, match="disk full"):
        run_local(failing, prepared.manifest, engine=engine)
    assert failing.exists(shard_result_key(0))
    assert not failing.exists(shard_result_key(1))
    assert not failing.exists("_SUCCESS")
    # shard 2 was computing while shard 1's commit failed: it must not have been committed after it
    assert not failing.exists(shard_result_key(2))

    store = RecordingStore(prepared.store.root)
    rerun = run_local(store, prepared.manifest, engine=engine)
    assert rerun.report is not None and rerun.report["rows"] == 24
    assert set(store.committers) == {shard_result_key(i) for i in (1, 2, 3)}  # shard 0 kept
    ids = _ids(store)
    assert sorted(ids) == [f"row-{i:04d}" for i in range(24)]


def test_a_stop_waits_for_the_commit_in_flight(tmp_path: Path, demo_model_dir: Path, engine: Any) -> None:
    """Stopped as shard 2 starts, while shard 1's commit runs beside it: shard 1 still commits, shard
    2 is interrupted, and a rerun finishes the job with each row once."""
    prepared = _prepare(tmp_path, demo_model_dir)
    rows_done = {"n": 0}

    def count(_progress: Any) -> None:
        rows_done["n"] += 1

    run = run_local(
        prepared.store, prepared.manifest, engine=engine, on_row=count, should_stop=lambda: rows_done["n"] >= 12
    )
    assert run.report is None
    assert [(o.shard, o.status) for o in run.outcomes] == [(0, "committed"), (1, "committed"), (2, "interrupted")]
    assert prepared.store.exists(shard_result_key(1)) and not prepared.store.exists(shard_result_key(2))
    assert prepared.store.list("waste/")  # shard 2's attempt, priced as waste

    rerun = run_local(prepared.store, prepared.manifest, engine=engine)
    assert rerun.report is not None and [o.shard for o in rerun.outcomes] == [2, 3]
    assert sorted(_ids(prepared.store)) == [f"row-{i:04d}" for i in range(24)]


def test_rerun_reads_the_partial_rows_of_an_interrupted_shard(
    tmp_path: Path, demo_model_dir: Path, engine: Any
) -> None:
    """Stopped inside shard 2: its finished rows go to partial/00002/0.parquet; the rerun (which lists
    partial/ once for the job) runs shard 2 as attempt 1 and computes only the rows not saved."""
    table = prompts_table(24, bad=False)
    table = table.append_column("max_tokens", pa.array([1 + i % 6 for i in range(24)], pa.int64()))
    spec = JobSpec(
        input=str(write_parquet(table, tmp_path / "in.parquet")),
        model=str(demo_model_dir),
        output=str(tmp_path / "out"),
        id_column="id",
        shard_rows=6,
    )  # rows of a shard finish at different steps
    prepared = prepare_job(spec)
    rows_done = {"n": 0}

    def count(_progress: Any) -> None:
        rows_done["n"] += 1

    run = run_local(
        prepared.store, prepared.manifest, engine=engine, on_row=count, should_stop=lambda: rows_done["n"] >= 14
    )
    assert run.report is None and run.outcomes[-1].status == "interrupted"
    partial = prepared.store.list("partial/")
    assert partial == ["partial/00002/0.parquet"]
    saved = datasets.read_result(prepared.store.get(partial[0])).num_rows
    assert 0 < saved < 6

    rerun = run_local(prepared.store, prepared.manifest, engine=engine)
    shard2 = next(o for o in rerun.outcomes if o.shard == 2)
    assert shard2.status == "committed" and shard2.record is not None
    assert (shard2.record.attempt, shard2.record.rows_from_partial) == (1, saved)
    assert prepared.store.list("partial/") == []
    assert sorted(_ids(prepared.store)) == [f"row-{i:04d}" for i in range(24)]
