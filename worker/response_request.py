"""A checked /v1/responses body (worker/request_body.py ResponseBody) against the job: the messages it
renders, its log-probabilities, its structured output, and the request fields its response object
repeats (jobs/openai_response.py builds that object from them and the row's result).

- messages: `instructions` as a system message, then `input`'s messages.
- logprobs: `include: ["message.output_text.logprobs"]` asks for them, `top_logprobs` (0-20) for
  that many alternatives per token (it needs the include: alone it would be dropped); neither:
  the job's --logprobs.
- structured output: `text.format` (contracts/row_constraint.py text_format); `text.verbosity`, a
  hint to OpenAI's models, is refused.
- repeated fields (`response_fields`, the result column of the same name): instructions, metadata,
  user, safety_identifier, prompt_cache_key, text and tools as given (tool_choice and
  parallel_tool_calls as they ran); max_output_tokens, temperature, top_p
  and top_logprobs as the request ran (the job's value where the body gives none).
"""

from __future__ import annotations

import json
from typing import Any

from contracts.row_constraint import TEXT, RowConstraint, text_format
from contracts.sampling import SamplingParams
from worker.request_body import LOGPROBS_INCLUDE, ResponseBody
from worker.response_tools import response_tool_choice, response_tools
from worker.tool_request import ToolRequest

_TEXT_FIELDS = ("format", "verbosity")
JOB_SCHEMA_NAME = "job_schema"  # the name of a job's --json-schema in a response's text.format


def response_messages_of(body: ResponseBody) -> list[dict[str, str]]:
    """The chat messages the request renders: its instructions, then its input."""
    system = [] if body.instructions is None else [{"role": "system", "content": body.instructions}]
    return [*system, *body.input]


def response_logprobs(body: ResponseBody, job: int | None) -> int | None:
    """The top count of log-probabilities the request asks for (None: none; `job`: the job's)."""
    included = LOGPROBS_INCLUDE in (body.include or ())
    if body.top_logprobs is not None and not included:
        raise ValueError(f'top_logprobs {body.top_logprobs}: needs include: ["{LOGPROBS_INCLUDE}"]')
    if included:
        return body.top_logprobs or 0
    return job


def response_constraint(text: Any) -> RowConstraint:
    """The structured output `text` asks for: its format's constraint, TEXT for format text, None
    when it gives no format (the job's constraint applies)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise ValueError('text: must be a JSON object, e.g. {"format": {"type": "json_object"}}')
    extra = sorted(set(text) - set(_TEXT_FIELDS))
    if extra:
        raise ValueError(f"unknown field 'text.{extra[0]}': text takes format")
    if text.get("verbosity") is not None:
        raise ValueError(f"text.verbosity {text['verbosity']!r}: verbosity is a hint to OpenAI's models that "
                         "freight cannot follow (drop the field)")  # fmt: skip
    if text.get("format") is None:
        return None
    return text_format(text["format"], "text.format")


def response_fields(body: ResponseBody, sampling: SamplingParams, tools: ToolRequest | None = None) -> str:
    """The fields the response object repeats, as compact JSON (the row's `response_fields`);
    `tools`: the body's, checked."""
    fields = {
        "tools": response_tools(body.tools) if tools is not None else None,
        "tool_choice": response_tool_choice(tools) if tools is not None else None,
        "parallel_tool_calls": tools.parallel if tools is not None else None,
        "instructions": body.instructions,
        "metadata": body.metadata,
        "user": body.user,
        "safety_identifier": body.safety_identifier,
        "prompt_cache_key": body.prompt_cache_key,
        "text": {"format": _format_of(body, sampling)},
        "max_output_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_logprobs": sampling.logprobs,
    }
    return json.dumps({k: v for k, v in fields.items() if v is not None}, ensure_ascii=False, separators=(",", ":"))


def _format_of(body: ResponseBody, sampling: SamplingParams) -> dict[str, Any]:
    """`text.format` as the request ran: the body's, else the job's constraint (--json-schema as a
    json_schema format named JOB_SCHEMA_NAME, --json-object as json_object; a regex, choice or
    grammar, which the Responses API cannot name, as text), else text."""
    if body.text is not None and body.text.get("format") is not None:
        return dict(body.text["format"])
    constraint = sampling.constraint
    if constraint is not None and constraint.kind == "json_schema":
        return {"type": "json_schema", "name": JOB_SCHEMA_NAME, "schema": json.loads(constraint.spec or "{}")}
    if constraint is not None and constraint.kind == "json_object":
        return {"type": "json_object"}
    return {"type": TEXT}
