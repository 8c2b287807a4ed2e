"""Duplicate rows of a job are computed once: every id keeps its own row with the answer its
request gets alone, only deterministic rows (greedy, or seeded by the row) collapse, and the cost
report counts the copies and the tokens they saved; an interrupted shard's copies resume as copies."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pipeline_data import write_parquet

from contracts.sampling import SamplingParams
from jobs import datasets
from jobs.planner import prepare_job
from jobs.spec import JobSpec, SamplingSpec
from worker.local import run_local
from worker.row_dedup import find_duplicates
from worker.row_key import deterministic, row_digest
from worker.row_requests import RowRequest
from worker.shard import run_shard


class CountingEngine:
    """The engine, counting the prompts it is asked to run."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.prompts = engine, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def stream(self, prompts: list[Any], *args: Any, **kw: Any) -> Any:
        self.prompts += len(prompts)
        return self.engine.stream(prompts, *args, **kw)


@pytest.fixture(scope="module")
def engine(demo_model_dir: Path) -> Any:
    from worker.engine import Engine, EngineConfig

    return Engine.from_pretrained(demo_model_dir, EngineConfig(device="cpu", kv_cache_bytes=64 << 20))


def _prompts() -> list[str]:
    """20 rows, 6 of them repeats of earlier ones (short and long prompts), spread over the input."""
    base = [f"def f{i}(x):" for i in range(10)] + [f"{'A long shared system text. ' * 3}Question {i}?" for i in range(4)]
    return base + [base[0], base[3], base[3], base[11], base[13], base[0]]


def _job(tmp_path: Path, model: Path, name: str, table: pa.Table, **kw: Any) -> Any:
    data = write_parquet(table, tmp_path / f"{name}.parquet")
    kw.setdefault("sampling", SamplingSpec(max_tokens=5))
    spec = JobSpec(input=str(data), model=str(model), output=str(tmp_path / name), id_column="id", **kw)
    return prepare_job(spec)


def test_duplicates_are_computed_once_and_every_id_is_present(tmp_path: Path, demo_model_dir: Path, engine: Any) -> None:
    prompts = _prompts()
    table = pa.table({"id": [f"r{i}" for i in range(len(prompts))], "prompt": prompts})
    prepared = _job(tmp_path, demo_model_dir, "out", table, shard_rows=8)
    counting = CountingEngine(engine)
    run = run_local(prepared.store, prepared.manifest, engine=counting)
    assert counting.prompts == len(set(prompts)) == 14  # the planner kept equal prompts in one shard
    rows = {r["id"]: r for r in datasets.read_results(prepared.store).to_pylist()}
    assert sorted(rows) == sorted(table.column("id").to_pylist())  # every id, once
    alone = engine.generate(prompts, SamplingParams(max_tokens=5))
    for i, out in enumerate(alone):  # each row's answer is the one its request gets alone
        assert rows[f"r{i}"]["completion"] == out.text
        assert rows[f"r{i}"]["completion_tokens"] == len(out.token_ids)
    report = run.report
    assert report is not None and report["rows"] == 20 and report["deduplicated_rows"] == 6
    copies = [rows[f"r{i}"] for i in range(14, 20)]
    assert report["deduplicated_prompt_tokens"] == sum(r["prompt_tokens"] for r in copies)
    assert report["deduplicated_completion_tokens"] == sum(r["completion_tokens"] for r in copies)
    assert report["deduplicated_tokens"] == report["deduplicated_prompt_tokens"] + report["deduplicated_completion_tokens"]
    assert report["completion_tokens"] == sum(r["completion_tokens"] for r in rows.values()) - report[
        "deduplicated_completion_tokens"
    ]  # computed tokens count each answer once
    assert report["deduplicated_seconds"] > 0 and report["deduplicated_usd_saved"] >= 0


def test_only_deterministic_rows_collapse(tmp_path: Path, demo_model_dir: Path, engine: Any) -> None:
    """Sampled rows collapse only with a seed of their own: a job-derived seed differs per row id."""
    prompts = ["def g(x):"] * 4 + ["def h(y):"] * 2
    table = pa.table(
        {
            "id": [f"s{i}" for i in range(6)],
            "prompt": prompts,
            "seed": pa.array([7, 7, 8, None, None, None], pa.int64()),
        }
    )
    prepared = _job(tmp_path, demo_model_dir, "sampled", table,
                    sampling=SamplingSpec(max_tokens=5, temperature=1.0, seed=3))  # fmt: skip
    counting = CountingEngine(engine)
    run = run_local(prepared.store, prepared.manifest, engine=counting)
    assert counting.prompts == 5 and run.report is not None and run.report["deduplicated_rows"] == 1
    rows = {r["id"]: r for r in datasets.read_results(prepared.store).to_pylist()}
    assert rows["s0"]["completion"] == rows["s1"]["completion"]


