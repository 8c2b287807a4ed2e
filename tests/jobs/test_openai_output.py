"""`freight results --format openai` on result shards holding the request columns (endpoint,
completions, finish_reasons, logprobs, embedding), built here as the worker writes them: chat,
completions, embeddings, n > 1, both logprobs shapes and failed rows, every line checked with the
`openai` package's types and against the columns it came from."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from openai_check import parse_errors, parse_output
from typer.testing import CliRunner

from freight_cli import app
from jobs import datasets
from jobs.cost import ShardRecord
from jobs.manifest import InputFile, InputPlan, Manifest, ShardPlan, shard_record_key, shard_result_key
from jobs.spec import JobSpec
from jobs.storage import open_store

TOP = pa.struct([("token", pa.string()), ("token_id", pa.int32()), ("logprob", pa.float32())])
TOKEN = pa.struct([*TOP, pa.field("top_logprobs", pa.list_(TOP))])
# the result schema's issue-15 columns, in the shared contract's order (docs/ARCHITECTURE.md)
NEW_FIELDS = [
    pa.field("endpoint", pa.string(), nullable=False),
    pa.field("completions", pa.list_(pa.string())),
    pa.field("finish_reasons", pa.list_(pa.string())),
    pa.field("logprobs", pa.list_(pa.list_(TOKEN))),
    pa.field("embedding", pa.list_(pa.float32())),
]
f32 = np.float32  # logprobs and embeddings are float32 columns: compared exactly, as float32
CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"


def _tokens(words: list[str], top: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """A choice's logprobs column value: per token its text, id, logprob and `top` alternatives."""
    out = []
    for i, word in enumerate(words):
        lps = np.sort(np.log(rng.dirichlet(np.ones(5))).astype(np.float32))[::-1]
        tops = [{"token": f"{word}~{k}", "token_id": 100 + k, "logprob": float(lps[k])} for k in range(top)]
        out.append({"token": word, "token_id": 10 + i, "logprob": float(lps[1]), "top_logprobs": tops})
    return out


def _row(id: str, endpoint: str, **kw: Any) -> dict[str, Any]:
    row = {"id": id, "completion": None, "finish_reason": "stop", "prompt_tokens": 7, "cached_tokens": 0,
           "completion_tokens": 0, "error": None, "endpoint": endpoint, "completions": None,
           "finish_reasons": None, "logprobs": None, "embedding": None}  # fmt: skip
    row.update(kw)
    return row


def _rows() -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    n3 = ["It sorts.", "Sorted: yes", "ok"]
    return [
        _row("chat-1", CHAT, completion="Hello there", completion_tokens=2, cached_tokens=4),
        _row("chat-n3", CHAT, completion=n3[0], finish_reason="stop", completion_tokens=9, completions=n3,
             finish_reasons=["stop", "length", "stop"],
             logprobs=[_tokens(t.split(" "), 2, rng) for t in n3]),  # fmt: skip
        _row("cmpl-lp", COMPLETIONS, completion=" a  b", finish_reason="length", completion_tokens=3,
             logprobs=[_tokens([" a", " ", " b"], 3, rng)]),  # fmt: skip
        _row("cmpl-n2-lp0", COMPLETIONS, completion="x", completion_tokens=3, completions=["x", "yz"],
             finish_reasons=["stop", "stop"], logprobs=[_tokens(["x"], 0, rng), _tokens(["y", "z"], 0, rng)]),  # fmt: skip
        _row("emb", EMBEDDINGS, prompt_tokens=5, embedding=[0.1, -0.25, 1 / 3, 3e-8]),
        _row("bad", CHAT, finish_reason="error", prompt_tokens=0,
             error="body.messages[0].role: unknown role 'robot' (use system, user, assistant or tool)"),  # fmt: skip
        _row("chat-uni", CHAT, completion="naïve ☃", completion_tokens=4, finish_reason="length"),
    ]


def _result_schema() -> pa.Schema:
    """The worker's result schema plus the contract's issue-15 columns it does not write yet; those it
    writes must have the contract's types."""
    base = datasets.result_schema(False)
    for field in NEW_FIELDS:
        if field.name in base.names:
            assert base.field(field.name).type == field.type, f"{field.name}: {base.field(field.name).type}"
    return pa.schema([*base, *(f for f in NEW_FIELDS if f.name not in base.names)])


