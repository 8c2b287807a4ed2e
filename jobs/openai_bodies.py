"""One result row -> the response body OpenAI's API would have answered for it.

Shapes follow OpenAI's API reference (and `vllm run-batch`): `chat.completion` for
/v1/chat/completions, `text_completion` for /v1/completions, an embedding `list` for
/v1/embeddings. The row is a dict of the result columns (docs/ARCHITECTURE.md, "Result schema");
columns a job written before them lacks read as null. The tests parse every body with the `openai`
package's types; this module never imports it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jobs.endpoints import CHAT_URL


def choices_of(row: dict[str, Any]) -> list[tuple[str, str]]:
    """(text, finish_reason) per choice, index order: the list columns when the row asked n > 1, else
    the row's single completion."""
    texts, reasons = row.get("completions"), row.get("finish_reasons")
    if texts is None:
        return [(row["completion"] or "", row["finish_reason"])]
    if reasons is None or len(reasons) != len(texts):
        raise ValueError(f"row {row['id']!r}: {len(texts)} completions but finish_reasons {reasons!r}")
    return list(zip(texts, reasons, strict=True))


def _token_bytes(token: str) -> list[int]:
    return list(token.encode("utf-8"))


def _f32(value: float) -> float:
    """A float32 logprob as the shortest decimal that reads back to it (-1.2064002, not
    -1.2064001560211182); -inf (a token ruled out) as -9999.0, as OpenAI and vLLM write it (JSON has no
    infinity)."""
    return max(float(str(np.float32(value))), -9999.0)


def chat_logprobs(tokens: list[dict[str, Any]]) -> dict[str, Any]:
    """A choice's `logprobs` in the chat shape: `content` = one entry per generated token, each with
    its `top_logprobs` (the asked top count, most likely first)."""
    return {
        "content": [
            {
                "token": t["token"],
                "logprob": _f32(t["logprob"]),
                "bytes": _token_bytes(t["token"]),
                "top_logprobs": [
                    {"token": top["token"], "logprob": _f32(top["logprob"]), "bytes": _token_bytes(top["token"])}
                    for top in t["top_logprobs"] or []
                ],
            }
            for t in tokens
        ],
        "refusal": None,
    }


def completion_logprobs(tokens: list[dict[str, Any]]) -> dict[str, Any]:
    """A choice's `logprobs` in the legacy completions shape: parallel lists; `top_logprobs[i]` maps
    token text -> logprob for the top tokens plus the sampled one (OpenAI: "up to logprobs + 1
    elements"); `text_offset[i]` = characters of the text before token i (sum of the decoded token
    lengths, which equals the text's offsets when every token decodes to whole characters)."""
    offsets, at = [], 0
    tops: list[dict[str, float]] = []
    for t in tokens:
        offsets.append(at)
        at += len(t["token"])
        top = {x["token"]: _f32(x["logprob"]) for x in t["top_logprobs"] or []}
        top.setdefault(t["token"], _f32(t["logprob"]))
        tops.append(top)
    return {
        "tokens": [t["token"] for t in tokens],
        "token_logprobs": [_f32(t["logprob"]) for t in tokens],
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def usage(row: dict[str, Any]) -> dict[str, Any]:
    """Token counts as OpenAI bills them: completion_tokens counts every choice, the thinking of a row
    that can think included (`completion_tokens_details.reasoning_tokens` says how much of it)."""
    prompt, completion = int(row["prompt_tokens"]), int(row["completion_tokens"])
    out = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": int(row["cached_tokens"])},
    }
    if row.get("reasoning_tokens") is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": int(row["reasoning_tokens"])}
    return out


def chat_message(row: dict[str, Any], index: int, text: str) -> dict[str, Any]:
    """Choice `index`'s assistant message: its content, and its reasoning (`reasoning_content`, as vLLM
    names it) and tool calls when the row has them (content null when the calls are all it says)."""
    several = row.get("completions") is not None
    reasoning = (row.get("reasoning_choices") or [None] * (index + 1))[index] if several else row.get("reasoning")
    calls = (row.get("tool_calls_choices") or [None] * (index + 1))[index] if several else row.get("tool_calls")
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if calls:
        message["content"] = text or None
        message["tool_calls"] = [{"id": c["id"], "type": c["type"], "function": {"name": c["name"],
                                  "arguments": c["arguments"]}} for c in calls]  # fmt: skip
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def generation_body(
    row: dict[str, Any], endpoint: str, body_id: str, created: int, model: str
) -> dict[str, Any]:
    """A `chat.completion` or `text_completion` object for a row that did not fail."""
    chat = endpoint == CHAT_URL
    logprobs = row.get("logprobs")
    choices = choices_of(row)
    if logprobs is not None and len(logprobs) != len(choices):
        raise ValueError(f"row {row['id']!r}: logprobs for {len(logprobs)} of {len(choices)} choices")
    out: list[dict[str, Any]] = []
    for index, (text, reason) in enumerate(choices):
        lp = None
        if logprobs is not None:
            lp = chat_logprobs(logprobs[index]) if chat else completion_logprobs(logprobs[index])
        if chat:
            message = chat_message(row, index, text)
            out.append({"index": index, "message": message, "finish_reason": reason, "logprobs": lp})
        else:
            out.append({"index": index, "text": text, "finish_reason": reason, "logprobs": lp})
    return {
        "id": body_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": out,
        "usage": usage(row),
    }


def embedding_body(row: dict[str, Any], model: str) -> dict[str, Any]:
    """An embedding `list` object (one input per row); usage counts the input tokens only."""
    vector = row.get("embedding")
    if vector is None:
        raise ValueError(f"row {row['id']!r} is an embeddings request without an embedding")
    prompt = int(row["prompt_tokens"])
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": float32_list(vector)}],
        "model": model,
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
    }


def float32_list(values: Any) -> list[float]:
    """float32 values as the shortest decimals that read back to the same float32 (JSON stays about
    half the size of float64 reprs; `np.float32(float(text)) == value` for every element)."""
    return [float(str(v)) for v in np.asarray(values, dtype=np.float32)]


def error_body(message: str) -> dict[str, Any]:
    """The body of a 400 answer: OpenAI's error object."""
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}


__all__ = [
    "embedding_body",
    "error_body",
    "generation_body",
    "usage",
]
