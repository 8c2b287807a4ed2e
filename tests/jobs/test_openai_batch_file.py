"""An OpenAI Batch file mixing chat, completions, embeddings, responses, n > 1, every logprobs shape and bad lines
runs end to end on the tiny demo model; `freight results --format openai` turns its results into
output and error files that parse with the `openai` package's types, usage summing to the cost report.
So does a Parquet `--task embed` job."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from freight_runner import freight_ok
from openai_check import parse_errors, parse_output

CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"
MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "sort a list"}]


def test_mixed_batch_file_exports_as_openai_would(tmp_path: Path, demo_model_dir: Path) -> None:
    lines = {
        "chat": (CHAT, {"messages": MESSAGES, "max_tokens": 5}),
        "chat-n-lp": (CHAT, {"messages": MESSAGES, "n": 3, "temperature": 1.0, "seed": 7, "max_tokens": 4,
                             "logprobs": True, "top_logprobs": 2}),  # fmt: skip
        "comp-lp": (COMPLETIONS, {"prompt": "def f(x):", "max_tokens": 4, "logprobs": 2}),
        "comp-n": (COMPLETIONS, {"prompt": "import os", "n": 2, "temperature": 0.8, "max_tokens": 3}),
        "emb": ("/v1/embeddings", {"input": "some text"}),
        "resp": (RESPONSES, {"input": "sort a list", "instructions": "Answer briefly.", "max_output_tokens": 3,
                             "metadata": {"team": "a"}, "include": ["message.output_text.logprobs"],
                             "top_logprobs": 2}),  # fmt: skip
        "resp-json": (RESPONSES, {"input": [{"role": "user", "content": [{"type": "input_text", "text": "a JSON"}]}],
                                  "text": {"format": {"type": "json_object"}}, "max_output_tokens": 40}),  # fmt: skip
        "bad-n": (CHAT, {"messages": MESSAGES, "n": "two"}),
        "bad-resp": (RESPONSES, {"input": "x", "previous_response_id": "resp_1"}),
        "bad-role": (CHAT, {"messages": [{"role": "narrator", "content": "x"}]}),
    }
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body}) + "\n"
                            for cid, (url, body) in lines.items()))  # fmt: skip
    out = tmp_path / "out"
    freight_ok(["run", str(path), "--model", str(demo_model_dir), "--output", str(out), "--max-tokens", "8"])
    freight_ok(["results", str(out), "--format", "openai", "--to", str(tmp_path / "o.jsonl"),
                "--errors", str(tmp_path / "e.jsonl")])  # fmt: skip
    rows = {r["id"]: r for r in ds.dataset(out / "shards").to_table().to_pylist()}
    parsed = {raw["custom_id"]: body for raw, body in parse_output(tmp_path / "o.jsonl")}
    failed = {line["custom_id"]: line for line in parse_errors(tmp_path / "e.jsonl")}
    assert sorted([*parsed, *failed]) == sorted(lines) and not set(parsed) & set(failed)
    assert {"bad-n", "bad-role", "bad-resp"} <= set(failed)
    for cid, line in failed.items():
        assert line["error"]["message"] == rows[cid]["error"]

    assert parsed["chat"].object == "chat.completion" and parsed["chat"].choices[0].logprobs is None
    n3 = parsed["chat-n-lp"]
    assert [c.message.content for c in n3.choices] == rows["chat-n-lp"]["completions"]
    for choice, tokens in zip(n3.choices, rows["chat-n-lp"]["logprobs"], strict=True):
        got = choice.logprobs.content
        assert [t.token for t in got] == [t["token"] for t in tokens]
        assert all(len(t.top_logprobs) == 2 for t in got)
        assert [np.float32(t.logprob) for t in got] == [np.float32(t["logprob"]) for t in tokens]
    comp = parsed["comp-lp"]
    assert comp.object == "text_completion" and comp.choices[0].text == rows["comp-lp"]["completion"]
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == rows["comp-lp"]["completion_tokens"]
    assert all(2 <= len(top) <= 3 for top in lp.top_logprobs)  # top 2, plus the sampled token if not in it
    assert [c.text for c in parsed["comp-n"].choices] == rows["comp-n"]["completions"]
    if "emb" in parsed:  # embeddings run once the engine side (branch embed) is in
        assert parsed["emb"].object == "list" and len(parsed["emb"].data[0].embedding) > 0

    # a response: its text, tokens and logprobs as the row ran, the request's fields repeated
    resp, row = parsed["resp"], rows["resp"]
    assert resp.object == "response" and resp.id.startswith("resp_") and resp.output_text == row["completion"]
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"  # 3 tokens
    assert (resp.instructions, resp.metadata, resp.max_output_tokens, resp.top_logprobs) == (
        "Answer briefly.", {"team": "a"}, 3, 2)  # fmt: skip
    (message,) = resp.output
    assert message.type == "message" and message.role == "assistant" and message.status == "incomplete"
    got = message.content[0].logprobs
    assert [t.token for t in got] == [t["token"] for t in row["logprobs"][0]] and all(len(t.top_logprobs) == 2 for t in got)
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == (row["prompt_tokens"], 3)
    constrained, row = parsed["resp-json"], rows["resp-json"]
    assert constrained.text.format.type == "json_object" and constrained.output_text == row["completion"]
    assert constrained.status == ("completed" if row["finish_reason"] == "stop" else "incomplete")
    assert constrained.status == "incomplete" or json.loads(constrained.output_text) == json.loads(row["parsed"])

    report = json.loads((out / "cost.json").read_text())
    usages = [b.usage for b in parsed.values()]
    # a response's usage names its tokens input and output; the others' prompt and completion
    assert report["prompt_tokens"] == sum(getattr(u, "prompt_tokens", getattr(u, "input_tokens", 0)) for u in usages)
    assert report["completion_tokens"] == sum(
        getattr(u, "completion_tokens", getattr(u, "output_tokens", 0)) for u in usages
    )
    assert report["rows_failed"] == len(failed)


def test_embed_job_exports_embedding_lists(tmp_path: Path) -> None:
    from worker.demo_model import add_pooling_config, make_demo_model

    model = add_pooling_config(make_demo_model(tmp_path / "m", arch="qwen3"), "lasttoken", normalize=True,
                               append_eos=True)  # fmt: skip
    data = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": ["hello world", "", "def f(x): pass"]}), data)
    out = tmp_path / "out"
    freight_ok(["run", str(data), "--model", str(model), "--output", str(out), "--id-column", "id",
                "--prompt-column", "text", "--task", "embed", "--dimensions", "8"])  # fmt: skip
    freight_ok(["results", str(out), "--format", "openai", "--to", str(tmp_path / "o.jsonl")])
    rows = {r["id"]: r for r in ds.dataset(out / "shards").to_table().to_pylist()}
    parsed = {raw["custom_id"]: body for raw, body in parse_output(tmp_path / "o.jsonl")}
    assert sorted(parsed) == ["a", "c"]
    for cid, body in parsed.items():
        assert body.object == "list" and body.data[0].index == 0 and len(body.data[0].embedding) == 8
        assert np.array_equal(np.float32(body.data[0].embedding), np.float32(rows[cid]["embedding"]))
    assert [line["custom_id"] for line in parse_errors(tmp_path / "o.errors.jsonl")] == ["b"]  # empty text
    report = json.loads((out / "cost.json").read_text())
    assert report["prompt_tokens"] == sum(b.usage.prompt_tokens for b in parsed.values())
    assert all(b.usage.total_tokens == b.usage.prompt_tokens for b in parsed.values())