def _job(tmp_path: Path, rows: list[dict[str, Any]], schema: pa.Schema | None = None) -> Path:
    """OUT of a finished two-shard JSONL job whose results are `rows` (in `schema`, default: all
    the result columns)."""
    out = tmp_path / "out"
    spec = JobSpec(input=str(tmp_path / "batch.jsonl"), model="models/tiny", output=str(out),
                   id_column="custom_id", prompt_column="messages")  # fmt: skip
    plan = InputPlan(format="jsonl", files=(InputFile(url=spec.input, rows=len(rows), size=1),), rows=len(rows),
                     prompt_column="messages", prompt_kind="messages", id_column="custom_id")  # fmt: skip
    cut = 4 if len(rows) > 4 else len(rows) // 2
    shards = (ShardPlan(index=0, rows=cut, ranges=((0, cut),)),
              ShardPlan(index=1, rows=len(rows) - cut, ranges=((cut, len(rows)),)))  # fmt: skip
    manifest = Manifest(job_id=spec.job_id, spec=spec, input=plan, shards=shards, created_at=time.time(),
                        price_per_hour=1.0, on_demand_price_per_hour=1.0)  # fmt: skip
    store = open_store(str(out))
    store.put("manifest.json", manifest.to_json())
    schema = schema or _result_schema()
    for shard, part in ((0, rows[:cut]), (1, rows[cut:])):
        store.put(shard_result_key(shard), datasets.write_result(pa.Table.from_pylist(part, schema)))
        ran = [r for r in part if r["error"] is None]
        record = ShardRecord(
            job_id=spec.job_id, shard=shard, attempt=1, rows=len(part), rows_failed=len(part) - len(ran),
            prompt_tokens=sum(r["prompt_tokens"] for r in ran), cached_tokens=sum(r["cached_tokens"] for r in ran),
            completion_tokens=sum(r["completion_tokens"] for r in ran), busy_seconds=1.0, load_seconds=0.0,
            wall_seconds=1.0, billed_seconds=1.0, instance_type="cpu-local", market="on-demand", price_per_hour=1.0,
            on_demand_price_per_hour=1.0, cost_usd=1 / 3600, on_demand_cost_usd=1 / 3600, worker="test",
            started_at=1_700_000_000.0, finished_at=1_700_000_000.5 + shard,
        )  # fmt: skip
        store.put(shard_record_key(shard), record.model_dump_json().encode())
    return out


