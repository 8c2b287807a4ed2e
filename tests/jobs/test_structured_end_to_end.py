"""Structured output end to end on the tiny demo model (random weights: its unconstrained text is
noise): a Parquet job mixing constraint columns, plain rows and bad constraints in one shard, and an
OpenAI-Batch file with response_format / guided_* lines and a job-wide --choice, exported with
`freight results --format openai`. Every row that finishes "stop" under a JSON schema carries a
`parsed` value that validates (`jsonschema` is the judge), a regex row matches, a choice row is one
of its choices; the cost report counts the constrained rows and the mask time.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pyarrow as pa
import pyarrow.dataset as ds
from freight_runner import freight_ok
from openai_check import parse_output
from pipeline_data import write_parquet

from jobs import datasets

NAMED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "tags", "ok"],
    "additionalProperties": False,
}
NESTED = {
    "$defs": {
        "point": {
            "type": "object",
            "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["x"],
            "additionalProperties": False,
        }
    },
    "type": "object",
    "properties": {"at": {"$ref": "#/$defs/point"}, "kind": {"enum": ["dot", "line"]}},
    "required": ["at", "kind"],
    "additionalProperties": False,
}
REGEX = "[a-z]{2,6}-[0-9]{1,3}"
CHOICES = ["red", "green", "blue"]


def _rows(out: Path) -> dict[str, dict[str, Any]]:
    table = ds.dataset(out / "shards").to_table()
    assert table.schema == datasets.result_schema(likelihood=False)
    return {r["id"]: r for r in table.to_pylist()}


def _check_constrained(row: dict[str, Any], kind: str, spec: Any) -> None:
    """One constrained row: its text obeys the constraint; `parsed` is its JSON where it finished."""
    assert row["error"] is None, row
    texts = row["completions"] or [row["completion"]]
    reasons = row["finish_reasons"] or [row["finish_reason"]]
    parsed = row["parsed_choices"] or [row["parsed"]]
    for k, (text, reason) in enumerate(zip(texts, reasons, strict=True)):
        if kind in ("json_schema", "json_object"):
            if reason != "stop":
                assert parsed[k] is None
                continue
            value = json.loads(parsed[k])
            assert value == json.loads(text) and json.dumps(value, separators=(",", ":"), ensure_ascii=False) == parsed[k]
            jsonschema.validate(value, spec if kind == "json_schema" else {"type": "object"})
        else:
            assert row["parsed"] is None
            if reason == "stop":
                assert re.fullmatch(spec, text) if kind == "regex" else text in spec, (text, spec)


def test_a_parquet_job_mixes_constraints_plain_rows_and_bad_ones(tmp_path: Path, demo_model_dir: Path) -> None:
    cases: list[tuple[str, dict[str, Any]]] = [
        ("plain-0", {}),
        ("named", {"json_schema": json.dumps(NAMED)}),
        ("nested", {"response_format": json.dumps({"type": "json_schema", "json_schema": {"name": "at", "schema": NESTED}})}),
        ("object", {"response_format": '{"type": "json_object"}'}),
        ("regex", {"regex": REGEX}),
        ("choice", {"choice": CHOICES}),
        ("plain-1", {}),
        ("named-2", {"json_schema": json.dumps(NAMED)}),  # the same schema: one compiled grammar
        ("bad-json", {"json_schema": "{oops"}),
        ("bad-choice", {"choice": []}),
        ("two", {"regex": "a", "choice": ["a"]}),
    ]  # fmt: skip
    columns: dict[str, list[Any]] = {"id": [c for c, _ in cases], "prompt": [f"Describe item {c}:" for c, _ in cases]}
    for name in ("json_schema", "response_format", "regex"):
        columns[name] = [v.get(name) for _, v in cases]
    table = pa.table({**columns, "choice": pa.array([v.get("choice") for _, v in cases], pa.list_(pa.string()))})
    data = write_parquet(table, tmp_path / "in.parquet")
    out = tmp_path / "out"
    freight_ok(["run", str(data), "--model", str(demo_model_dir), "--output", str(out), "--id-column", "id",
                "--max-tokens", "64", "--temperature", "0.8", "--shard-rows", "64", "--row-constraints"])  # fmt: skip
    rows = _rows(out)
    assert len(json.loads((out / "manifest.json").read_text())["shards"]) == 1  # all in one shard
    for cid in ("plain-0", "plain-1"):
        assert rows[cid]["error"] is None and rows[cid]["parsed"] is None and rows[cid]["completion_tokens"] > 0
    assert rows["bad-json"]["error"].startswith("json_schema: is not valid JSON")
    assert rows["bad-choice"]["error"] == "choice: the list of choices is empty; give at least one string"
    assert rows["two"]["error"] == "regex and choice both constrain the output: a request takes one"
    expected = {"named": ("json_schema", NAMED), "named-2": ("json_schema", NAMED), "nested": ("json_schema", NESTED),
                "object": ("json_object", None), "regex": ("regex", REGEX), "choice": ("choice", CHOICES)}  # fmt: skip
    for cid, (kind, want) in expected.items():
        _check_constrained(rows[cid], kind, want)
    report = json.loads((out / "cost.json").read_text())
    assert report["constrained_rows"] == 6 == json.loads((out / "costs" / "00000.json").read_text())["constrained_rows"]
    assert report["mask_seconds"] > 0.0
    assert any(rows[c]["finish_reason"] == "stop" and rows[c]["parsed"] for c in ("named", "named-2", "nested"))


def test_a_batch_file_with_response_format_and_a_job_choice(tmp_path: Path, demo_model_dir: Path) -> None:
    messages = [{"role": "user", "content": "Give me an item as JSON."}]
    rf = {"type": "json_schema", "json_schema": {"name": "item", "strict": True, "schema": NAMED}}
    bodies = {
        "chat-schema": {"messages": messages, "response_format": rf},
        "chat-schema-n": {"messages": messages, "response_format": rf, "n": 2, "temperature": 1.0, "seed": 4},
        "comp-schema": {"prompt": "item = ", "response_format": {"type": "json_schema", "json_schema": {"name": "at", "schema": NESTED}}},
        "guided-json": {"messages": messages, "guided_json": json.dumps(NESTED)},
        "guided-regex": {"prompt": "code: ", "guided_regex": REGEX},
        "structured-choice": {"messages": messages, "structured_outputs": {"choice": CHOICES}},
        "job-choice": {"messages": messages},  # no constraint of its own: the job's --choice
        "text": {"messages": messages, "response_format": {"type": "text"}},  # plain text: not the job's
        "bad-name": {"messages": messages, "response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": NAMED}}},
    }  # fmt: skip
    lines = [
        json.dumps({"custom_id": cid, "method": "POST",
                    "url": "/v1/completions" if "prompt" in body else "/v1/chat/completions", "body": body})
        for cid, body in bodies.items()
    ]  # fmt: skip
    path = tmp_path / "batch.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    freight_ok(["run", str(path), "--model", str(demo_model_dir), "--output", str(out), "--max-tokens", "64",
                "--choice", "yes,no"])  # fmt: skip
    rows = _rows(out)
    assert rows["bad-name"]["error"] == "response_format.json_schema.name 'a b': must be 1-64 letters, digits, _ or -"
    expected = {"chat-schema": ("json_schema", NAMED), "chat-schema-n": ("json_schema", NAMED),
                "comp-schema": ("json_schema", NESTED), "guided-json": ("json_schema", NESTED),
                "guided-regex": ("regex", REGEX), "structured-choice": ("choice", CHOICES),
                "job-choice": ("choice", ["yes", "no"])}  # fmt: skip
    for cid, (kind, want) in expected.items():
        _check_constrained(rows[cid], kind, want)
    assert rows["text"]["error"] is None and rows["text"]["completion_tokens"] > 0 and rows["text"]["parsed"] is None
    assert json.loads((out / "cost.json").read_text())["constrained_rows"] == 7

    # the OpenAI export: the message content is the text (OpenAI adds no parsed value in batch output)
    export = tmp_path / "openai.jsonl"
    freight_ok(["results", str(out), "--format", "openai", "--to", str(export), "--errors", str(tmp_path / "errors.jsonl")])
    answered = {line["custom_id"]: body for line, body in parse_output(export)}
    for cid, body in answered.items():
        row = rows[cid]
        texts = row["completions"] or [row["completion"]]
        got = [c.message.content if hasattr(c, "message") else c.text for c in body.choices]
        assert got == texts, cid
    failed = {json.loads(line)["custom_id"] for line in (tmp_path / "errors.jsonl").read_text().splitlines()}
    assert "bad-name" in failed and "text" in answered and set(answered) | failed == set(bodies)
    assert rows["chat-schema-n"]["parsed_choices"] is not None and len(rows["chat-schema-n"]["parsed_choices"]) == 2
