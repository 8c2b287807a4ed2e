"""run_shard: interruption saves partial rows, resume computes only the rest (same output), a lost
commit race is discarded and priced as waste, a committed shard is never recomputed, likelihood mode."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pipeline_data import SYSTEM, prompts_table, write_parquet

from jobs import datasets
from jobs.errors import JobIncompleteError
from jobs.finalize import finalize
from jobs.manifest import Manifest, partial_key, shard_record_key, shard_result_key
from jobs.planner import prepare_job
from jobs.spec import JobSpec, SamplingSpec
from worker.engine import SamplingParams
from worker.shard import run_shard


@pytest.fixture(scope="module")
def engine(demo_model_dir: Path) -> Any:
    from worker.engine import Engine, EngineConfig

    return Engine.from_pretrained(demo_model_dir, EngineConfig(device="cpu", kv_cache_bytes=64 << 20))


def _job(tmp_path: Path, model: Path, name: str, table: pa.Table, **kw: Any) -> tuple[Any, Manifest]:
    data = tmp_path / "in.parquet"
    if not data.exists():
        write_parquet(table, data)
    kw.setdefault("sampling", SamplingSpec(max_tokens=6, temperature=1.0, seed=11))
    spec = JobSpec(input=str(data), model=str(model), output=str(tmp_path / name), id_column="id", **kw)
    prepared = prepare_job(spec)
    return prepared.store, prepared.manifest


def _rows(store: Any, index: int) -> list[dict]:
    return datasets.read_result(store.get(shard_result_key(index))).to_pylist()


def test_interrupted_shard_resumes_with_partial_rows_and_equal_output(
    tmp_path: Path, demo_model_dir: Path, engine: Any
) -> None:
    table = prompts_table(12, bad=False)
    table = table.append_column(
        "max_tokens", pa.array(range(1, 13), pa.int64())
    )  # rows finish at different steps
    ref_store, ref = _job(tmp_path, demo_model_dir, "ref", table, shard_rows=12)
    assert run_shard(engine, ref_store, ref, 0).status == "committed"

    store, manifest = _job(
        tmp_path, demo_model_dir, "out", table, shard_rows=12, instance_type="g5.xlarge", market="spot"
    )
    finished = itertools.count(1)
    stop_after = 5
    state = {"n": 0}

    def on_row(_: Any) -> None:
        state["n"] = next(finished)

    first = run_shard(
        engine, store, manifest, 0, attempt=0, should_stop=lambda: state["n"] >= stop_after, on_row=on_row
    )
    assert first.status == "interrupted" and first.attempt_record is not None
    assert not store.exists(shard_result_key(0))
    saved = datasets.read_result(store.get(partial_key(0, 0)))
    assert stop_after <= saved.num_rows < 12 and "_row" in saved.column_names
    waste = [k for k in store.list("waste/")]
    assert len(waste) == 1 and json.loads(store.get(waste[0]))["reason"] == "interrupted"

    state["n"] = 0
    counted = []
    second = run_shard(engine, store, manifest, 0, attempt=1, on_row=lambda p: counted.append(p))
    assert second.status == "committed" and second.record is not None
    assert second.record.rows_from_partial == saved.num_rows
    assert len(counted) == 12 - saved.num_rows  # only the rest was computed
    assert store.list("partial/") == []
    # seeds are per row: the resumed shard equals an uninterrupted run
    strip = ("id", "completion", "finish_reason", "completion_tokens")
    assert [{k: r[k] for k in strip} for r in _rows(store, 0)] == [
        {k: r[k] for k in strip} for r in _rows(ref_store, 0)
    ]

    report = finalize(store, manifest)
    assert finalize(store, manifest) == report  # idempotent: the second call returns the same report
    attempt = first.attempt_record
    assert report["cost_usd"] == pytest.approx(second.record.cost_usd + attempt.cost_usd)
    assert report["wasted_cost_usd"] == pytest.approx(attempt.wasted_usd)
    assert 0 < attempt.wasted_usd < attempt.cost_usd  # the saved rows' share is not waste
    assert report["market"] == "spot" and report["on_demand_cost_usd"] > report["cost_usd"]


def test_a_lost_commit_race_is_discarded_and_counted_as_waste(
    tmp_path: Path, demo_model_dir: Path, engine: Any
) -> None:
    store, manifest = _job(tmp_path, demo_model_dir, "out", prompts_table(6, bad=False), shard_rows=6)
    rival = datasets.write_result(pa.table({"id": ["rival"]}))

    def rival_commits_first(_: Any) -> None:  # another worker commits while this one is still computing
        store.put_if_absent(shard_result_key(0), rival)

    outcome = run_shard(engine, store, manifest, 0, on_row=rival_commits_first)
    assert outcome.status == "lost_race" and outcome.record is None
    assert store.get(shard_result_key(0)) == rival and not store.exists(shard_record_key(0))
    (key,) = store.list("waste/")
    record = json.loads(store.get(key))
    assert record["reason"] == "lost_race" and record["cost_usd"] > 0
    assert record["wasted_usd"] == pytest.approx(record["cost_usd"])


def test_a_committed_shard_is_never_recomputed(tmp_path: Path, demo_model_dir: Path, engine: Any) -> None:
    store, manifest = _job(tmp_path, demo_model_dir, "out", prompts_table(6, bad=False), shard_rows=3)
    assert run_shard(engine, store, manifest, 1).status == "committed"
    before = (store.get(shard_result_key(1)), store.get(shard_record_key(1)))
    steps = engine.stats.steps
    again = run_shard(engine, store, manifest, 1, attempt=1)
    assert again.status == "already_committed" and engine.stats.steps == steps
    assert (store.get(shard_result_key(1)), store.get(shard_record_key(1))) == before
    assert store.put_if_absent(shard_result_key(1), b"second commit") is False
    with pytest.raises(JobIncompleteError, match=r"1 of 2 shards not committed yet \(0\)"):
        finalize(store, manifest)  # shard 0 never ran
    assert not store.exists("cost.json") and not store.exists("_SUCCESS")


def test_row_outputs_do_not_depend_on_sharding(tmp_path: Path, demo_model_dir: Path, engine: Any) -> None:
    table = prompts_table(10, bad=False)
    outs = []
    for name, rows in (("a", 3), ("b", 10)):
        store, manifest = _job(tmp_path, demo_model_dir, name, table, shard_rows=rows)
        for s in manifest.shards:
            run_shard(engine, store, manifest, s.index)
        finalize(store, manifest)
        got = datasets.read_results(store).to_pylist()
        outs.append(sorted((r["id"], r["completion"]) for r in got))
    assert outs[0] == outs[1]


def test_likelihood_scoring_adds_continuation_columns(
    tmp_path: Path, demo_model_dir: Path, engine: Any
) -> None:
    table = pa.table(
        {
            "id": ["a", "b", "c"],
            "prompt": [SYSTEM + "Q: 2+2?", SYSTEM + "Q: 2+3?", "Q"],
            "answer": [" four", " five", None],
        }
    )
    store, manifest = _job(tmp_path, demo_model_dir, "out", table, continuation_column="answer")
    run_shard(engine, store, manifest, 0)
    result = datasets.read_result(store.get(shard_result_key(0)))
    assert result.schema.field("continuation_logprob").type == pa.float64()
    assert result.schema.field("continuation_tokens").type == pa.int32()
    rows = result.to_pylist()
    tok = engine.tokenizer
    for row, context, cont in zip(
        rows[:2], table.column("prompt").to_pylist(), [" four", " five"], strict=False
    ):
        ids = tok.encode(context) + tok.encode(cont)
        (direct,) = engine.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=True))
        n = len(tok.encode(cont))
        assert row["continuation_tokens"] == n and row["completion_tokens"] == 1
        assert row["continuation_logprob"] < 0
        assert row["continuation_logprob"] == pytest.approx(sum(direct.prompt_logprobs[-n:]), abs=1e-4)
    assert rows[2]["finish_reason"] == "error" and rows[2]["continuation_logprob"] is None


def test_messages_column_is_rendered_with_the_chat_template(
    tmp_path: Path, demo_model_dir: Path, engine: Any
) -> None:
    messages = [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Sort a list."}],
        [],
        [{"role": "user", "content": "Reverse a string."}],
    ]
    table = pa.table({"id": ["a", "b", "c"], "messages": messages})  # list<struct<role, content>>
    store, manifest = _job(tmp_path, demo_model_dir, "out", table)  # default prompt column absent -> messages
    assert manifest.input.prompt_column == "messages" and manifest.input.prompt_kind == "messages"
    run_shard(engine, store, manifest, 0)
    rows = _rows(store, 0)
    rendered = engine.tokenizer.apply_chat_template(messages[0], add_generation_prompt=True)
    assert rows[0]["prompt_tokens"] == len(engine.tokenizer.encode(rendered)) and rows[0]["error"] is None
    assert rows[1]["finish_reason"] == "error" and "messages" in rows[1]["error"]
    assert rows[2]["error"] is None


def test_a_crash_between_commit_and_record_loses_no_cost(
    tmp_path: Path, demo_model_dir: Path, engine: Any
) -> None:
    store, manifest = _job(tmp_path, demo_model_dir, "out", prompts_table(4, bad=False), shard_rows=2)
    records = [run_shard(engine, store, manifest, s.index).record for s in manifest.shards]
    store.delete(shard_record_key(1))  # as if the worker died right after its conditional put
    report = finalize(store, manifest)
    assert [r.model_dump(mode="json") for r in records] == report["shards"]  # read back from Parquet metadata
    assert report["cost_usd"] == pytest.approx(sum(r.cost_usd for r in records))