def _export(out: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["results", str(out), "--format", "openai", *extra])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def test_every_line_parses_with_the_openai_types_and_carries_its_row(tmp_path: Path) -> None:
    rows = _rows()
    out = _job(tmp_path, rows)
    code, said = _export(out, "--to", str(tmp_path / "o.jsonl"), "--errors", str(tmp_path / "e.jsonl"))
    assert code == 0, said
    assert "6 requests to" in said and "1 failed to" in said
    parsed = parse_output(tmp_path / "o.jsonl")
    by_row = {r["id"]: r for r in rows}
    shard_of = {r["id"]: 0 if i < 4 else 1 for i, r in enumerate(rows)}  # _job cuts after row 4
    assert [raw["custom_id"] for raw, _ in parsed] == [r["id"] for r in rows if r["error"] is None]
    for raw, body in parsed:
        row = by_row[raw["custom_id"]]
        if row["endpoint"] == EMBEDDINGS:
            assert body.object == "list" and body.model == "models/tiny" and len(body.data) == 1
            assert np.array_equal(np.float32(body.data[0].embedding), np.float32(row["embedding"]))
            assert body.usage.prompt_tokens == body.usage.total_tokens == row["prompt_tokens"]
            continue
        chat = row["endpoint"] == CHAT
        assert body.object == ("chat.completion" if chat else "text_completion")
        assert body.id.startswith("chatcmpl-" if chat else "cmpl-")
        assert body.created == 1_700_000_000 + shard_of[row["id"]]  # the shard record's finished_at
        texts = row["completions"] or [row["completion"]]
        reasons = row["finish_reasons"] or [row["finish_reason"]]
        assert [c.index for c in body.choices] == list(range(len(texts)))
        assert [c.message.content if chat else c.text for c in body.choices] == texts
        assert [c.finish_reason for c in body.choices] == reasons
        if chat:
            assert all(c.message.role == "assistant" for c in body.choices)
        usage = body.usage
        assert (usage.prompt_tokens, usage.completion_tokens) == (row["prompt_tokens"], row["completion_tokens"])
        assert usage.total_tokens == row["prompt_tokens"] + row["completion_tokens"]
        assert usage.prompt_tokens_details.cached_tokens == row["cached_tokens"]
        for choice, tokens in zip(body.choices, row["logprobs"] or [None] * len(texts), strict=True):
            if tokens is None:
                assert choice.logprobs is None
            elif chat:  # {"content": [{token, logprob, bytes, top_logprobs}]}
                got = choice.logprobs.content
                assert [(t.token, f32(t.logprob), t.bytes) for t in got] == [
                    (t["token"], f32(t["logprob"]), list(t["token"].encode())) for t in tokens]  # fmt: skip
                assert [[(x.token, f32(x.logprob)) for x in t.top_logprobs] for t in got] == [
                    [(x["token"], f32(x["logprob"])) for x in t["top_logprobs"]] for t in tokens]  # fmt: skip
            else:  # {tokens, token_logprobs, top_logprobs: [{text: logprob}], text_offset}
                lp = choice.logprobs
                assert lp.tokens == [t["token"] for t in tokens]
                assert [f32(x) for x in lp.token_logprobs] == [f32(t["logprob"]) for t in tokens]
                assert [{k: f32(v) for k, v in top.items()} for top in lp.top_logprobs] == [
                    {**{x["token"]: f32(x["logprob"]) for x in t["top_logprobs"]}, t["token"]: f32(t["logprob"])}
                    for t in tokens]  # fmt: skip
                starts = [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
                assert lp.text_offset == starts and "".join(lp.tokens) == choice.text
    (bad,) = parse_errors(tmp_path / "e.jsonl")
    assert bad["custom_id"] == "bad" and bad["error"]["message"] == by_row["bad"]["error"]
    ids = [raw["id"] for raw, _ in parsed] + [bad["id"]]
    assert len(set(ids)) == len(ids) and all(i.startswith("batch_req_") for i in ids)

    # usage over the output file = the job's tokens in its cost report
    report = json.loads(CliRunner().invoke(app, ["cost", str(out), "--json"]).output)
    generated = [b.usage for _, b in parsed if b.object != "list"]
    embedded = [b.usage for _, b in parsed if b.object == "list"]
    assert report["prompt_tokens"] == sum(u.prompt_tokens for u in generated + embedded)
    assert report["completion_tokens"] == sum(u.completion_tokens for u in generated)
    assert report["cached_tokens"] == sum(u.prompt_tokens_details.cached_tokens for u in generated)

    # the same job exported again (--force: the files exist): the same bytes (ids come from the job and the row)
    first = (tmp_path / "o.jsonl").read_bytes()
    assert _export(out, "--to", str(tmp_path / "o.jsonl"), "--errors", str(tmp_path / "e.jsonl"), "--force")[0] == 0
    assert (tmp_path / "o.jsonl").read_bytes() == first


def test_error_file_defaults_beside_the_output_and_is_empty_when_nothing_failed(tmp_path: Path) -> None:
    out = _job(tmp_path, [r for r in _rows() if r["error"] is None])
    code, said = _export(out, "--to", str(tmp_path / "batch_out.jsonl"))
    assert code == 0, said
    assert len(parse_output(tmp_path / "batch_out.jsonl")) == 6
    assert (tmp_path / "batch_out.errors.jsonl").read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["batch_out.errors.jsonl", "batch_out.jsonl"]


def test_shards_without_the_endpoint_column_answer_by_prompt_kind_or_embedding(tmp_path: Path) -> None:
    """Shards of a worker that wrote no endpoint column (jobs before it; an embed-only worker): a
    row with an embedding is an embeddings request, the others follow the prompt column's kind."""
    base = datasets.result_schema(False)
    issue15 = {f.name for f in NEW_FIELDS}
    schema = pa.schema([*(f for f in base if f.name not in issue15), NEW_FIELDS[-1]])  # + embedding
    keep = [r for r in _rows() if not r["completions"] and not r["logprobs"]]
    rows = [{k: v for k, v in r.items() if k in schema.names} for r in keep]
    out = _job(tmp_path, rows, schema)
    assert _export(out, "--to", str(tmp_path / "o.jsonl"))[0] == 0
    kinds = {raw["custom_id"]: body.object for raw, body in parse_output(tmp_path / "o.jsonl")}
    assert kinds == {"chat-1": "chat.completion", "emb": "list", "chat-uni": "chat.completion"}
    assert [line["custom_id"] for line in parse_errors(tmp_path / "o.errors.jsonl")] == ["bad"]


def test_unfinished_job_exports_only_with_partial(tmp_path: Path) -> None:
    rows = _rows()
    out = _job(tmp_path, rows)
    (out / shard_result_key(1)).unlink()  # as if shard 1 were still running
    export = tmp_path / "o.jsonl"
    code, said = _export(out, "--to", str(export))
    assert code == 2 and "pass --partial" in said and not export.exists()
    code, said = _export(out, "--to", str(export), "--partial")
    assert code == 0 and "partial export: 1 of 2 shards (3 of 7 rows)" in " ".join(said.split())
    assert [raw["custom_id"] for raw, _ in parse_output(export)] == [r["id"] for r in rows[:4]]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--format openai writes files: give --to FILE.jsonl"),
        (["--to", "x.parquet"], "give a .jsonl file name"),
        (["--to", "x.jsonl", "--errors", "x.jsonl"], "is the --to file"),
    ],
)
def test_refusals_say_what_to_do(tmp_path: Path, args: list[str], message: str) -> None:
    out = _job(tmp_path, _rows())
    args = [str(tmp_path / a) if a.startswith("x.") else a for a in args]
    code, said = _export(out, *args)
    assert code == 2 and message in " ".join(said.split()), said
    assert not (tmp_path / "x.jsonl").exists()