def test_row_digest_covers_every_answer_field() -> None:
    base = RowRequest(row=0, id="a", prompt="p", sampling=SamplingParams(max_tokens=4))
    same = RowRequest(row=9, id="b", prompt="p", sampling=SamplingParams(max_tokens=4))
    assert row_digest(base) == row_digest(same)  # the row's number and id are not its answer
    changed = [
        RowRequest(row=0, id="a", prompt="q", sampling=SamplingParams(max_tokens=4)),
        RowRequest(row=0, id="a", prompt="p", sampling=SamplingParams(max_tokens=5)),
        RowRequest(row=0, id="a", prompt="p", sampling=SamplingParams(max_tokens=4, stop=("x",))),
        RowRequest(row=0, id="a", prompt="p", sampling=SamplingParams(max_tokens=4, logprobs=2)),
        RowRequest(row=0, id="a", prompt="p", sampling=SamplingParams(max_tokens=4), echo_text="p"),
        RowRequest(row=0, id="a", prompt=[1, 2], sampling=SamplingParams(max_tokens=4)),
    ]
    assert len({row_digest(r) for r in changed} | {row_digest(base)}) == len(changed) + 1
    assert row_digest(base, context="model-a") != row_digest(base, context="model-b")
    sampled = SamplingParams(max_tokens=4, temperature=0.8, seed=5)
    assert not deterministic(RowRequest(row=0, id="a", prompt="p", sampling=sampled))
    assert deterministic(RowRequest(row=0, id="a", prompt="p", sampling=sampled, seeded=True))
    assert not deterministic(RowRequest(row=0, id="a", prompt=None, sampling=None, error="bad"))
    dups = find_duplicates([base, same])
    assert [r.row for r in dups.unique] == [0] and [r.row for r in dups.copies[0]] == [9]


def test_responses_differing_only_in_what_they_repeat_collapse_and_keep_their_own() -> None:
    """Two /v1/responses rows whose requests differ only in metadata (repeated in the response, not
    its answer) run once; the copy's result carries its own response_fields."""
    from worker.row_dedup import copy_result
    from worker.shard_rows import RowResult

    params = SamplingParams(max_tokens=4)
    a = RowRequest(row=0, id="a", prompt="p", sampling=params, endpoint="responses", response_fields='{"metadata":{"n":"1"}}')
    b = RowRequest(row=1, id="b", prompt="p", sampling=params, endpoint="responses", response_fields='{"metadata":{"n":"2"}}')
    dups = find_duplicates([a, b])
    assert [r.row for r in dups.unique] == [0] and [r.row for r in dups.copies[0]] == [1]
    ran = RowResult(row=0, id="a", completion="x", finish_reason="stop", prompt_tokens=3, cached_tokens=0,
                    completion_tokens=1, error=None, endpoint="/v1/responses", response_fields=a.response_fields)  # fmt: skip
    copied = copy_result(ran, b)
    assert (copied.id, copied.completion, copied.response_fields, copied.duplicate) == ("b", "x", b.response_fields, True)


def test_interrupted_shard_resumes_its_copies_as_copies(tmp_path: Path, demo_model_dir: Path, engine: Any) -> None:
    prompts = ["def a(x):", "def b(x):", "def a(x):", "def c(x):", "def b(x):", "def a(x):"]
    table = pa.table({"id": [f"i{i}" for i in range(6)], "prompt": prompts, "max_tokens": pa.array([1, 8, 1, 8, 8, 1])})
    prepared = _job(tmp_path, demo_model_dir, "stopped", table, shard_rows=6)
    finished = itertools.count(1)
    outcome = run_shard(engine, prepared.store, prepared.manifest, 0, should_stop=lambda: next(finished) > 2)
    assert outcome.status == "interrupted" and outcome.rows >= 3  # "def a" and its two copies
    outcome = run_shard(engine, prepared.store, prepared.manifest, 0, attempt=1)
    assert outcome.status == "committed" and outcome.record is not None
    assert outcome.record.deduplicated_rows == 3 and outcome.record.rows_from_partial >= 3
    rows = datasets.read_results(prepared.store).to_pylist()
    assert [r["id"] for r in rows] == [f"i{i}" for i in range(6)]
    assert rows[0]["completion"] == rows[2]["completion"] == rows[5]["completion"]
