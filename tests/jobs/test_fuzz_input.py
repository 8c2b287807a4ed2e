"""Property: whatever lines, cells and constraints a careless or hostile user sends, the job completes,
every good row's result is exactly the one it gets in a clean job, every other row either runs or
carries a one-line error, and nothing raises (no traceback).

Hypothesis generates OpenAI-Batch files (valid request lines from a fixed pool mixed with hostile
ones: random JSON, wrong types, NaN and 10^30 values, surrogate escapes, nesting 100k deep, random
regexes, schemas and choice lists) and Parquet inputs (pool prompts beside hostile prompt cells and
per-row sampling and constraint columns). Each example plans a real job and runs it on one engine
loaded once. Examples are bounded (derandomized, so CI sees the same ones) and so is each row's work
(the pool asks 3 tokens; hostile rows that are valid ask at most 16, n at most 2)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.errors import FreightError
from jobs.planner import prepare_job
from jobs.spec import JobSpec

POOL = ["def add(a, b):", "import os\n", "class Stack:", "# sort a list", "for i in range(10):", "x = [1, 2"]
URLS = ["/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/responses", "", None, 7]
FUZZ = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])  # fmt: skip
_serial = itertools.count()


def _good(custom_id: str, prompt: str) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
                       "body": {"prompt": prompt, "max_tokens": 3, "temperature": 0}})  # fmt: skip


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)
numbers = st.one_of(st.integers(-3, 16), st.floats(), st.just(10**30), st.just(-(10**30)), st.text(max_size=4))
regexes = st.one_of(st.text(alphabet="ab()[]{}*+?|\\.^$,0-9dw-", max_size=16), st.just("a{1000000}"),
                    st.just("(a|b)*c"), st.just("(?=x)"))  # fmt: skip
schemas = st.one_of(
    json_values,
    st.fixed_dictionaries({"type": st.sampled_from(["object", "string", "integer", "array", "bogus"])},
                          optional={"properties": st.dictionaries(st.text(max_size=5), json_values, max_size=3),
                                    "required": json_values, "enum": json_values}),  # fmt: skip
    st.integers(60, 400).map(lambda d: json.loads('{"type":"object","properties":{"a":' * d + "{}" + "}}" * d)),
)
constraint_fields = st.one_of(
    st.fixed_dictionaries({"guided_regex": regexes}),
    st.fixed_dictionaries({"guided_choice": st.one_of(st.lists(st.text(max_size=5), max_size=4), json_values,
                                                      st.just([f"c{i}" for i in range(20_000)]))}),  # fmt: skip
    st.fixed_dictionaries({"guided_json": schemas}),
    st.fixed_dictionaries({"response_format": st.one_of(json_values, st.fixed_dictionaries(
        {"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries({"name": st.text(max_size=4),
                                                                                "schema": schemas})}))}),
    st.just({}),
)  # fmt: skip
bodies = st.builds(
    lambda prompt, extra, constraint: {**prompt, **extra, **constraint},
    st.one_of(st.fixed_dictionaries({"prompt": st.one_of(st.text(max_size=40), json_values)}),
              st.fixed_dictionaries({"messages": json_values}),
              st.fixed_dictionaries({"input": json_values})),  # fmt: skip
    st.fixed_dictionaries({}, optional={
        "max_tokens": numbers, "temperature": numbers, "top_p": numbers, "n": st.one_of(st.integers(-2, 2), st.just(10**6)),
        "seed": numbers, "stop": json_values, "logprobs": json_values, "top_logprobs": numbers,
        "logit_bias": st.one_of(json_values, st.dictionaries(st.one_of(st.text(max_size=6), st.just("9" * 5000)),
                                                             numbers, max_size=3)),
        "model": st.text(max_size=8), "stream": json_values, "unknown_field": json_values,
    }),
    constraint_fields,
)  # fmt: skip


@st.composite
def hostile_lines(draw: st.DrawFn, i: int) -> str:
    """One hostile line; its custom_id (when it has a usable one) is unique to it."""
    kind = draw(st.sampled_from(["request", "request", "request", "raw", "deep", "surrogate", "value"]))
    if kind == "raw":
        return draw(st.text(max_size=60)).replace("\n", " ")
    if kind == "deep":
        depth = draw(st.sampled_from([200, 5_000, 100_000]))
        return f'{{"custom_id": "deep-{i}", "body": {{"prompt": {"[" * depth}{"]" * depth}}}}}'
    if kind == "surrogate":
        return f'{{"custom_id": "s-{i}\\ud800", "url": "/v1/completions", "body": {{"prompt": "x\\udc00"}}}}'
    if kind == "value":
        return json.dumps(draw(json_values))
    line: dict[str, Any] = {"custom_id": draw(st.sampled_from([f"h-{i}", i, None, ""])), "body": draw(bodies)}
    if draw(st.booleans()):
        line["url"] = draw(st.sampled_from(URLS))
    if draw(st.integers(0, 5)) == 0:
        line["method"] = draw(st.sampled_from(["GET", "POST", 1]))
    if isinstance(line["body"].get("max_tokens"), int) and line["body"]["max_tokens"] > 16:
        line["body"]["max_tokens"] = 16
    return json.dumps(line)


@st.composite
def batch_files(draw: st.DrawFn) -> tuple[list[str], dict[str, str]]:
    """(lines, the good lines' custom_id -> prompt)."""
    n = draw(st.integers(2, 8))
    lines: list[str] = []
    good: dict[str, str] = {}
    for i in range(n):
        if i == 0 or draw(st.integers(0, 2)) == 0:
            prompt = draw(st.sampled_from(POOL))
            good[f"good-{i}"] = prompt
            lines.append(_good(f"good-{i}", prompt))
        else:
            lines.append(draw(hostile_lines(i)))
    return lines, good


def _one_line(error: str | None) -> bool:
    return error is None or (error.strip() != "" and "\n" not in error and "Traceback" not in error)


@pytest.fixture(scope="module")
def engine(demo_model_dir: Path) -> Any:
    from worker.local import load_model_engine

    return load_model_engine(str(demo_model_dir), None)[0]


def _run(spec: JobSpec, engine: Any) -> dict[str, dict[str, Any]]:
    from worker.local import run_local

    prepared = prepare_job(spec)
    run = run_local(prepared.store, prepared.manifest, engine=engine)
    assert run.report is not None and run.report["rows"] == prepared.manifest.input.rows  # the job completed
    return {str(r["id"]): r for r in pq.read_table(Path(spec.output) / "shards").to_pylist()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path, engine: Any) -> dict[str, dict]:
    """Each pool prompt's result in clean jobs: {"jsonl": {prompt: completion}, "parquet": {...}}."""
    folder = tmp_path_factory.mktemp("reference")
    data = folder / "in.jsonl"
    data.write_text("".join(_good(f"r{i}", p) + "\n" for i, p in enumerate(POOL)))
    rows = _run(JobSpec(input=str(data), model=str(demo_model_dir), output=str(folder / "out-jsonl")), engine)
    jsonl = {POOL[int(k[1:])]: r["completion"] for k, r in rows.items()}
    pq.write_table(pa.table({"prompt": POOL}), folder / "in.parquet")
    spec = JobSpec(input=str(folder / "in.parquet"), model=str(demo_model_dir), output=str(folder / "out-pq"),
                   sampling={"max_tokens": 3, "temperature": 0.0})  # fmt: skip
    parquet = {POOL[int(k)]: r["completion"] for k, r in _run(spec, engine).items()}
    assert all(v is not None for v in [*jsonl.values(), *parquet.values()])
    return {"jsonl": jsonl, "parquet": parquet}


@pytest.mark.timeout(600)
@FUZZ
@given(batch=batch_files())
def test_hostile_batch_files_cost_only_their_own_rows(
    batch: tuple[list[str], dict[str, str]], tmp_path: Path, demo_model_dir: Path, engine: Any, reference: dict
) -> None:
    lines, good = batch
    folder = tmp_path / f"ex{next(_serial)}"
    folder.mkdir()
    data = folder / "in.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    rows = _run(JobSpec(input=str(data), model=str(demo_model_dir), output=str(folder / "out")), engine)
    assert len(rows) == sum(1 for line in lines if line.encode().strip())  # blank lines are not rows
    for custom_id, prompt in good.items():
        assert rows[custom_id]["error"] is None
        assert rows[custom_id]["completion"] == reference["jsonl"][prompt], (custom_id, lines)
    for row in rows.values():
        assert _one_line(row["error"]), row["error"]
        assert (row["error"] is None) != (row["finish_reason"] == "error")


cells = st.one_of(st.sampled_from(POOL), st.text(max_size=30), st.none(), st.just(""), st.just("a " * 300_000))


@st.composite
def parquet_inputs(draw: st.DrawFn) -> tuple[pa.Table, dict[str, str]]:
    """(a table of prompts and per-row columns, the good rows' id -> prompt): a good row has a pool
    prompt and null in every other column."""
    n = draw(st.integers(2, 8))
    columns: dict[str, list[Any]] = {"id": [f"r{i}" for i in range(n)], "prompt": []}
    extra = draw(st.lists(st.sampled_from(["temperature", "max_tokens", "seed", "json_schema", "regex", "choice"]),
                          unique=True, max_size=3))  # fmt: skip
    for name in extra:
        columns[name] = []
    good: dict[str, str] = {}
    for i in range(n):
        clean = i == 0 or draw(st.booleans())
        prompt = draw(st.sampled_from(POOL)) if clean else draw(cells)
        columns["prompt"].append(prompt)
        if clean:
            good[f"r{i}"] = prompt
        for name in extra:
            columns[name].append(None if clean else draw(_cell_of(name)))
    types = {"temperature": pa.float64(), "max_tokens": pa.int64(), "seed": pa.int64(), "json_schema": pa.string(),
             "regex": pa.string(), "choice": pa.list_(pa.string()), "id": pa.string(), "prompt": pa.string()}  # fmt: skip
    return pa.table({k: pa.array(v, types[k]) for k, v in columns.items()}), good


def _cell_of(name: str) -> st.SearchStrategy[Any]:
    return {
        "temperature": st.one_of(st.none(), st.floats()),
        "max_tokens": st.one_of(st.none(), st.integers(-(2**63), 16), st.just(2**63 - 1)),
        "seed": st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
        "json_schema": st.one_of(st.none(), schemas.map(json.dumps), st.text(max_size=10)),
        "regex": st.one_of(st.none(), regexes),
        "choice": st.one_of(st.none(), st.lists(st.text(max_size=4), max_size=3)),
    }[name]


@pytest.mark.timeout(600)
@FUZZ
@given(case=parquet_inputs())
def test_hostile_parquet_cells_cost_only_their_own_rows(
    case: tuple[pa.Table, dict[str, str]], tmp_path: Path, demo_model_dir: Path, engine: Any, reference: dict
) -> None:
    table, good = case
    folder = tmp_path / f"ex{next(_serial)}"
    folder.mkdir()
    pq.write_table(table, folder / "in.parquet")
    constrained = any(c in table.column_names for c in ("json_schema", "regex", "choice"))
    spec = JobSpec(input=str(folder / "in.parquet"), model=str(demo_model_dir), output=str(folder / "out"),
                   id_column="id", row_constraints=constrained, sampling={"max_tokens": 3, "temperature": 0.0})  # fmt: skip
    try:
        rows = _run(spec, engine)
    except FreightError as exc:  # a whole-input problem is refused at planning, in one line, nothing written
        assert _one_line(str(exc)) and not (folder / "out" / "manifest.json").exists()
        return
    assert len(rows) == table.num_rows
    for row_id, prompt in good.items():
        assert rows[row_id]["error"] is None
        assert rows[row_id]["completion"] == reference["parquet"][prompt], (row_id, table.to_pylist())
    for row in rows.values():
        assert _one_line(row["error"]), row["error"]
