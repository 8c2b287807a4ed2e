"""The result cache across jobs: a rerun serves its deterministic rows from the cache with the text
recomputation gives, a changed checkpoint or sampling field misses, writes race safely, bad caches
are refused or skipped, S3 works, and `freight cache stats | prune` keep it."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pipeline_data import write_parquet
from typer.testing import CliRunner

from freight_cli import app
from jobs import datasets
from jobs.planner import prepare_job
from jobs.result_cache.options import CacheOptions, cache_off, write_cache_options
from jobs.result_cache.retention import cache_stats, prune
from jobs.result_cache.store import ResultCache
from jobs.spec import JobSpec, SamplingSpec
from jobs.storage import open_store
from tests.engine_loads import count_loads
from worker.local import run_local

N = 40


@pytest.fixture(scope="module")
def engine(demo_model_dir: Path) -> Any:
    from worker.engine import Engine, EngineConfig

    return Engine.from_pretrained(demo_model_dir, EngineConfig(device="cpu", kv_cache_bytes=64 << 20))


def _table(n: int = N) -> pa.Table:
    return pa.table({"id": [f"q{i}" for i in range(n)], "prompt": [f"def task_{i}(x):" for i in range(n)]})


def _run(tmp: Path, model: Path, name: str, cache: str | None, engine: Any = None, table: pa.Table | None = None,
         **kw: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:  # fmt: skip
    data = write_parquet(table if table is not None else _table(), tmp / f"{name}.parquet")
    kw.setdefault("sampling", SamplingSpec(max_tokens=5))
    spec = JobSpec(input=str(data), model=str(model), output=str(tmp / name), id_column="id", shard_rows=10, **kw)
    prepared = prepare_job(spec)
    write_cache_options(prepared.store, CacheOptions(url=cache))
    report = run_local(prepared.store, prepared.manifest, engine=engine).report
    assert report is not None
    return report, {r["id"]: r for r in datasets.read_results(prepared.store).to_pylist()}


ANSWER = ("completion", "finish_reason", "prompt_tokens", "completion_tokens", "logprobs", "completions")


def test_a_rerun_is_served_from_the_cache_with_the_same_answers(tmp_path: Path, demo_model_dir: Path, engine: Any) -> None:
    cache = str(tmp_path / "cache")
    first, rows1 = _run(tmp_path, demo_model_dir, "night1", cache, engine)
    assert first["result_cache_hits"] == 0 and first["result_cache_entries_written"] == N
    second, rows2 = _run(tmp_path, demo_model_dir, "night2", cache, engine)
    assert second["result_cache_hits"] >= 0.95 * N  # it computes at most 5% of the rows
    assert second["completion_tokens"] <= 0.05 * first["completion_tokens"]
    for i, row in rows2.items():  # the same text as recomputation gave
        assert {k: row[k] for k in ANSWER} == {k: rows1[i][k] for k in ANSWER}
        assert row["cached"] == "exact" and row["cached_from_job"] == first["job_id"] and row["cached_from_row"] == i
    assert all(r["cached"] is None for r in rows1.values())
    assert second["result_cache_tokens"] == sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows2.values())
    assert second["result_cache_seconds"] > 0 and second["result_cache_usd_saved"] > 0
    assert second["result_cache_usd_saved"] == pytest.approx(second["result_cache_seconds"] * second["shards"][0][
        "price_per_hour"] / 3600)  # fmt: skip
    # a third run without the cache recomputes: the same text again (the CPU engine is deterministic)
    _, rows3 = _run(tmp_path, demo_model_dir, "nocache", None, engine)
    assert all(rows3[i]["completion"] == rows1[i]["completion"] for i in rows1)
    # the job's index objects were merged at finalize: one per job
    space = ResultCache.open(cache).spaces()[0]
    assert sorted(p.name for p in (tmp_path / "cache" / "spaces" / space / "index").iterdir()) == [
        f"{first['job_id']}.parquet"]  # fmt: skip


def test_a_rerun_answered_in_full_never_loads_the_model(tmp_path: Path, demo_model_dir: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    import worker.local

    loads = count_loads(monkeypatch, worker.local)
    counted = worker.local.load_engine  # the counting wrapper, put back for the third run
    cache = str(tmp_path / "cache")
    first, rows1 = _run(tmp_path, demo_model_dir, "night1", cache)  # run_local's own (lazy) engine
    assert loads == [first["job_id"]] and first["load_seconds"] > 0
    assert first["shards"][0]["load_seconds"] > 0 and all(s["load_seconds"] == 0 for s in first["shards"][1:])

    def refused(manifest: Any, *args: Any) -> Any:
        raise AssertionError("an all-hit job loaded the model")

    monkeypatch.setattr(worker.local, "load_engine", refused)
    second, rows2 = _run(tmp_path, demo_model_dir, "night2", cache)
    assert second["result_cache_hits"] == N and second["rows"] == N
    assert {i: r["completion"] for i, r in rows2.items()} == {i: r["completion"] for i, r in rows1.items()}
    # the cost report bills no load and no engine time, only the lookups' wall time
    assert second["load_seconds"] == 0 and second["busy_seconds"] == 0
    assert second["completion_tokens"] == 0 and second["cost_usd"] < first["cost_usd"]
    assert all(s["load_seconds"] == 0 and s["cache_hits"] == 10 for s in second["shards"])

    # new rows in a later shard only: the model loads once, billed to the first shard that computes
    monkeypatch.setattr(worker.local, "load_engine", counted)
    table = _table(N + 5)
    third, rows3 = _run(tmp_path, demo_model_dir, "night3", cache, table=table)
    assert loads == [first["job_id"], third["job_id"]]
    assert third["result_cache_hits"] == N and rows3[f"q{N + 4}"]["cached"] is None
    billed = [s["load_seconds"] for s in sorted(third["shards"], key=lambda s: s["shard"])]
    assert billed[-1] > 0 and billed[:-1] == [0.0] * (len(billed) - 1)


def test_a_changed_checkpoint_at_the_same_path_gets_no_hits(tmp_path: Path, demo_model_dir: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(demo_model_dir, model)
    cache = str(tmp_path / "cache")
    _run(tmp_path, model, "a", cache, table=_table(8))
    from safetensors.torch import load_file, save_file

    weights = load_file(str(model / "model.safetensors"))
    name = sorted(weights)[0]
    weights[name] = weights[name] * 1.5  # another checkpoint written over the same path
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})
    report, _ = _run(tmp_path, model, "b", cache, table=_table(8))
    assert report["result_cache_hits"] == 0


def test_a_changed_sampling_field_misses_the_rows_it_touches(tmp_path: Path, demo_model_dir: Path, engine: Any) -> None:
    cache = str(tmp_path / "cache")
    _run(tmp_path, demo_model_dir, "base", cache, engine, table=_table(12))
    changed = _table(12).append_column("max_tokens", pa.array([5] * 8 + [4] * 4, pa.int64()))
    report, rows = _run(tmp_path, demo_model_dir, "changed", cache, engine, table=changed)
    assert report["result_cache_hits"] == 8
    assert [rows[f"q{i}"]["cached"] for i in range(8, 12)] == [None] * 4
    # the job-wide flag too: another --stop string touches every row
    report, _ = _run(tmp_path, demo_model_dir, "stop", cache, engine, table=_table(12),
                     sampling=SamplingSpec(max_tokens=5, stop=("zzz",)))  # fmt: skip
    assert report["result_cache_hits"] == 0


def test_sampled_rows_are_cached_only_with_their_own_seed(tmp_path: Path, demo_model_dir: Path, engine: Any) -> None:
    cache = str(tmp_path / "cache")
    table = _table(6).append_column("seed", pa.array([1, 2, 3, None, None, None], pa.int64()))
    sampling = SamplingSpec(max_tokens=5, temperature=0.9)
    first, rows1 = _run(tmp_path, demo_model_dir, "s1", cache, engine, table=table, sampling=sampling)
    assert first["result_cache_entries_written"] == 3
    second, rows2 = _run(tmp_path, demo_model_dir, "s2", cache, engine, table=table, sampling=sampling)
    assert second["result_cache_hits"] == 3
    assert [rows2[f"q{i}"]["completion"] for i in range(3)] == [rows1[f"q{i}"]["completion"] for i in range(3)]


def test_cache_writes_race_safely_when_two_jobs_finish_at_once(tmp_path: Path, demo_model_dir: Path, engine: Any) -> None:
    cache = str(tmp_path / "cache")
    reports: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()

    def job(name: str) -> None:
        from worker.engine import Engine, EngineConfig

        own = Engine.from_pretrained(demo_model_dir, EngineConfig(device="cpu", kv_cache_bytes=32 << 20))
        report, _ = _run(tmp_path, demo_model_dir, name, cache, own, table=_table(20))
        with lock:
            reports[name] = report

    threads = [threading.Thread(target=job, args=(n,)) for n in ("x", "y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(reports) == {"x", "y"}
    opened = ResultCache.open(cache)
    [stats] = cache_stats(opened)
    assert stats.entries == sum(r["result_cache_entries_written"] for r in reports.values())  # nothing lost
    third, rows = _run(tmp_path, demo_model_dir, "z", cache, engine, table=_table(20))
    assert third["result_cache_hits"] == 20 and {r["cached_from_job"] for r in rows.values()} <= {
        reports["x"]["job_id"], reports["y"]["job_id"]}  # fmt: skip

def test_one_shard_written_twice_at_once_is_one_segment(tmp_path: Path) -> None:
    """Two writers of the same shard's entries (a commit whose response was lost, retried): the
    content-addressed names make the second write a no-op."""
    from jobs.result_cache.segments import Entry

    space = ResultCache.open(str(tmp_path / "cache")).space("s" * 32, {"model": "m"})
    rows = [Entry(key=bytes([i]) * 16, source_job="j", source_row=str(i), seconds=0.1,
                  answer={"completion": f"a{i}", "finish_reason": "stop", "prompt_tokens": 3, "cached_tokens": 0,
                          "completion_tokens": 2}) for i in range(5)]  # fmt: skip
    names: list[str | None] = []
    threads = [threading.Thread(target=lambda: names.append(space.write(rows, "j", 0, now=123.0))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert names[0] == names[1] is not None
    assert len(list((tmp_path / "cache").glob("spaces/*/segments/*.parquet"))) == 1
    assert len(list((tmp_path / "cache").glob("spaces/*/index/*.parquet"))) == 1
    found = ResultCache.open(str(tmp_path / "cache")).space("s" * 32).lookup([bytes([3]) * 16, bytes([9]) * 16])
    assert list(found) == [bytes([3]) * 16] and found[bytes([3]) * 16].entry.answer["completion"] == "a3"


def test_a_corrupt_or_truncated_segment_is_skipped_never_served(tmp_path: Path, demo_model_dir: Path, engine: Any) -> None:
    cache = tmp_path / "cache"
    first, rows1 = _run(tmp_path, demo_model_dir, "ok", str(cache), engine, table=_table(20))
    segments = sorted(cache.glob("spaces/*/segments/*.parquet"))
    assert len(segments) == 2
    segments[0].write_bytes(segments[0].read_bytes()[:-100])  # truncated
    data = bytearray(segments[1].read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte flipped: still the same length
    segments[1].write_bytes(bytes(data))
    report, rows = _run(tmp_path, demo_model_dir, "after", str(cache), engine, table=_table(20))
    assert report["result_cache_hits"] == 0  # recomputed, with the same answers
    assert all(rows[i]["completion"] == rows1[i]["completion"] and rows[i]["cached"] is None for i in rows)


def test_the_cache_over_s3(tmp_path: Path, demo_model_dir: Path, engine: Any, s3_env: Any) -> None:
    cache = "s3://freight-test/result-cache"
    first, _ = _run(tmp_path, demo_model_dir, "s3a", cache, engine, table=_table(10))
    second, rows = _run(tmp_path, demo_model_dir, "s3b", cache, engine, table=_table(10))
    assert first["result_cache_entries_written"] == 10 and second["result_cache_hits"] == 10
    opened = ResultCache.open(cache, s3_env)
    [stats] = cache_stats(opened)
    assert stats.entries == 10 and stats.index_objects == 1
    result = prune(opened, max_bytes=0)  # everything goes, over S3's listing and deletes
    assert result.entries_removed == 10 and cache_stats(opened)[0].entries == 0
    assert not [k for k in opened.store.list("spaces/") if "/segments/" in k or "/index/" in k]


def test_prune_removes_old_answers_and_merges_the_index(tmp_path: Path, demo_model_dir: Path, engine: Any) -> None:
    cache = str(tmp_path / "cache")
    _run(tmp_path, demo_model_dir, "p1", cache, engine, table=_table(10))
    _run(tmp_path, demo_model_dir, "p2", cache, engine, table=_table(20))  # 10 hits, 10 new answers
    opened = ResultCache.open(cache)
    [before] = cache_stats(opened)
    assert before.entries == 20 and before.index_objects == 2
    out = CliRunner().invoke(app, ["cache", "prune", cache, "--older-than", "30d"])
    assert out.exit_code == 0, out.output
    [merged] = cache_stats(opened)
    assert merged.entries == 20 and merged.index_objects == 1  # nothing old: merged only
    result = prune(opened, max_bytes=before.bytes - 1)
    assert result.segments_removed >= 1
    [after] = cache_stats(opened)
    assert after.bytes <= before.bytes - 1 and after.index_objects <= 1
    report, _ = _run(tmp_path, demo_model_dir, "p3", cache, engine, table=_table(20))
    assert report["result_cache_hits"] == after.entries
    stats = CliRunner().invoke(app, ["cache", "stats", cache, "--json"])
    assert stats.exit_code == 0 and '"entries"' in stats.output


@pytest.mark.parametrize("case", ["file", "unwritable", "foreign", "threshold", "semantic without embedder",
                                  "embedder without threshold"])
def test_bad_cache_options_are_refused_before_anything_is_written(
    tmp_path: Path, demo_model_dir: Path, case: str, request: pytest.FixtureRequest
) -> None:
    data = write_parquet(_table(4), tmp_path / "in.parquet")
    out = tmp_path / "out"
    args = [str(data), "--model", str(demo_model_dir), "--output", str(out), "--max-tokens", "2"]
    if case == "file":
        (tmp_path / "cachefile").write_text("x")
        args += ["--result-cache", str(tmp_path / "cachefile")]
        said = "is a file"
    elif case == "unwritable" and os.geteuid() == 0:  # root writes any folder: a bucket it may not use
        request.getfixturevalue("s3_env")
        args += ["--result-cache", "s3://no-such-bucket/cache"]
        said = "cannot be read"
    elif case == "unwritable":
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        args += ["--result-cache", str(locked / "cache")]
        said = "cannot be created"
    elif case == "foreign":
        (tmp_path / "home").mkdir()
        (tmp_path / "home" / "notes.txt").write_text("mine")
        args += ["--result-cache", str(tmp_path / "home")]
        said = "holds other files"
    elif case == "threshold":
        args += ["--result-cache", str(tmp_path / "c"), "--semantic-cache", "1.5", "--embed-model", str(demo_model_dir)]
        said = "(0, 1]"
    elif case == "embedder without threshold":  # no default threshold: none measured free of wrong hits
        args += ["--result-cache", str(tmp_path / "c"), "--embed-model", str(demo_model_dir)]
        said = "give --semantic-cache THRESHOLD too"
    else:
        args += ["--result-cache", str(tmp_path / "c"), "--semantic-cache", "0.9"]
        said = "needs --embed-model"
    result = CliRunner().invoke(app, ["run", *args])
    assert result.exit_code == 2 and said in result.output, result.output
    assert not out.exists()  # nothing written


@pytest.mark.parametrize("env, flag", [("off", None), ("", None), ("cache", "OFF")])
def test_off_none_or_empty_turn_the_cache_off_and_make_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_model_dir: Path, env: str | None, flag: str | None
) -> None:
    from jobs.settings import get_settings

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # a relative cache would be made here
    if env is not None:
        monkeypatch.setenv("FREIGHT_RESULT_CACHE", env)
    get_settings.cache_clear()
    data = write_parquet(_table(2), tmp_path / "in.parquet")
    out = tmp_path / "out"
    args = ["run", str(data), "--model", str(demo_model_dir), "--output", str(out), "--id-column", "id",
            "--max-tokens", "1", *(["--result-cache", flag] if flag is not None else [])]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert list(work.iterdir()) == []  # no folder named "off", "None", "cache" or "OFF"
    assert not (out / "cache.json").exists()  # the job runs without a cache
    assert all(r["cached"] is None for r in datasets.read_results(open_store(str(out))).to_pylist())
    if flag is None:
        stats = CliRunner().invoke(app, ["cache", "stats"])  # no cache to show: FREIGHT_RESULT_CACHE is off
        assert stats.exit_code == 2 and "FREIGHT_RESULT_CACHE" in stats.output, stats.output
    assert all(cache_off(v) for v in ("off", "none", "None", "", "  ", " OFF ")) and not cache_off("offline")


def test_estimate_counts_expected_hits(tmp_path: Path, demo_model_dir: Path, engine: Any) -> None:
    cache = str(tmp_path / "cache")
    _run(tmp_path, demo_model_dir, "e1", cache, engine, table=_table(10))
    table = _table(16)
    table = pa.table({"id": table.column("id"), "prompt": [*table.column("prompt").to_pylist()[:14], "def task_0(x):",
                                                           "def task_15(x):"]})  # fmt: skip
    data = write_parquet(table, tmp_path / "est.parquet")
    result = CliRunner().invoke(app, ["estimate", str(data), "--model", str(demo_model_dir), "--id-column", "id",
                                      "--max-tokens", "5", "--result-cache", cache, "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    import json

    est = json.loads(result.output.strip().splitlines()[-1])
    assert est["rows_cached"] == 11 and est["rows_deduplicated"] == 0  # q0..q9 and the repeat of task_0


def test_a_cached_response_repeats_its_own_request(tmp_path: Path, demo_model_dir: Path) -> None:
    """/v1/responses rows that differ only in what their response repeats (metadata) share a cached
    answer; each row keeps its own response_fields."""
    import json

    from jobs.storage import open_store

    def batch(run: str) -> Path:
        path = tmp_path / f"batch-{run}.jsonl"
        body = {"input": "Say hi", "max_output_tokens": 4, "metadata": {"run": run}}
        path.write_text(json.dumps({"custom_id": "r", "method": "POST", "url": "/v1/responses", "body": body}) + "\n")
        return path

    cache = str(tmp_path / "cache")
    rows = {}
    for run in ("1", "2"):
        out = tmp_path / f"out-{run}"
        result = CliRunner().invoke(app, ["run", str(batch(run)), "--model", str(demo_model_dir), "--output", str(out),
                                          "--result-cache", cache])  # fmt: skip
        assert result.exit_code == 0, result.output
        (rows[run],) = datasets.read_results(open_store(str(out))).to_pylist()
    assert rows["1"]["cached"] is None and rows["2"]["cached"] == "exact"
    assert rows["2"]["completion"] == rows["1"]["completion"]
    assert json.loads(rows["2"]["response_fields"])["metadata"] == {"run": "2"}
