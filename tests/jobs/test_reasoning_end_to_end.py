"""Reasoning and tool calls end to end: an OpenAI-Batch file on the qwen3 demo checkpoint (Qwen3's
chat template and markup; random weights, so its thinking is driven by logit_bias and its calls by
tool_choice), run with `freight run` and exported with `freight results --format openai`.

Rows get `reasoning` apart from `completion`, a thinking budget bounds the thinking, a JSON schema
holds the answer after it, forced tool calls validate against their parameters schemas (jsonschema),
a multi-turn tool transcript is a row, bad reasoning and tool fields are their rows' errors; the
export parses with the `openai` types with reasoning_tokens right, and the cost report counts the
reasoning tokens apart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pyarrow.dataset as ds
import pytest
from openai_check import parse_errors, parse_output
from typer.testing import CliRunner

from freight_cli import app
from jobs import datasets
from worker.demo_model import make_demo_model
from worker.engine.tokenizer import Tokenizer

ANSWER = {"type": "object", "properties": {"answer": {"type": "integer"}, "sure": {"type": "boolean"}},
          "required": ["answer", "sure"]}  # fmt: skip
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
           "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}  # fmt: skip
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}}, "required": ["zone"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]  # fmt: skip
USER = [{"role": "user", "content": "What is the weather in Oslo?"}]


def _run(args: list[str]) -> str:
    result = CliRunner().invoke(app, args)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo_model(tmp_path_factory.mktemp("models") / "qwen3", "qwen3")


def test_reasoning_and_tools_batch(qwen3_dir: Path, tmp_path: Path) -> None:
    think = str(Tokenizer(qwen3_dir).vocab()["<think>"])
    transcript = [*USER, {"role": "assistant", "content": None, "reasoning_content": "Oslo: ask the tool.",
                          "tool_calls": [{"id": "call_1", "type": "function",
                                          "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 1}'}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 3}'}]  # fmt: skip
    bodies: dict[str, dict[str, Any]] = {
        "think-json": {"messages": USER, "logit_bias": {think: 100}, "reasoning_budget": 8, "max_completion_tokens": 120,
                       "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}},
        "think-cut": {"messages": USER, "logit_bias": {think: 100}, "max_completion_tokens": 10},
        "think-n": {"messages": USER, "logit_bias": {think: 100}, "reasoning_budget": 3, "n": 2, "temperature": 1.0,
                    "max_completion_tokens": 12},
        "no-think": {"messages": USER, "chat_template_kwargs": {"enable_thinking": False}, "max_completion_tokens": 8},
        "required": {"messages": USER, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False,
                     "max_completion_tokens": 120},
        "named": {"messages": USER, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}},
                  "logit_bias": {think: 100}, "reasoning_budget": 2, "max_completion_tokens": 120},
        "transcript": {"messages": transcript, "tools": TOOLS, "max_completion_tokens": 8},
        "bad-choice": {"messages": USER, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "bad-schema": {"messages": USER, "tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "integer", "minimum": "one"}}}}}]},
        "bad-budget": {"messages": USER, "reasoning_budget": -1},
        "bad-effort": {"messages": USER, "reasoning_effort": "low"},
        "bad-call-id": {"messages": [*USER, {"role": "tool", "tool_call_id": "call_7", "content": "x"}]},
    }  # fmt: skip
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                                        "body": body}) + "\n" for cid, body in bodies.items()))  # fmt: skip
    out = tmp_path / "out"
    _run(["run", str(path), "--model", str(qwen3_dir), "--output", str(out)])
    table = ds.dataset(out / "shards").to_table()
    assert table.schema == datasets.result_schema(likelihood=False)
    rows = {r["id"]: r for r in table.to_pylist()}

    row = rows["think-json"]
    assert row["finish_reason"] == "stop" and row["reasoning"] == "<think>" * 8 and row["reasoning_tokens"] == 8
    jsonschema.validate(json.loads(row["completion"]), ANSWER)
    assert json.loads(row["parsed"]) == json.loads(row["completion"])
    row = rows["think-cut"]  # the thinking never ended: all reasoning, no answer
    assert row["finish_reason"] == "length" and row["completion"] == "" and row["reasoning_tokens"] == 9
    row = rows["think-n"]
    assert row["reasoning_choices"] == ["<think>" * 3] * 2 and row["reasoning_tokens"] == 6
    assert rows["no-think"]["reasoning"] is None and rows["no-think"]["reasoning_tokens"] == 0

    schemas = {"get_weather": WEATHER, "get_time": TIME}
    for cid, names in (("required", {"get_weather", "get_time"}), ("named", {"get_time"})):
        row = rows[cid]
        assert row["error"] is None and row["finish_reason"] == "tool_calls", row
        (call,) = row["tool_calls"]  # parallel_tool_calls false, or a named tool: one call
        assert call["name"] in names and call["type"] == "function" and call["id"].startswith("call_")
        jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])
    assert rows["named"]["reasoning_tokens"] == 2
    assert rows["transcript"]["error"] is None and rows["transcript"]["completion_tokens"] > 0

    errors = {cid: rows[cid]["error"] for cid in bodies if cid.startswith("bad-")}
    assert errors == {
        "bad-choice": "tool_choice.function.name 'nope': no tool of that name in tools (get_weather, get_time)",
        "bad-schema": errors["bad-schema"],
        "bad-budget": "reasoning_budget -1: must be >= 0",
        "bad-effort": errors["bad-effort"],
        "bad-call-id": "messages[1].tool_call_id 'call_7': no earlier assistant message made a call with this id "
                       "(or it was answered already)",
    }  # fmt: skip
    assert errors["bad-schema"].startswith("tools[0].function.parameters: not a valid JSON schema")
    assert errors["bad-effort"].startswith("reasoning_effort 'low': this model's chat template takes no reasoning effort")

    export = tmp_path / "openai.jsonl"
    _run(["results", str(out), "--format", "openai", "--to", str(export), "--errors", str(tmp_path / "err.jsonl")])
    answered = {line["custom_id"]: body for line, body in parse_output(export)}
    assert {line["custom_id"] for line in parse_errors(tmp_path / "err.jsonl")} == set(errors)
    for cid, body in answered.items():
        row = rows[cid]
        assert body.usage.completion_tokens_details.reasoning_tokens == row["reasoning_tokens"], cid
        message = body.choices[0].message
        assert (message.model_extra or {}).get("reasoning_content") == row["reasoning"], cid
    weather = answered["required"].choices[0]
    assert weather.finish_reason == "tool_calls" and weather.message.content is None
    assert weather.message.tool_calls[0].function.name == rows["required"]["tool_calls"][0]["name"]
    assert json.loads(weather.message.tool_calls[0].function.arguments) == json.loads(rows["required"]["tool_calls"][0]["arguments"])
    cost = json.loads((out / "cost.json").read_text())
    assert cost["reasoning_tokens"] == sum(r["reasoning_tokens"] or 0 for r in rows.values()) == 8 + 9 + 6 + 2
    assert cost["answer_tokens"] == cost["completion_tokens"] - cost["reasoning_tokens"]
    assert 0 < cost["reasoning_cost_usd"] < cost["output_cost_usd"]


@pytest.mark.parametrize(
    ("model", "flags", "expected"),
    [
        ("llama", ["--reasoning-budget", "8"], "--reasoning-budget: model {model} does not reason"),
        ("qwen3", ["--reasoning-effort", "low"], "--reasoning-effort: model {model}'s chat template takes no reasoning effort"),
        ("qwen3", ["--reasoning-budget", "-1"], "--reasoning-budget -1: input should be greater than or equal to 0"),
    ],
)  # fmt: skip
def test_reasoning_flags_refused_at_submit(qwen3_dir: Path, demo_model_dir: Path, tmp_path: Path, model: str,
                                           flags: list[str], expected: str) -> None:  # fmt: skip
    """A reasoning flag the model cannot honour is refused before anything is written."""
    path = tmp_path / "batch.jsonl"
    path.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                                "body": {"messages": USER}}) + "\n")  # fmt: skip
    model_dir = qwen3_dir if model == "qwen3" else demo_model_dir
    result = CliRunner().invoke(app, ["run", str(path), "--model", str(model_dir), "--output", str(tmp_path / "o"), *flags])
    assert result.exit_code == 2, result.output
    assert expected.format(model=model_dir) in " ".join(result.output.split()), result.output
    assert not (tmp_path / "o").exists()


def test_no_thinking_flag_renders_thinking_off(qwen3_dir: Path, tmp_path: Path) -> None:
    """--no-thinking: enable_thinking=False for every chat row; a row's chat_template_kwargs wins."""
    path = tmp_path / "batch.jsonl"
    bodies = {"off": {"messages": USER, "max_tokens": 2},
              "on": {"messages": USER, "max_tokens": 2, "chat_template_kwargs": {"enable_thinking": True}}}  # fmt: skip
    path.write_text("".join(json.dumps({"custom_id": c, "method": "POST", "url": "/v1/chat/completions", "body": b})
                            + "\n" for c, b in bodies.items()))  # fmt: skip
    _run(["run", str(path), "--model", str(qwen3_dir), "--output", str(tmp_path / "o"), "--no-thinking"])
    rows = {r["id"]: r for r in ds.dataset(tmp_path / "o" / "shards").to_table().to_pylist()}
    tok = Tokenizer(qwen3_dir)
    off = len(tok.encode(tok.apply_chat_template(USER, enable_thinking=False)))
    assert rows["off"]["prompt_tokens"] == off and rows["on"]["prompt_tokens"] == len(tok.encode(tok.apply_chat_template(USER)))


