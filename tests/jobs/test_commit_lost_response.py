"""A conditional PUT that S3 stored but whose response was lost: the client's retry gets 412, yet the
object is this attempt's own commit (worker.shard_commit.committed_by, the metadata's commit token),
so the shard is committed, not a lost race: no waste record, costs/<n>.json written, partial files
gone, the cost report the same as without the lost response. A genuine lost race stays one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lost_response_s3 import LostResponseS3
from pipeline_data import prompts_table, write_parquet

from jobs import datasets
from jobs.cost import AttemptRecord, ShardRecord
from jobs.errors import StorageUnavailableError
from jobs.finalize import load_shard_record
from jobs.manifest import shard_record_key, shard_result_key
from jobs.planner import prepare_job
from jobs.settings import Settings, get_settings
from jobs.spec import JobSpec, SamplingSpec
from jobs.storage import ObjectStore, open_store
from jobs.storage.local import LocalStore
from worker.local import run_local
from worker.shard import compute_shard
from worker.shard_commit import ComputedShard, commit_shard

ROWS, SHARD_ROWS = 12, 6


def _engine(model: Path) -> Any:
    from worker.engine import Engine, EngineConfig

    return Engine.from_pretrained(model, EngineConfig(device="cpu", kv_cache_bytes=64 << 20))


@pytest.fixture(scope="module")
def engine(demo_model_dir: Path) -> Any:
    return _engine(demo_model_dir)


def _spec(data: Path, model: Path, out: str) -> JobSpec:
    return JobSpec(input=str(data), model=str(model), output=out, id_column="id",
                   sampling=SamplingSpec(max_tokens=4), shard_rows=SHARD_ROWS)  # fmt: skip


def _run_interrupted_then_resumed(spec: JobSpec, settings: Settings, engine: Any) -> tuple[Any, ObjectStore]:
    """Run the job until shard 1 starts (shard 0 commits; shard 1 stops as its engine starts, its bad
    rows saved under partial/), then rerun it: the rerun reads those rows and commits shard 1.
    -> (the outcomes of both runs, the rerun's report, the job's store)."""
    prepared = prepare_job(spec, settings)
    rows_done = {"n": 0}

    def count(_progress: Any) -> None:
        rows_done["n"] += 1

    first = run_local(prepared.store, prepared.manifest, engine=engine, settings=settings, on_row=count,
                      should_stop=lambda: rows_done["n"] >= SHARD_ROWS)  # fmt: skip
    assert [(o.shard, o.status) for o in first.outcomes] == [(0, "committed"), (1, "interrupted")]
    assert prepared.store.list("partial/00001/")
    rerun = run_local(prepared.store, prepared.manifest, engine=engine, settings=settings)
    return (first.outcomes + rerun.outcomes, rerun.report), prepared.store


def _waste(store: ObjectStore) -> list[AttemptRecord]:
    return [AttemptRecord.model_validate_json(store.get(k)) for k in store.list("waste/")]


def test_a_commit_whose_response_was_lost_is_committed(
    tmp_path: Path, demo_model_dir: Path, s3_env: Settings, s3_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    data = write_parquet(prompts_table(ROWS, bad=True), tmp_path / "in.parquet")
    base_url = "s3://freight-test/lost-response/{}"
    # each run gets a fresh engine: a warm prefix cache would change cached_tokens between them
    (_, base), plain = _run_interrupted_then_resumed(_spec(data, demo_model_dir, base_url.format("plain")),
                                                     s3_env, _engine(demo_model_dir))  # fmt: skip
    proxy = LostResponseS3(s3_endpoint, part="/shards/")
    try:
        monkeypatch.setenv("FREIGHT_S3_ENDPOINT_URL", proxy.url)
        get_settings.cache_clear()
        out = base_url.format("proxied")
        (outcomes, report), _ = _run_interrupted_then_resumed(_spec(data, demo_model_dir, out), Settings(),
                                                              _engine(demo_model_dir))  # fmt: skip
    finally:
        proxy.close()
        monkeypatch.setenv("FREIGHT_S3_ENDPOINT_URL", s3_endpoint)
        get_settings.cache_clear()

    # each shard's first conditional PUT was stored (200) and its answer dropped; the retry got 412
    paths = sorted(proxy.dropped)
    assert len(paths) == 2 and all(p.endswith((shard_result_key(0), shard_result_key(1))) for p in paths)
    assert proxy.dropped_status == [200, 200]
    assert sorted(proxy.statuses) == sorted([(p, 200) for p in paths] + [(p, 412) for p in paths])

    store = open_store(out, s3_env)  # moto itself, not through the proxy
    committed = [o for o in outcomes if o.status != "interrupted"]
    assert [(o.shard, o.status) for o in committed] == [(0, "committed"), (1, "committed")]
    assert [w.reason for w in _waste(store)] == ["interrupted"]  # the stopped attempt only: no lost_race
    assert not store.list("partial/")
    for shard, outcome in enumerate(committed):
        record = ShardRecord.model_validate_json(store.get(shard_record_key(shard)))
        assert record == outcome.record == load_shard_record(store, shard)

    # every row exactly once, the same rows as without the lost responses
    table = datasets.read_results(store).sort_by("id")
    assert table.column("id").to_pylist() == [f"row-{i:04d}" for i in range(ROWS)]
    plain_table = datasets.read_results(plain).sort_by("id")
    for column in ("completion", "finish_reason", "error", "prompt_tokens", "completion_tokens"):
        assert table.column(column).to_pylist() == plain_table.column(column).to_pylist(), column

    assert report is not None and base is not None
    for key in ("rows", "rows_failed", "prompt_tokens", "cached_tokens", "completion_tokens",
                "uncommitted_attempts"):  # fmt: skip
        assert report[key] == base[key], key
    assert report["uncommitted_attempts"] == 1  # the interrupted attempt, as in the plain run
    # billed once: the committed records plus the interrupted attempt, nothing for a "lost race"
    billed = sum(o.record.cost_usd for o in committed if o.record) + sum(w.cost_usd for w in _waste(store))
    assert report["cost_usd"] == pytest.approx(billed, rel=1e-9, abs=1e-12)
    assert round(report["cost_usd"], 2) == round(base["cost_usd"], 2)
    assert round(report["wasted_cost_usd"], 2) == round(base["wasted_cost_usd"], 2)


class LostAnswerStore(LocalStore):
    """put_if_absent stores the result, then answers False, as S3Store does when the response of the
    PUT that stored it was lost and the retry got 412; `get` can be made to fail as storage away."""

    def __init__(self, root: Path, *, get_fails: bool = False) -> None:
        super().__init__(root)
        self.get_fails = get_fails

    def put_if_absent(self, key: str, data: bytes) -> bool:
        super().put_if_absent(key, data)
        return False

    def get(self, key: str) -> bytes:
        if self.get_fails and key.startswith("shards/"):
            raise StorageUnavailableError(f"no answer for {key}: a later try may succeed")
        return super().get(key)


def _computed(tmp_path: Path, model: Path, engine: Any) -> tuple[Any, ComputedShard, ComputedShard]:
    """Two computations of shard 0 with the same attempt number in one process (a duplicate delivery,
    or two `freight run`s of one OUT): their records may differ only in timings."""
    data = write_parquet(prompts_table(ROWS, bad=False), tmp_path / "in.parquet")
    prepared = prepare_job(_spec(data, model, str(tmp_path / "out")))
    first, second = (compute_shard(engine, prepared.store, prepared.manifest, 0, attempt=1) for _ in "ab")
    assert isinstance(first, ComputedShard) and isinstance(second, ComputedShard)
    assert first.record.attempt == second.record.attempt and first.record.worker == second.record.worker
    return prepared, first, second


def test_another_attempts_object_is_still_a_lost_race(tmp_path: Path, demo_model_dir: Path, engine: Any) -> None:
    prepared, first, second = _computed(tmp_path, demo_model_dir, engine)
    store = prepared.store
    assert commit_shard(store, first).status == "committed"
    lost = commit_shard(store, second)
    assert lost.status == "lost_race" and lost.record is None
    assert [w.reason for w in _waste(store)] == ["lost_race"]
    assert load_shard_record(store, 0) == first.record  # the winner's record stands


def test_a_lost_response_on_a_local_store_is_committed(tmp_path: Path, demo_model_dir: Path, engine: Any) -> None:
    prepared, first, _ = _computed(tmp_path, demo_model_dir, engine)
    store = LostAnswerStore(prepared.store.root)
    outcome = commit_shard(store, first)
    assert outcome.status == "committed" and outcome.record == first.record
    assert not store.list("waste/") and load_shard_record(store, 0) == first.record


def test_storage_away_while_telling_whose_object_it_is_raises(
    tmp_path: Path, demo_model_dir: Path, engine: Any
) -> None:
    """No guess: neither costs/<n>.json (it may be another attempt's object) nor a waste record (it
    may be this one's); the error goes to the caller's storage-outage path."""
    prepared, first, _ = _computed(tmp_path, demo_model_dir, engine)
    store = LostAnswerStore(prepared.store.root, get_fails=True)
    with pytest.raises(StorageUnavailableError, match="later try"):
        commit_shard(store, first)
    assert store.exists(shard_result_key(0))
    assert not store.list("costs/") and not store.list("waste/")
