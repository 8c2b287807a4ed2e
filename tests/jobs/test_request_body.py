"""Request bodies and Parquet sampling columns -> RowRequests and the engine's SamplingParams: every
field honoured, or that row's error naming the field and the rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from batch_rows import JSONL_PLAN, USER, job_spec, one_request

from jobs.batch_input import read_batch
from jobs.manifest import InputFile, InputPlan
from worker.row_engine import sampling_params
from worker.row_requests import RowRequest, build_requests


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> Any:
    from worker.engine.tokenizer import Tokenizer

    return Tokenizer(demo_model_dir)


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
BAD_BODIES = [
    ({"messages": USER, "n": "two"}, "n 'two': must be an integer"),
    ({"messages": USER, "temperature": -1}, "temperature -1: must be >= 0"),
    ({"messages": USER, "top_p": 0}, "top_p 0: must be > 0"),
    ({"messages": USER, "n": 17}, "n 17: a row may ask for at most 16 choices (FREIGHT_MAX_N)"),
    ({"messages": USER, "logit_bias": {"5000": 3}}, "logit_bias: token id 5000 is outside the vocabulary"),
    ({"messages": USER, "logit_bias": {"abc": 3}}, "logit_bias key 'abc' is not a token id"),
    ({"messages": USER, "logit_bias": {"5": 300}}, "a bias must be a number in [-100, 100]"),
    ({"messages": USER, "stop_token_ids": [99999]}, "stop_token_ids: token id 99999 is outside the vocabulary"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role 'robot': must be one of system, developer"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id: is required"),
    ({"messages": [*USER, {"role": "tool", "content": "x", "tool_call_id": "call_9"}]},
     "messages[1].tool_call_id 'call_9': no earlier assistant message made a call with this id"),
    ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role 'function': function messages are deprecated"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0].type 'image_url': only text parts"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0]: unknown field 'tool_calls'"),
    ({"messages": []}, "messages: must be a non-empty list"),
    ({}, "messages: is required"),
    ({"messages": USER, "model": "gpt-4o-mini"}, "model 'gpt-4o-mini': this job runs 'tiny'"),
    ({"messages": USER, "response_format": {"type": "json_schema"}}, "response_format.json_schema: is required"),
    ({"messages": USER, "frobnicate": 1}, "unknown field 'frobnicate': /v1/chat/completions takes no such field"),
    ({"messages": USER, "tools": []}, "tools: must be a non-empty list"),
    ({"messages": USER, "tools": [TOOL]}, "tools: this model's chat template renders no tools"),
    ({"messages": USER, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tool_choice.function.name 'g': no tool of that name in tools (f)"),
    ({"messages": USER, "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "integr"}}}}}]},
     "tools[0].function.parameters: not a valid JSON schema"),
    ({"messages": USER, "tool_choice": "required"}, "tool_choice 'required': needs tools"),
    ({"messages": USER, "functions": []}, "unknown field 'functions': functions are deprecated: give tools"),
    ({"messages": USER, "reasoning_effort": "high"}, "reasoning_effort 'high': this model does not reason"),
    ({"messages": USER, "reasoning_effort": "max"}, "reasoning_effort 'max': input should be 'low', 'medium' or 'high'"),
    ({"messages": USER, "reasoning_budget": -1}, "reasoning_budget -1: must be >= 0"),
    ({"messages": USER, "reasoning_budget": 5}, "reasoning_budget 5: this request does not think"),
    ({"messages": USER, "chat_template_kwargs": {"enable_thinking": False}},
     "chat_template_kwargs.enable_thinking: this model's chat template has no thinking switch"),
    ({"messages": USER, "stop": ["a"] * 17}, "stop: takes up to 16 non-empty strings"),
    ({"messages": USER, "stop": 5}, "stop 5: must be a string or a list"),
    ({"messages": USER, "top_logprobs": 3}, "top_logprobs 3: needs logprobs: true"),
    ({"messages": USER, "logprobs": True, "top_logprobs": 21}, "top_logprobs 21: must be <= 20"),
    ({"messages": USER, "max_tokens": 4, "min_tokens": 9}, "min_tokens 9: must not exceed max_tokens (4)"),
    ({"messages": USER, "presence_penalty": 2.5}, "presence_penalty 2.5: must be <= 2.0"),
    ({"messages": USER, "seed": True}, "seed True: must be an integer"),
    ({"messages": USER, "stream": True}, "stream true: batch requests do not stream"),
    ({"messages": USER, "echo": True}, "unknown field 'echo'"),  # a completions field
]


@pytest.mark.parametrize(("body", "expected"), BAD_BODIES, ids=[e[:30] for _, e in BAD_BODIES])
def test_bad_chat_fields_are_row_errors_naming_field_and_rule(
    tokenizer: Any, demo_model_dir: Path, body: dict[str, Any], expected: str
) -> None:
    req = one_request(tokenizer, job_spec(demo_model_dir), body)
    assert req.prompt is None and req.sampling is None and req.error is not None
    assert expected in req.error, req.error
    assert req.endpoint == "chat"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"prompt": ["a", "b"]}, "prompt: holds 2 inputs: freight runs one per request"),
        ({"prompt": 5}, "prompt 5: must be a string or a list of token ids"),
        ({"prompt": "x", "echo": True, "logprobs": 2}, "echo with logprobs"),
        ({"prompt": "x", "logprobs": True}, "logprobs True: must be an integer"),
        ({"prompt": "x", "messages": USER}, "unknown field 'messages'"),
        ({"prompt": "x", "suffix": "y"}, "unknown field 'suffix': insertion (suffix) is not supported"),
    ],
)
def test_bad_completions_fields(tokenizer: Any, demo_model_dir: Path, body: dict[str, Any], expected: str) -> None:
    req = one_request(tokenizer, job_spec(demo_model_dir), body, "/v1/completions")
    assert req.error is not None and expected in req.error, req.error


def test_chat_fields_reach_sampling_params(tokenizer: Any, demo_model_dir: Path) -> None:
    spec = job_spec(demo_model_dir, max_tokens=50, temperature=0.3, stop=("job",), logprobs=1)
    body = {
        "model": "org/tiny",  # the job's model by its last path component
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ],
        "max_tokens": 30, "max_completion_tokens": 12, "temperature": 1, "top_p": 0.9, "top_k": -1,
        "n": 3, "stop": "\n", "seed": 5, "logprobs": True, "top_logprobs": 4, "presence_penalty": 0.5,
        "frequency_penalty": -0.5, "repetition_penalty": 1.2, "min_p": 0.1, "min_tokens": 2,
        "logit_bias": {"7": -100, "3": 2.5}, "stop_token_ids": [4], "ignore_eos": True,
        "skip_special_tokens": False, "response_format": {"type": "text"}, "user": "u-1", "stream": False,
    }  # fmt: skip
    req = one_request(tokenizer, spec, body)
    assert req.error is None and req.endpoint == "chat"
    # developer is rendered as system; text parts joined with a newline
    assert req.prompt == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n"
    p = sampling_params(req)
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.n, p.stop, p.seed) == (12, 1.0, 0.9, 0, 3, ("\n",), 5)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.min_p, p.min_tokens) == (
        0.5, -0.5, 1.2, 0.1, 2
    )  # fmt: skip
    assert p.logit_bias == ((3, 2.5), (7, -100.0)) and p.logprobs == 4 and p.stop_token_ids == (4,)
    assert p.ignore_eos and not p.skip_special_tokens and not p.prompt_logprobs
    # absent fields take the job's flags; logprobs false turns the job's off
    q = sampling_params(one_request(tokenizer, spec, {"messages": USER, "logprobs": False}))
    assert (q.max_tokens, q.temperature, q.stop, q.logprobs, q.n) == (50, 0.3, ("job",), None, 1)
    assert sampling_params(one_request(tokenizer, spec, {"messages": USER})).logprobs == 1


def test_completions_and_embeddings_requests(tokenizer: Any, demo_model_dir: Path) -> None:
    spec = job_spec(demo_model_dir)
    req = one_request(tokenizer, spec, {"model": "tiny", "prompt": ["def f():"], "echo": True, "logprobs": 3},
               "/v1/completions")  # fmt: skip
    assert req.error is not None  # echo + logprobs
    req = one_request(tokenizer, spec, {"prompt": [5, 6, 7], "echo": True}, "/v1/completions")
    assert req.error is None and req.prompt == [5, 6, 7] and req.echo_text == tokenizer.decode([5, 6, 7])
    req = one_request(tokenizer, spec, {"prompt": "def f():", "logprobs": 0}, "/v1/completions")
    assert req.endpoint == "completions" and req.prompt == "def f():" and sampling_params(req).logprobs == 0

    emb = one_request(tokenizer, spec, {"model": "tiny", "input": ["some text"], "dimensions": 8,
                                 "encoding_format": "float", "user": "u"}, "/v1/embeddings")  # fmt: skip
    assert emb == RowRequest(
        row=0, id="r", prompt="some text", sampling=None, endpoint="embeddings", dimensions=8,
        encoding_format="float",
    )  # fmt: skip
    assert one_request(tokenizer, spec, {"input": [1, 2, 3]}, "/v1/embeddings").prompt == [1, 2, 3]
    for body, expected in [
        ({"input": ["a", "b"]}, "input: holds 2 inputs"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format 'int8': input should be 'float' or 'base64'"),
        ({"input": "a", "dimensions": 0}, "dimensions 0: must be >= 1"),
        ({"input": "a", "encoding_format": "base64"}, "encoding_format 'base64': base64 output is not supported yet"),
        ({"input": "a", "temperature": 1}, "unknown field 'temperature'"),
        ({"input": "a", "model": "other"}, "model 'other'"),
    ]:
        bad = one_request(tokenizer, spec, body, "/v1/embeddings")
        assert bad.endpoint == "embeddings" and bad.error is not None and expected in bad.error, bad.error


def test_parquet_sampling_columns_override_job_flags(tokenizer: Any, demo_model_dir: Path) -> None:
    table = pa.table(
        {
            "prompt": ["a", "b", "c", "d", "e"],
            "stop": [["x", "y"], None, None, None, None],
            "n": pa.array([2, None, 40, None, None], pa.int64()),
            "logprobs": [True, None, None, False, None],
            "top_logprobs": pa.array([3, None, None, 2, None], pa.int64()),
            "presence_penalty": [1.0, None, None, None, 9.0],
            "repetition_penalty": [1.3, None, None, None, None],
            "min_p": [0.2, None, None, None, None],
            "min_tokens": pa.array([1, None, None, None, None], pa.int64()),
            "logit_bias": pa.array([[(5, -1.0)], None, None, None, None], pa.map_(pa.int64(), pa.float64())),
        }
    )
    columns = tuple(c for c in table.column_names if c != "prompt")
    plan = InputPlan(format="parquet", files=(InputFile(url="in.parquet", rows=5, size=1),), rows=5,
                     prompt_column="prompt", prompt_kind="text", id_column=None, override_columns=columns)  # fmt: skip
    spec = job_spec(demo_model_dir, stop=("job",), n=2, logprobs=1, presence_penalty=-1.0, logit_bias={"9": 1})
    reqs = build_requests(table, list(range(5)), spec, plan, tokenizer, max_n=16)
    first, second = sampling_params(reqs[0]), sampling_params(reqs[1])
    assert (first.stop, first.n, first.logprobs, first.presence_penalty) == (("x", "y"), 2, 3, 1.0)
    assert (first.repetition_penalty, first.min_p, first.min_tokens, first.logit_bias) == (1.3, 0.2, 1, ((5, -1.0),))
    assert (second.stop, second.n, second.logprobs, second.presence_penalty) == (("job",), 2, 1, -1.0)
    assert second.logit_bias == ((9, 1.0),) and reqs[1].endpoint == "completions"
    assert reqs[2].error == "n 40: a row may ask for at most 16 choices (FREIGHT_MAX_N)"
    assert reqs[3].error == "top_logprobs 2: needs logprobs true (or null), not false"
    assert reqs[4].error == "presence_penalty 9.0: must be <= 2.0"


def test_jobs_planned_before_bodies_were_kept_still_build_and_resume(tokenizer: Any, demo_model_dir: Path) -> None:
    """An older JSONL manifest (prompt_kind messages, override columns) reads its file into the new
    columns; an older partial row (no endpoint column) reads back with the plan's endpoint."""
    from jobs.endpoints import default_endpoint
    from worker.shard_rows import ROW_COLUMN, result_row

    old = JSONL_PLAN.model_copy(
        update={"prompt_column": "messages", "prompt_kind": "messages", "override_columns": ("max_tokens",)}
    )
    line = {"custom_id": "a", "body": {"messages": USER, "max_tokens": 3}}
    table = read_batch("in.jsonl", (json.dumps(line) + "\n").encode()).table
    (req,) = build_requests(table, [0], job_spec(demo_model_dir), old, tokenizer, max_n=16)
    assert req.error is None and req.endpoint == "chat" and sampling_params(req).max_tokens == 3
    row = {ROW_COLUMN: 7, "id": "a", "completion": "x", "finish_reason": "stop", "prompt_tokens": 3,
           "cached_tokens": 0, "completion_tokens": 1, "error": None}  # fmt: skip
    res = result_row(row, default_endpoint(old))
    assert res.row == 7 and res.endpoint == "/v1/chat/completions" and res.completions is None


