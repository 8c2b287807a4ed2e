"""A shard's input rows -> engine requests (prompt + per-row sampling), or a row error.

Parquet rows: the prompt column (text or chat messages) and the per-row columns the job planned to
read (jobs/row_columns.py override_columns: jobs/datasets.py SAMPLING_COLUMNS, and
CONSTRAINT_COLUMNS with --row-constraints; constraints: contracts/row_constraint.py). OpenAI-Batch rows:
each line's body, checked field by field for its url's endpoint (worker/request_body.py). Either way a value wins over the job's flag, and a bad
row (null prompt, bad value, unknown field, unrenderable messages) is that row's error, never the
shard's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import pyarrow as pa

from contracts.constraint import Constraint
from contracts.json_text import parse_json_text
from contracts.reasoning import ReasoningFormat
from contracts.row_constraint import RowConstraint, body_constraint, column_constraint
from contracts.sampling import SamplingParams
from jobs.endpoints import ENDPOINT_OF_URL
from jobs.errors import InputError
from jobs.manifest import InputPlan
from jobs.row_columns import ADAPTER_COLUMN
from jobs.settings import get_settings
from jobs.spec import JobSpec
from worker.chat_messages import chat_messages
from worker.chat_render import render_chat, template_kwargs, tool_format
from worker.request_body import (
    ChatBody,
    CompletionBody,
    EmbeddingBody,
    ResponseBody,
    parse_body,
    parse_columns,
)
from worker.response_request import (
    response_constraint,
    response_fields,
    response_logprobs,
    response_messages_of,
)
from worker.response_tools import response_tool_request
from worker.row_sampling import column_logprobs, resolve_sampling
from worker.row_tools import column_tool_choice, column_tools
from worker.tool_formats import forced_calls
from worker.tool_request import ToolRequest, tool_request


@dataclass(frozen=True)
class RowRequest:
    """One input row. Exactly one of `prompt` / `error` is set (token ids: a completions request given
    ids, or likelihood scoring); `sampling` is None for embeddings and errors."""

    row: int  # global row number
    id: str | int  # the input's id (its type kept: InputPlan.id_type), or the row number as a string
    prompt: str | list[int] | None
    sampling: SamplingParams | None
    continuation_tokens: int = 0  # likelihood mode: the last n prompt tokens are the continuation
    error: str | None = None
    endpoint: str = "completions"  # chat | completions | embeddings | responses
    dimensions: int | None = None  # embeddings: keep the first `dimensions` values
    encoding_format: str = "float"  # embeddings: float | base64 (the output's encoding)
    echo_text: str | None = None  # completions with echo: the prompt's text, put before each choice
    tools: ToolRequest | None = None  # chat with tools (tool_choice not none): the answer's calls are parsed
    tool_format: str | None = None  # how the model writes them (worker/tool_formats.py)
    seeded: bool = False  # the row gave its own seed (a column or body field), not the job's derived one
    response_fields: str | None = None  # responses: what the response object repeats (JSON; response_request.py)
    adapter: str | None = None  # the LoRA adapter it runs (a --lora name), None: the model itself


def build_requests(
    table: pa.Table,
    rows: list[int],
    spec: JobSpec,
    plan: InputPlan,
    tokenizer: Any,
    max_n: int | None = None,
) -> list[RowRequest]:
    """`table` holds the shard's rows in order (row i of the table is global row `rows[i]`).
    `max_n`: choices a row may ask for (default: Settings.max_n)."""
    limit = get_settings().max_n if max_n is None else max_n
    if plan.format == "jsonl":
        return _batch_requests(table, rows, spec, tokenizer, limit)
    prompts = table.column(plan.prompt_column).to_pylist()
    ids = table.column(plan.id_column).to_pylist() if plan.id_column else [str(r) for r in rows]
    conts = table.column(plan.continuation_column).to_pylist() if plan.continuation_column else None
    overrides = {c: table.column(c).to_pylist() for c in plan.override_columns}
    adapters = overrides.pop(ADAPTER_COLUMN, None)  # planned only for a job with --lora adapters
    endpoint = "chat" if plan.prompt_kind == "messages" else "completions"
    out: list[RowRequest] = []
    for i, row in enumerate(rows):
        row_id = _row_id(ids[i], row)
        try:
            if adapters is not None:
                _row_adapter(adapters[i], spec)
            columns = parse_columns({c: v[i] for c, v in overrides.items() if v[i] is not None})
            logprobs = column_logprobs(columns.logprobs, columns.top_logprobs, spec.sampling.logprobs)
            constraint = column_constraint(columns.constraint_fields())
            if plan.prompt_kind == "messages" and conts is None:
                variables = template_kwargs(tokenizer, spec.sampling.reasoning_effort, spec.sampling.thinking,
                                            columns.reasoning_effort, _column_kwargs(columns.chat_template_kwargs))  # fmt: skip
                tools = tool_request(column_tools(columns.tools), column_tool_choice(columns.tool_choice),
                                     columns.parallel_tool_calls)  # fmt: skip
                fmt = tool_format(tokenizer, tools)
                text = render_chat(_messages(prompts[i]), tokenizer, tools, variables)
                given = next(iter(columns.constraint_fields()), None)
                constraint, reasoning = _forced_calls(tools, fmt, constraint, given, tokenizer)
                sampling = resolve_sampling(spec, row_id, columns, columns.max_tokens, logprobs, tokenizer, limit,
                                            constraint, reasoning)  # fmt: skip
                parsed = tools if tools is not None and tools.choice != "none" else None
                out.append(RowRequest(row=row, id=row_id, prompt=text, sampling=sampling, endpoint=endpoint,
                                      tools=parsed, tool_format=fmt if parsed is not None else None,
                                      seeded=columns.seed is not None))  # fmt: skip
                continue
            chat_only = ("reasoning_effort", "chat_template_kwargs", "tools", "tool_choice", "parallel_tool_calls")
            field = next((f for f in chat_only if getattr(columns, f) is not None), None)
            if field is not None:
                raise ValueError(f"{field}: a chat template's input, and this row's prompt is text, not messages")
            sampling = resolve_sampling(
                spec, row_id, columns, columns.max_tokens, logprobs, tokenizer, limit, constraint
            )
            text = _prompt_text(prompts[i], plan.prompt_kind, tokenizer)
            if conts is None:
                out.append(RowRequest(row=row, id=row_id, prompt=text, sampling=sampling, endpoint=endpoint,
                                      seeded=columns.seed is not None))  # fmt: skip
                continue
            if isinstance(constraint, Constraint):
                raise ValueError(
                    f"{', '.join(columns.constraint_fields())}: likelihood scoring scores the continuation, "
                    "it generates nothing to constrain (leave the cell null)"
                )
            cont = conts[i]
            if not isinstance(cont, str) or not cont:
                raise ValueError("empty continuation: likelihood scoring needs text to score")
            cont_ids = list(tokenizer.encode(cont, add_special_tokens=False))  # no BOS mid-sequence
            ids_all = list(tokenizer.encode(text)) + cont_ids
            greedy = SamplingParams(max_tokens=1, prompt_logprobs=True)  # no draw: no seed
            out.append(
                RowRequest(
                    row=row,
                    id=row_id,
                    prompt=ids_all,
                    sampling=greedy,
                    continuation_tokens=len(cont_ids),
                    endpoint=endpoint,
                )
            )
        except ROW_ERRORS as exc:
            out.append(_error(row, row_id, row_error(exc), endpoint))
    if adapters is not None:  # one request per row, in order; a row naming no adapter of the job is an error
        out = [r if r.error is not None or a is None else dataclasses.replace(r, adapter=a)
               for r, a in zip(out, adapters, strict=True)]  # fmt: skip
    if spec.task == "embed":  # a `--task embed` job: every row (built with the same prompt checks) embeds
        return [dataclasses.replace(r, endpoint="embeddings", dimensions=spec.dimensions, sampling=None) for r in out]
    return out


def _batch_requests(
    table: pa.Table, rows: list[int], spec: JobSpec, tokenizer: Any, max_n: int
) -> list[RowRequest]:
    """OpenAI-Batch rows (jobs/batch_input.py's columns; a JSONL job planned before bodies were kept
    reads its file into the same columns, so it resumes here too)."""
    ids = table.column("custom_id").to_pylist()
    urls = table.column("url").to_pylist()
    bodies = table.column("body").to_pylist()
    line_errors = table.column("line_error").to_pylist()
    out: list[RowRequest] = []
    for i, row in enumerate(rows):
        row_id = _row_id(ids[i], row)
        endpoint = ENDPOINT_OF_URL[urls[i]]
        try:
            if line_errors[i] is not None:
                raise ValueError(line_errors[i])
            out.append(_batch_request(row, row_id, endpoint, bodies[i], spec, tokenizer, max_n))
        except ROW_ERRORS as exc:
            out.append(_error(row, row_id, row_error(exc), endpoint))
    return out


def _batch_request(
    row: int, row_id: str | int, endpoint: Any, body_text: str, spec: JobSpec, tokenizer: Any, max_n: int
) -> RowRequest:
    body = parse_body(endpoint, body_text).body
    adapter = _check_model(body.model, spec)
    if adapter is not None and isinstance(body, EmbeddingBody):
        raise ValueError(f"model {adapter!r} is a LoRA adapter; embeddings run the model itself (name it)")
    request = _body_request(row, row_id, endpoint, body, spec, tokenizer, max_n)
    return request if adapter is None else dataclasses.replace(request, adapter=adapter)


def _body_request(row: int, row_id: str | int, endpoint: Any, body: Any, spec: JobSpec, tokenizer: Any,
                  max_n: int) -> RowRequest:  # fmt: skip
    if isinstance(body, EmbeddingBody):
        prompt = list(body.input) if isinstance(body.input, tuple) else body.input
        return RowRequest(
            row=row,
            id=row_id,
            prompt=prompt,
            sampling=None,
            endpoint="embeddings",
            dimensions=body.dimensions,
            encoding_format=body.encoding_format or "float",
        )
    if isinstance(body, ResponseBody):
        return _response_request(row, row_id, body, spec, tokenizer, max_n)
    if body.stream:
        raise ValueError("stream true: batch requests do not stream (drop the field)")
    constraint = body_constraint(body.constraint_fields())
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if isinstance(body, ChatBody):
        return _chat_request(row, row_id, body, constraint, max_tokens, spec, tokenizer, max_n)
    assert isinstance(body, CompletionBody)
    echo_text = None
    logprobs = spec.sampling.logprobs if body.logprobs is None else body.logprobs
    prompt = list(body.prompt) if isinstance(body.prompt, tuple) else body.prompt
    if body.echo:
        if body.logprobs is not None:
            raise ValueError("echo with logprobs: prompt log-probabilities are not supported (drop one)")
        echo_text = body.prompt if isinstance(body.prompt, str) else tokenizer.decode(list(body.prompt))
    sampling = resolve_sampling(spec, row_id, body, max_tokens, logprobs, tokenizer, max_n, constraint)
    return RowRequest(
        row=row, id=row_id, prompt=prompt, sampling=sampling, endpoint=endpoint, echo_text=echo_text
    )


def _chat_request(row: int, row_id: str | int, body: ChatBody, constraint: RowConstraint, max_tokens: int | None,
                  spec: JobSpec, tokenizer: Any, max_n: int) -> RowRequest:  # fmt: skip
    """A chat body: its messages, tools and template variables rendered; a forced tool call is the
    row's constraint (after any thinking; over the job's), and the answer's calls are parsed when
    it has tools (tool_choice not none)."""
    if body.top_logprobs is not None and not body.logprobs:
        raise ValueError(f"top_logprobs {body.top_logprobs}: needs logprobs: true")
    if body.logprobs is None:
        logprobs = spec.sampling.logprobs
    else:
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
    tools = tool_request(body.tools, body.tool_choice, body.parallel_tool_calls)
    fmt = tool_format(tokenizer, tools)
    variables = template_kwargs(tokenizer, spec.sampling.reasoning_effort, spec.sampling.thinking,
                                body.reasoning_effort, body.chat_template_kwargs)  # fmt: skip
    prompt = render_chat(body.messages, tokenizer, tools, variables)
    constraint, reasoning = _forced_calls(tools, fmt, constraint, next(iter(body.constraint_fields()), None),
                                          tokenizer)  # fmt: skip
    sampling = resolve_sampling(spec, row_id, body, max_tokens, logprobs, tokenizer, max_n, constraint, reasoning)
    parsed = tools if tools is not None and tools.choice != "none" else None
    return RowRequest(row=row, id=row_id, prompt=prompt, sampling=sampling, endpoint="chat", tools=parsed,
                      tool_format=fmt if parsed is not None else None)  # fmt: skip


def _response_request(
    row: int, row_id: str | int, body: ResponseBody, spec: JobSpec, tokenizer: Any, max_n: int
) -> RowRequest:
    """A /v1/responses body: its messages and function tools rendered with the job's template variables
    (--no-thinking, --reasoning-effort); a thinking model's reasoning is split from its answer, and
    its calls parsed, as a chat row's are."""
    constraint = response_constraint(body.text)
    logprobs = response_logprobs(body, spec.sampling.logprobs)
    tools = response_tool_request(body.tools, body.tool_choice, body.parallel_tool_calls)
    fmt = tool_format(tokenizer, tools)
    variables = template_kwargs(tokenizer, spec.sampling.reasoning_effort, spec.sampling.thinking, None, None)
    prompt = render_chat(response_messages_of(body), tokenizer, tools, variables)
    constraint, reasoning = _forced_calls(tools, fmt, constraint, "text.format", tokenizer)
    sampling = resolve_sampling(spec, row_id, body, body.max_output_tokens, logprobs, tokenizer, max_n, constraint,
                                reasoning)  # fmt: skip
    parsed = tools if tools is not None and tools.choice != "none" else None
    return RowRequest(row=row, id=row_id, prompt=prompt, sampling=sampling, endpoint="responses", tools=parsed,
                      tool_format=fmt if parsed is not None else None,
                      response_fields=response_fields(body, sampling, tools))  # fmt: skip


