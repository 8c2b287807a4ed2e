"""One /v1/responses result row -> the `response` object OpenAI's Responses API answers with.

This module is the one place a response body is built (jobs/openai_output.py calls `response_body`
for each /v1/responses row that ran). Its parts:

- `output`: the output items, in order: a thinking model's `reasoning` item; one assistant `message`
  whose content is one `output_text` (the row's answer, its `logprobs` when the request included
  them, in the chat shape of jobs/openai_bodies.py without `refusal`), left out when the answer is
  only tool calls; then a `function_call` item per parsed call (`call_id` the call's id, `name`,
  `arguments` as JSON text, id fc_ beside the message's msg_).
- `status`: "completed" when the row finished with "stop" (an end token, a stop string, a completed
  structured output) or "tool_calls"; "incomplete" with `incomplete_details.reason`
  "max_output_tokens" when it ran out of tokens ("length"). The items' status says the same.
- the request's fields as it ran (the row's `response_fields`, worker/response_request.py):
  instructions, metadata, max_output_tokens, temperature, top_p, top_logprobs, text.format, user,
  safety_identifier, prompt_cache_key, and its function `tools`, `tool_choice` and
  `parallel_tool_calls` (without tools: none, "none" and false); `truncation` is "disabled" (a
  prompt past the context is the row's error).
- `usage`: input tokens (cached ones among them), output tokens (a thinking model's reasoning
  tokens among them, as the row's `reasoning_tokens` counts them), their total. Writing the prefix
  cache costs nothing beyond the prompt's tokens, so no input token counts as a cache write.

The tests parse every body with the `openai` package's `Response` type; this module never imports it.
"""

from __future__ import annotations

import json
from typing import Any

from jobs.openai_bodies import chat_logprobs


def response_body(row: dict[str, Any], response_id: str, message_id: str, created: int, model: str) -> dict[str, Any]:
    """The `response` object of a /v1/responses row that did not fail (n is 1: a response has one output)."""
    text = row.get("response_fields")
    if text is None:
        raise ValueError(f"row {row['id']!r} is a /v1/responses request without its response_fields")
    fields = json.loads(text)
    complete = row["finish_reason"] in ("stop", "tool_calls")
    status = "completed" if complete else "incomplete"
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "completed_at": created if complete else None,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None if complete else {"reason": "max_output_tokens"},
        "instructions": fields.get("instructions"),
        "max_output_tokens": fields.get("max_output_tokens"),
        "model": model,
        "output": output_items(row, message_id, status),
        "parallel_tool_calls": fields.get("parallel_tool_calls", False),
        "previous_response_id": None,
        "temperature": fields.get("temperature"),
        "text": fields.get("text", {"format": {"type": "text"}}),
        "tool_choice": fields.get("tool_choice", "none"),
        "tools": fields.get("tools", []),
        "top_logprobs": fields.get("top_logprobs"),
        "top_p": fields.get("top_p"),
        "truncation": "disabled",
        "usage": response_usage(row),
        "user": fields.get("user"),
        "safety_identifier": fields.get("safety_identifier"),
        "prompt_cache_key": fields.get("prompt_cache_key"),
        "metadata": fields.get("metadata") or {},
    }


def output_items(row: dict[str, Any], message_id: str, status: str) -> list[dict[str, Any]]:
    """The response's output items, in order: a thinking model's reasoning item (its thinking as
    reasoning_text, id rs_ beside the message's msg_), the assistant message (unless the answer is
    only tool calls), then its function calls (ids fc_<n>_ beside msg_)."""
    items: list[dict[str, Any]] = []
    stem = message_id.removeprefix("msg_")
    reasoning = row.get("reasoning")
    if reasoning:
        items.append({"type": "reasoning", "id": "rs_" + stem, "status": status, "summary": [],
                      "content": [{"type": "reasoning_text", "text": reasoning}]})  # fmt: skip
    calls = row.get("tool_calls") or []
    text = row["completion"] or ""
    if text or not calls:
        content: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
        logprobs = row.get("logprobs")
        if logprobs is not None:
            content["logprobs"] = chat_logprobs(logprobs[0])["content"]
        items.append({"type": "message", "id": message_id, "status": status, "role": "assistant", "content": [content]})
    items += [{"type": "function_call", "id": f"fc_{k}_{stem}", "call_id": c["id"], "name": c["name"],
               "arguments": c["arguments"], "status": status} for k, c in enumerate(calls)]  # fmt: skip
    return items


def response_usage(row: dict[str, Any]) -> dict[str, Any]:
    """The Responses API's usage of a row."""
    prompt, completion = int(row["prompt_tokens"]), int(row["completion_tokens"])
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": int(row["cached_tokens"]), "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": int(row.get("reasoning_tokens") or 0)},
        "total_tokens": prompt + completion,
    }


__all__ = ["output_items", "response_body", "response_usage"]