def test_a_served_model_name_is_the_only_model_a_body_may_name(tokenizer: Any, demo_model_dir: Path) -> None:
    """A job with a model_name (`freight serve --models`) takes that name or none; a path of the server,
    even the job's own checkpoint, is refused: requests name models, not the server's folders."""
    spec = job_spec(demo_model_dir).model_copy(update={"model_name": "tiny-chat"})
    assert one_request(tokenizer, spec, {"messages": USER, "model": "tiny-chat"}).error is None
    assert one_request(tokenizer, spec, {"messages": USER}).error is None
    for other in ("gpt-4o", str(demo_model_dir), "tiny"):
        req = one_request(tokenizer, spec, {"messages": USER, "model": other})
        assert req.error is not None and "this batch runs 'tiny-chat'" in req.error, req.error
    assert job_spec(demo_model_dir).job_id == job_spec(demo_model_dir).model_copy(update={"model_name": None}).job_id
    assert spec.job_id != job_spec(demo_model_dir).job_id


RESPONSES = "/v1/responses"
BAD_RESPONSE_BODIES = [
    ({}, "input: is required"),
    ({"input": ""}, "input: must not be empty"),
    ({"input": []}, "input: must be a string or a non-empty list"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role 'robot': must be one of"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]},
     "input[0].call_id 'c': no earlier function_call item has this call_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments: must be a string"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]},
     "input[0].arguments: must be a JSON object"),
    ({"input": [{"type": "custom_tool_call", "call_id": "c", "name": "f", "input": "x"}]},
     "input[0].type 'custom_tool_call': freight parses function tools' calls only"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type 'reasoning': reasoning items"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type 'input_image': only text input"),
    ({"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]},
     "input[0].content[0].type 'output_text': a part is input_text, or output_text in an assistant message"),
    ({"input": [{"role": "user", "content": "x", "tool_calls": []}]}, "input[0]: unknown field 'tool_calls'"),
    ({"input": "hi", "n": 2}, "n: a response is one output"),
    ({"input": "hi", "max_tokens": 5}, "max_tokens: a response is bounded by max_output_tokens"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens 0: must be >= 1"),
    ({"input": "hi", "temperature": "hot"}, "temperature 'hot': must be a number"),
    ({"input": "hi", "top_logprobs": 3}, 'top_logprobs 3: needs include: ["message.output_text.logprobs"]'),
    ({"input": "hi", "include": ["reasoning.encrypted_content"]}, "include[0] 'reasoning.encrypted_content'"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name: is required"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "json_schema": {}}}},
     "unknown field 'text.format.json_schema'"),
    ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format.type 'xml': must be text, json_object"),
    ({"input": "hi", "text": {"verbosity": "low"}}, "text.verbosity 'low'"),
    ({"input": "hi", "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata: holds 17 pairs, 16 at most"),
    ({"input": "hi", "metadata": {"k": 1}}, "metadata.k 1: must be a string"),
    ({"input": "hi", "store": True}, "store true: a batch keeps no responses"),
    ({"input": "hi", "background": True}, "background true"),
    ({"input": "hi", "stream": True}, "stream true: batch requests do not stream"),
    ({"input": "hi", "truncation": "auto"}, "truncation 'auto': freight drops no input"),
    ({"input": "hi", "previous_response_id": "resp_1"}, "unknown field 'previous_response_id': freight keeps no"),
    ({"input": "hi", "reasoning": {"effort": "low"}}, "unknown field 'reasoning': reasoning effort is a chat request's"),
    ({"input": "hi", "tools": []}, "tools: must be a non-empty list"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type 'web_search': freight runs no tools itself"),
    ({"input": "hi", "tools": [TOOL]}, "tools[0].function: a Responses tool gives name, description and parameters"),
    ({"input": "hi", "tools": [{"type": "function", "name": "f"}]}, "tools: this model's chat template renders no tools"),
    ({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {"type": "array"}}]},
     "tools[0].parameters.type 'array': a function's parameters are an object"),
    ({"input": "hi", "tools": [{"type": "function", "name": "f b"}]}, "tools[0].name 'f b': must be 1-64 letters"),
    ({"input": "hi", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}},
     "tool_choice.name 'g': no tool of that name in tools (f)"),
    ({"input": "hi", "tool_choice": "required"}, "tool_choice 'required': needs tools"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role 'tool': must be one of user, system, developer"),
    ({"input": "hi", "messages": USER}, "unknown field 'messages': /v1/responses takes no such field"),
    ({"input": "hi", "model": "gpt-5"}, "model 'gpt-5': this job runs 'tiny'"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "expected"), BAD_RESPONSE_BODIES, ids=[e[:30] for _, e in BAD_RESPONSE_BODIES])
def test_bad_responses_fields_are_row_errors_naming_the_field(
    tokenizer: Any, demo_model_dir: Path, body: dict[str, Any], expected: str
) -> None:
    req = one_request(tokenizer, job_spec(demo_model_dir), body, RESPONSES)
    assert req.prompt is None and req.error is not None and req.endpoint == "responses"
    assert expected in req.error, req.error


def test_responses_fields_reach_the_prompt_sampling_and_response(tokenizer: Any, demo_model_dir: Path) -> None:
    spec = job_spec(demo_model_dir, max_tokens=50, temperature=0.3, logprobs=1)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    body = {
        "model": "tiny", "instructions": "be brief",
        "input": [
            {"role": "developer", "content": "use JSON"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                            {"type": "input_text", "text": "b"}]},
            {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "c", "annotations": []}]},
            {"role": "user", "content": "d"},
        ],
        "max_output_tokens": 12, "temperature": 1, "top_p": 0.9, "seed": 5, "top_k": 4,
        "include": ["message.output_text.logprobs"], "top_logprobs": 3,
        "text": {"format": {"type": "json_schema", "name": "ab", "schema": schema, "strict": True}},
        "metadata": {"run": "7"}, "user": "u-1", "safety_identifier": "s", "prompt_cache_key": "k",
        "store": False, "background": False, "stream": False, "truncation": "disabled",
    }  # fmt: skip
    req = one_request(tokenizer, spec, body, RESPONSES)
    assert req.error is None and req.endpoint == "responses"
    assert req.prompt == tokenizer.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "system", "content": "use JSON"},
         {"role": "user", "content": "a\nb"}, {"role": "assistant", "content": "c"}, {"role": "user", "content": "d"}],
        add_generation_prompt=True,
    )  # fmt: skip
    p = sampling_params(req)
    assert (p.max_tokens, p.temperature, p.top_p, p.seed, p.top_k, p.logprobs, p.n) == (12, 1.0, 0.9, 5, 4, 3, 1)
    assert p.constraint is not None and p.constraint.kind == "json_schema" and json.loads(p.constraint.spec) == schema
    assert json.loads(req.response_fields or "") == {
        "instructions": "be brief", "metadata": {"run": "7"}, "user": "u-1", "safety_identifier": "s",
        "prompt_cache_key": "k", "max_output_tokens": 12, "temperature": 1.0, "top_p": 0.9, "top_logprobs": 3,
        "text": {"format": {"type": "json_schema", "name": "ab", "schema": schema, "strict": True}},
    }  # fmt: skip
    # a string input is one user message; absent fields run with the job's flags, and say so
    plain = one_request(tokenizer, spec, {"input": "hello"}, RESPONSES)
    assert plain.prompt == tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True)
    q = sampling_params(plain)
    assert (q.max_tokens, q.temperature, q.logprobs, q.constraint) == (50, 0.3, 1, None)
    assert json.loads(plain.response_fields or "") == {
        "max_output_tokens": 50, "temperature": 0.3, "top_p": 1.0, "top_logprobs": 1, "text": {"format": {"type": "text"}},
    }  # fmt: skip
    # include alone: the sampled token's logprob only; a text format of type text: no constraint, the job's off
    json_job = job_spec(demo_model_dir, json_schema=json.dumps(schema))
    only = one_request(tokenizer, json_job, {"input": "x", "include": ["message.output_text.logprobs"],
                                             "text": {"format": {"type": "text"}}}, RESPONSES)  # fmt: skip
    assert sampling_params(only).logprobs == 0 and sampling_params(only).constraint is None
    job_json = one_request(tokenizer, json_job, {"input": "x"}, RESPONSES)
    assert sampling_params(job_json).constraint is not None
    assert json.loads(job_json.response_fields or "")["text"] == {
        "format": {"type": "json_schema", "name": "job_schema", "schema": schema}
    }