def _forced_calls(tools: ToolRequest | None, fmt: str | None, constraint: RowConstraint, given: str | None,
                  tokenizer: Any) -> tuple[RowConstraint, ReasoningFormat | None]:  # fmt: skip
    """(the row's constraint, its reasoning format): a forced tool call (tool_choice required or
    named) is the constraint, after any thinking; `given` names the request's own structured-output
    field, which a forced call refuses (None: it gave none)."""
    reasoning = tokenizer.reasoning
    if tools is None or not tools.forced:
        return constraint, reasoning
    if isinstance(constraint, Constraint):
        raise ValueError(f"{given} and tool_choice {tools.choice}: both constrain the output (a forced tool call "
                         "is held to its parameters schema); give one")  # fmt: skip
    assert fmt is not None  # tool_format refused a template without one
    several = tools.parallel and tools.choice == "required"  # a named tool is called once
    forced = forced_calls(fmt, [(t.name, t.parameters) for t in tools.forced], several, tokenizer.vocab())
    if reasoning is not None and reasoning.family == "harmony":
        reasoning = ReasoningFormat("harmony", answer_channel="commentary")  # the call writes its own header
    return forced, reasoning


def _check_model(asked: str | None, spec: JobSpec) -> str | None:
    """The LoRA adapter a body's `model` names (one of the job's --lora names, as vLLM serves
    adapters), or None for the job's model: its served name when the job has one (`freight serve
    --models`: nothing else, so a request names no path of the server), else its path or URL, or the
    same last path component ("Qwen/Qwen3-0.6B" names /models/Qwen3-0.6B), compared without case.
    Absent: the job's model. ValueError for any other name."""
    if asked is not None and asked in spec.adapters:
        return asked
    adapters = f" or its adapters {', '.join(sorted(spec.adapters))}" if spec.loras else ""
    if spec.model_name is not None:
        if asked is not None and asked != spec.model_name:
            raise ValueError(
                f"model {asked!r}: this batch runs {spec.model_name!r}{adapters}, and a batch runs one model "
                "(name it, or leave model out; send other models' requests in batches of their own)"
            )
        return None
    job_model = spec.model
    if asked is None or asked == job_model:
        return None
    mine = PurePosixPath(job_model.rstrip("/")).name
    if PurePosixPath(asked.rstrip("/")).name.lower() != mine.lower():
        raise ValueError(f"model {asked!r}: this job runs {mine!r}{adapters} (name it, or leave model out)")
    return None