def test_errors_flag_without_openai_format_is_refused(tmp_path: Path) -> None:
    out = _job(tmp_path, _rows())
    result = CliRunner().invoke(app, ["results", str(out), "--to", str(tmp_path / "a.jsonl"),
                                      "--errors", str(tmp_path / "e.jsonl")])  # fmt: skip
    assert result.exit_code == 2 and "--errors goes with --format openai" in result.output


def test_a_response_row_is_a_response_object_the_sdk_parses() -> None:
    """/v1/responses rows: a finished one is "completed" with its text and logprobs, a cut one
    "incomplete"; the request's fields (a json_schema format among them) come back as it ran."""
    from openai.types.responses import Response
    from openai_check import assert_known_fields

    from jobs.openai_response import response_body

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fields = {"instructions": "be brief", "metadata": {"run": "7"}, "max_output_tokens": 12, "temperature": 0.5,
              "top_p": 0.9, "top_logprobs": 2, "user": "u", "prompt_cache_key": "k",
              "text": {"format": {"type": "json_schema", "name": "ab", "schema": schema, "strict": True}}}  # fmt: skip
    tokens = _tokens(['{"a"', ":", "1}"], 2, np.random.default_rng(1))
    row = _row("r", "/v1/responses", completion='{"a":1}', completion_tokens=3, cached_tokens=2,
               logprobs=[tokens], response_fields=json.dumps(fields))  # fmt: skip
    body = Response.model_validate(response_body(row, "resp_x", "msg_x", 1_700_000_000, "tiny"))
    assert_known_fields(body, "body")
    assert (body.id, body.status, body.completed_at, body.incomplete_details, body.model) == (
        "resp_x", "completed", 1_700_000_000, None, "tiny")  # fmt: skip
    assert body.output_text == '{"a":1}' and body.output[0].id == "msg_x"  # type: ignore[union-attr]
    assert body.text is not None and body.text.format.type == "json_schema" and body.text.format.schema_ == schema  # type: ignore[union-attr]
    assert (body.instructions, body.metadata, body.max_output_tokens, body.temperature, body.top_p) == (
        "be brief", {"run": "7"}, 12, 0.5, 0.9)  # fmt: skip
    got = body.output[0].content[0].logprobs  # type: ignore[union-attr]
    assert [t.token for t in got] == ['{"a"', ":", "1}"] and [f32(t.logprob) for t in got] == [
        f32(t["logprob"]) for t in tokens]  # fmt: skip
    assert all([x.token for x in t.top_logprobs] == [x["token"] for x in s["top_logprobs"]] for t, s in zip(got, tokens, strict=True))
    usage = body.usage
    assert usage is not None and (usage.input_tokens, usage.input_tokens_details.cached_tokens, usage.output_tokens,
                                  usage.total_tokens) == (7, 2, 3, 10)  # fmt: skip
    cut = Response.model_validate(response_body({**row, "finish_reason": "length", "logprobs": None}, "resp_y",
                                                "msg_y", 1_700_000_000, "tiny"))  # fmt: skip
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]
    assert cut.completed_at is None and cut.output[0].status == "incomplete"  # type: ignore[union-attr]
    assert cut.output[0].content[0].logprobs is None  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="without its response_fields"):
        response_body({**row, "response_fields": None}, "resp_z", "msg_z", 0, "tiny")
    thought = Response.model_validate(response_body({**row, "reasoning": "a is one", "reasoning_tokens": 2},
                                                    "resp_t", "msg_t", 0, "tiny"))  # fmt: skip
    assert_known_fields(thought, "body")
    reasoning, message = thought.output
    assert reasoning.type == "reasoning" and reasoning.id == "rs_t" and message.id == "msg_t"
    assert [c.text for c in reasoning.content] == ["a is one"] and thought.output_text == '{"a":1}'  # type: ignore[union-attr]
    assert thought.usage is not None and thought.usage.output_tokens_details.reasoning_tokens == 2