def test_parquet_messages_rows_think(qwen3_dir: Path, tmp_path: Path) -> None:
    """A Parquet job of chat messages: the reasoning_budget and chat_template_kwargs columns set each
    row's thinking (a null cell takes the job's --reasoning-budget); text prompts refuse the flags."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    think = Tokenizer(qwen3_dir).vocab()["<think>"]
    messages = [[{"role": "user", "content": f"Question {i}?"}] for i in range(3)]
    table = pa.table({
        "id": ["a", "b", "c"],
        "messages": messages,
        "reasoning_budget": pa.array([2, None, None], pa.int64()),
        "chat_template_kwargs": [None, None, '{"enable_thinking": false}'],
        "logit_bias": [json.dumps({str(think): 100})] * 3,
    })  # fmt: skip
    pq.write_table(table, tmp_path / "chat.parquet")
    _run(["run", str(tmp_path / "chat.parquet"), "--model", str(qwen3_dir), "--output", str(tmp_path / "o"),
          "--prompt-column", "messages", "--id-column", "id", "--max-tokens", "10", "--reasoning-budget", "4"])  # fmt: skip
    rows = {r["id"]: r for r in ds.dataset(tmp_path / "o" / "shards").to_table().to_pylist()}
    assert rows["a"]["reasoning"] == "<think>" * 2 and rows["a"]["reasoning_tokens"] == 2
    assert rows["b"]["reasoning"] == "<think>" * 4 and rows["b"]["reasoning_tokens"] == 4
    assert rows["c"]["reasoning"] is None and rows["c"]["reasoning_tokens"] == 0
    assert cost_reasoning(tmp_path / "o") == 6

    pq.write_table(pa.table({"prompt": ["hello"]}), tmp_path / "text.parquet")
    result = CliRunner().invoke(app, ["run", str(tmp_path / "text.parquet"), "--model", str(qwen3_dir),
                                      "--output", str(tmp_path / "t"), "--reasoning-budget", "4"])  # fmt: skip
    assert result.exit_code == 2 and "only chat rows think" in result.output


def cost_reasoning(out: Path) -> int:
    return int(json.loads((out / "cost.json").read_text())["reasoning_tokens"])


def test_a_thinking_model_s_response_holds_its_answer_and_counts_its_reasoning(qwen3_dir: Path, tmp_path: Path) -> None:
    """/v1/responses rows of a thinking model: the reasoning is split from the answer as a chat row's is,
    the response's output_text is the answer, and its usage counts the reasoning tokens; the job's
    --no-thinking reaches a response's template too."""
    from openai.types.responses import Response

    think = str(Tokenizer(qwen3_dir).vocab()["<think>"])
    bodies = {
        "think": {"input": "What is 2 + 2?", "logit_bias": {think: 100}, "reasoning_budget": 4, "max_output_tokens": 60,
                  "text": {"format": {"type": "json_schema", "name": "a", "schema": ANSWER}}},
        "plain": {"input": [{"role": "user", "content": "Hi"}], "max_output_tokens": 6},
    }  # fmt: skip
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/responses", "body": body})
                            + "\n" for cid, body in bodies.items()))  # fmt: skip
    out = tmp_path / "out"
    _run(["run", str(path), "--model", str(qwen3_dir), "--output", str(out)])
    rows = {r["id"]: r for r in ds.dataset(out / "shards").to_table().to_pylist()}
    assert rows["think"]["reasoning"] == "<think>" * 4 and rows["think"]["reasoning_tokens"] == 4
    export = tmp_path / "openai.jsonl"
    _run(["results", str(out), "--format", "openai", "--to", str(export)])
    answered = {line["custom_id"]: body for line, body in parse_output(export)}
    think_body = answered["think"]
    assert isinstance(think_body, Response) and think_body.status == "completed"
    assert think_body.output_text == rows["think"]["completion"] and "<think>" not in think_body.output_text
    jsonschema.validate(json.loads(think_body.output_text), ANSWER)
    assert think_body.usage is not None and think_body.usage.output_tokens_details.reasoning_tokens == 4
    assert think_body.usage.output_tokens == rows["think"]["completion_tokens"]

    off = tmp_path / "off"
    _run(["run", str(path), "--model", str(qwen3_dir), "--output", str(off), "--no-thinking"])
    plain = {r["id"]: r for r in ds.dataset(off / "shards").to_table().to_pylist()}["plain"]
    # Qwen3's template closes an empty thinking block in the prompt when thinking is off
    assert plain["error"] is None and plain["prompt_tokens"] > rows["plain"]["prompt_tokens"]