def _row_adapter(value: Any, spec: JobSpec) -> str | None:
    """A Parquet row's `adapter` cell: one of the job's --lora names, or null for the model itself."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in spec.adapters:
        raise ValueError(f"adapter {value!r}: this job's adapters are {', '.join(sorted(spec.adapters))} (its --lora "
                         "names); leave the cell null to run the model itself")  # fmt: skip
    return value


# What a row's own input can raise on its way to a request (a bad value, a value of the wrong type, a
# structure nested past Python's stack, a number past float range): that row's error, never the
# shard's. Anything else is a fault of freight or the machine, and fails the attempt.
ROW_ERRORS = (ValueError, TypeError, RecursionError, OverflowError)
MAX_ERROR_CHARS = 1000


def row_error(exc: BaseException) -> str:
    """A row's error message: one line, at most MAX_ERROR_CHARS characters."""
    if isinstance(exc, RecursionError):
        return "the request nests too deeply to process (objects and arrays inside each other); flatten it"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def _error(row: int, row_id: str | int, error: str, endpoint: str) -> RowRequest:
    return RowRequest(row=row, id=row_id, prompt=None, sampling=None, error=error, endpoint=endpoint)


def _row_id(value: Any, row: int) -> str | int:
    """The row's id as the results carry it: a string, or an int for integer id columns."""
    if value is None:  # the planner refused null ids, so the input changed under the job
        raise InputError(f"row {row} has a null id, which the input did not have when the job was planned")
    if isinstance(value, int | str) and not isinstance(value, bool):
        return value
    return str(value)


def _prompt_text(value: Any, kind: str, tokenizer: Any) -> str:
    if kind == "text":
        if value is None:
            raise ValueError("null prompt")
        if not isinstance(value, str):
            raise ValueError(f"prompt is {type(value).__name__}, not text")
        if not value.strip():
            raise ValueError("empty prompt")
        return value
    return render_chat(_messages(value), tokenizer, None, {})


def _messages(value: Any) -> list[dict[str, Any]]:
    """A Parquet messages cell (a list of structs, or its JSON text), checked."""
    return chat_messages(parse_json_text(value, "messages", "expected a list of {role, content}"))


def _column_kwargs(value: Any) -> dict[str, Any] | None:
    """A chat_template_kwargs cell: JSON text of an object, or a struct (its null members dropped)."""
    if value is None:
        return None
    value = parse_json_text(value, "chat_template_kwargs", 'e.g. {"enable_thinking": false}')
    if not isinstance(value, dict):
        raise ValueError('chat_template_kwargs: must be a JSON object, e.g. {"enable_thinking": false}')
    return {k: v for k, v in value.items() if v is not None}
