"""`freight results --format openai` on real jobs of the tiny demo model: an OpenAI-Batch JSONL job
(chat lines, bad lines) and a Parquet job (text prompts, custom_id from --id-column). Lines parse with
the `openai` package's types; usage over the output file equals the cost report's tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.dataset as ds
from freight_runner import freight_ok
from openai_check import parse_errors, parse_output
from pipeline_data import prompts_table, write_parquet


def _check_usage(out: Path, output: Path, errors: Path) -> None:
    """The output file's usage sums to the cost report's tokens; the error file holds the failed rows."""
    report = json.loads((out / "cost.json").read_text())
    usages = [body.usage for _, body in parse_output(output)]
    assert report["prompt_tokens"] == sum(u.prompt_tokens for u in usages)
    assert report["completion_tokens"] == sum(u.completion_tokens for u in usages)
    assert report["cached_tokens"] == sum(u.prompt_tokens_details.cached_tokens for u in usages)
    assert all(u.total_tokens == u.prompt_tokens + u.completion_tokens for u in usages)
    assert report["rows_failed"] == len(parse_errors(errors))
    assert report["rows"] == len(usages) + report["rows_failed"]


def test_jsonl_chat_job_exports_openai_lines(tmp_path: Path, demo_model_dir: Path) -> None:
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "sort a list"}]
    lines = [
        {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": chat}},
        {"custom_id": "b", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": "reverse a string"}], "max_tokens": 3}},  # fmt: skip
        {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": chat, "max_tokens": -4}},  # fmt: skip
        {"custom_id": "d", "method": "POST", "url": "/v1/chat/completions", "body": {}},
    ]
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out"
    freight_ok(["run", str(path), "--model", str(demo_model_dir), "--output", str(out), "--max-tokens", "6"])
    said = freight_ok(["results", str(out), "--format", "openai", "--to", str(tmp_path / "o.jsonl")])
    assert "2 requests to" in " ".join(said.split()) and "2 failed to" in " ".join(said.split())
    errors = tmp_path / "o.errors.jsonl"
    _check_usage(out, tmp_path / "o.jsonl", errors)
    rows = {r["id"]: r for r in ds.dataset(out / "shards").to_table().to_pylist()}
    parsed = parse_output(tmp_path / "o.jsonl")
    assert [raw["custom_id"] for raw, _ in parsed] == ["a", "b"]
    for raw, body in parsed:
        row = rows[raw["custom_id"]]
        assert body.object == "chat.completion" and body.model == str(demo_model_dir)
        (choice,) = body.choices
        assert choice.message.content == row["completion"] and choice.finish_reason == row["finish_reason"]
        assert choice.logprobs is None
    bad = {line["custom_id"]: line for line in parse_errors(errors)}
    assert sorted(bad) == ["c", "d"] and "max_tokens" in bad["c"]["error"]["message"]


def test_parquet_job_exports_completions_with_ids_from_the_id_column(tmp_path: Path, demo_model_dir: Path) -> None:
    data = write_parquet(prompts_table(8), tmp_path / "in.parquet")  # rows 1, 3, 5 fail
    out = tmp_path / "out"
    freight_ok(["run", str(data), "--model", str(demo_model_dir), "--output", str(out), "--id-column", "id",
                "--max-tokens", "4", "--shard-rows", "3"])  # fmt: skip
    freight_ok(["results", str(out), "--format", "openai", "--to", str(tmp_path / "o.jsonl"),
                "--errors", str(tmp_path / "e.jsonl")])  # fmt: skip
    _check_usage(out, tmp_path / "o.jsonl", tmp_path / "e.jsonl")
    parsed = parse_output(tmp_path / "o.jsonl")
    assert [raw["custom_id"] for raw, _ in parsed] == [f"row-{i:04d}" for i in (0, 2, 4, 6, 7)]
    assert all(body.object == "text_completion" and len(body.choices) == 1 for _, body in parsed)
    assert sorted(line["custom_id"] for line in parse_errors(tmp_path / "e.jsonl")) == ["row-0001", "row-0003", "row-0005"]