def test_responses_lines_call_function_tools(qwen3_dir: Path, tmp_path: Path) -> None:
    """/v1/responses lines with function tools (the Responses shape): the same prompt and the same
    forced, schema-valid calls as the chat line with those tools; calls come back as function_call
    output items, and a transcript of calls and their outputs is an input."""
    from openai.types.responses import Response

    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    transcript = [*USER, {"type": "function_call", "call_id": "call_1", "name": "get_weather", "status": "completed",
                          "arguments": '{"city": "Oslo", "days": 1}'},
                  {"type": "function_call_output", "call_id": "call_1", "output": '{"temp": 3}'}]  # fmt: skip
    lines = {
        "chat": ("/v1/chat/completions", {"messages": USER, "tools": TOOLS, "tool_choice": "required",
                                          "parallel_tool_calls": False, "max_completion_tokens": 120}),
        "required": ("/v1/responses", {"input": USER, "tools": tools, "tool_choice": "required",
                                       "parallel_tool_calls": False, "max_output_tokens": 120}),
        "named": ("/v1/responses", {"input": USER[0]["content"], "tools": tools, "max_output_tokens": 120,
                                    "tool_choice": {"type": "function", "name": "get_time"}}),
        "transcript": ("/v1/responses", {"input": transcript, "tools": tools, "max_output_tokens": 8}),
        "bad-choice": ("/v1/responses", {"input": "x", "tools": tools, "tool_choice": {"type": "function", "name": "no"}}),
        "bad-format": ("/v1/responses", {"input": "x", "tools": tools, "tool_choice": "required",
                                         "text": {"format": {"type": "json_object"}}}),
    }  # fmt: skip
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body}) + "\n"
                            for cid, (url, body) in lines.items()))  # fmt: skip
    out = tmp_path / "out"
    _run(["run", str(path), "--model", str(qwen3_dir), "--output", str(out)])
    rows = {r["id"]: r for r in ds.dataset(out / "shards").to_table().to_pylist()}
    chat, required = rows["chat"], rows["required"]
    assert required["error"] is None and required["finish_reason"] == "tool_calls", required
    assert required["prompt_tokens"] == chat["prompt_tokens"]  # tools rendered by the template as for chat
    assert [(c["name"], c["arguments"]) for c in required["tool_calls"]] == [
        (c["name"], c["arguments"]) for c in chat["tool_calls"]]  # fmt: skip
    schemas = {"get_weather": WEATHER, "get_time": TIME}
    for cid in ("required", "named"):
        (call,) = rows[cid]["tool_calls"]
        jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])
    assert rows["named"]["tool_calls"][0]["name"] == "get_time"
    assert rows["transcript"]["error"] is None and rows["transcript"]["prompt_tokens"] > chat["prompt_tokens"]
    assert rows["bad-choice"]["error"] == "tool_choice.name 'no': no tool of that name in tools (get_weather, get_time)"
    assert rows["bad-format"]["error"].startswith("text.format and tool_choice required: both constrain the output")

    export = tmp_path / "openai.jsonl"
    _run(["results", str(out), "--format", "openai", "--to", str(export), "--errors", str(tmp_path / "err.jsonl")])
    answered = {line["custom_id"]: body for line, body in parse_output(export)}
    body = answered["required"]
    assert isinstance(body, Response) and body.status == "completed"
    (item,) = [o for o in body.output if o.type == "function_call"]
    call = required["tool_calls"][0]
    assert (item.call_id, item.name, item.arguments) == (call["id"], call["name"], call["arguments"])
    assert item.id is not None and item.id.startswith("fc_") and item.status == "completed"
    assert [t.name for t in body.tools] == ["get_weather", "get_time"]  # type: ignore[union-attr]
    assert body.tools[0].parameters == WEATHER and body.tool_choice == "required" and body.parallel_tool_calls is False  # type: ignore[union-attr]
    named = answered["named"]
    assert named.tool_choice.name == "get_time" and named.parallel_tool_calls is True  # type: ignore[union-attr]
    assert [o.type for o in answered["transcript"].output][-1] in ("message", "function_call")


def test_parquet_messages_rows_call_tools(qwen3_dir: Path, tmp_path: Path) -> None:
    """A Parquet job of chat messages with tools, tool_choice and parallel_tool_calls columns: each row
    renders its tools and gets its calls as a chat body does (a struct's null fields absent, a
    schema as JSON text); a bad choice is that row's error."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tools = [{"type": "function", "function": {"name": t["function"]["name"], "description": t["function"].get("description"),
                                               "parameters": json.dumps(t["function"]["parameters"])}} for t in TOOLS]  # fmt: skip
    named = json.dumps({"type": "function", "function": {"name": "get_time"}})
    table = pa.table({
        "id": ["required", "named", "none", "bad"],
        "messages": [USER] * 4,
        "tools": [tools] * 4,
        "tool_choice": ["required", named, "none", named.replace("get_time", "nope")],
        "parallel_tool_calls": [False, None, None, None],
    })  # fmt: skip
    pq.write_table(table, tmp_path / "tools.parquet")
    _run(["run", str(tmp_path / "tools.parquet"), "--model", str(qwen3_dir), "--output", str(tmp_path / "o"),
          "--prompt-column", "messages", "--id-column", "id", "--max-tokens", "120"])  # fmt: skip
    rows = {r["id"]: r for r in ds.dataset(tmp_path / "o" / "shards").to_table().to_pylist()}
    schemas = {"get_weather": WEATHER, "get_time": TIME}
    for cid, names in (("required", {"get_weather", "get_time"}), ("named", {"get_time"})):
        row = rows[cid]
        assert row["error"] is None and row["finish_reason"] == "tool_calls", row
        (call,) = row["tool_calls"]
        assert call["name"] in names
        jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])
    assert rows["none"]["error"] is None and rows["none"]["tool_calls"] is None
    assert rows["none"]["prompt_tokens"] == rows["required"]["prompt_tokens"]  # the tools are rendered either way
    assert rows["bad"]["error"] == "tool_choice.function.name 'nope': no tool of that name in tools (get_weather, get_time)"
