"""Result rows of a shard: engine outputs -> RowResult -> Arrow table in the design's result schema.

One row per input row. With n > 1 choices: `completion` / `finish_reason` are choice 0's,
`completions` / `finish_reasons` list every choice, `completion_tokens` sums them (OpenAI's usage).
With a JSON constraint (json_schema / json_object): `parsed` is choice 0's value as compact JSON when
it finished "stop" (null otherwise), `parsed_choices` every choice's with n > 1.
`logprobs` (when asked): per choice, per generated token, the token's text (decoded alone, special
tokens kept), id and log-probability, and its `top_logprobs` (the asked count, likeliest first).
Running the rows through the engine: worker/row_engine.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from jobs import datasets
from jobs.endpoints import URL_OF_ENDPOINT
from worker.chat_answer import chat_answer
from worker.row_requests import RowRequest

ROW_COLUMN = "_row"  # global row number; only in partial files, never in committed results
CONSTRAINED_COLUMN = "_constrained"  # RowResult.constrained; only in partial files
DUPLICATE_COLUMN = "_duplicate"  # RowResult.duplicate; only in partial files


@dataclass(frozen=True)
class RowResult:
    row: int
    id: str | int  # int when the input's id column holds integers
    completion: str | None
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    error: str | None
    continuation_logprob: float | None = None
    continuation_tokens: int | None = None
    endpoint: str = URL_OF_ENDPOINT["completions"]  # the request's url
    completions: list[str] | None = None  # n > 1
    finish_reasons: list[str] | None = None  # n > 1
    logprobs: list[list[dict[str, Any]]] | None = None  # [choice][token] {token, token_id, logprob, top_logprobs}
    embedding: list[float] | None = None  # embeddings rows
    parsed: str | None = None  # JSON constraint, choice 0 finished "stop": its value as compact JSON
    parsed_choices: list[str | None] | None = None  # n > 1 with a JSON constraint: each choice's `parsed`
    reasoning: str | None = None  # a thinking chat row: choice 0's thinking (completion holds its answer)
    reasoning_tokens: int | None = None  # thinking tokens of every choice (null: the row cannot think)
    reasoning_choices: list[str | None] | None = None  # n > 1: each choice's reasoning
    tool_calls: list[dict[str, str]] | None = None  # a row with tools: choice 0's calls {id, type, name, arguments}
    tool_calls_choices: list[list[dict[str, str]] | None] | None = None  # n > 1 with tools: each choice's
    cached: str | None = None  # "exact" | "semantic": the answer came from the result cache
    cached_from_job: str | None = None  # the job that computed a cached answer
    cached_from_row: str | None = None  # the id (as text) of the row whose answer it is
    cached_similarity: float | None = None  # a semantic hit: cosine similarity of the two prompts
    response_fields: str | None = None  # /v1/responses rows: RowRequest.response_fields
    adapter: str | None = None  # the LoRA adapter it ran (RowRequest.adapter)
    constrained: bool = False  # ran under a constraint (the cost report's constrained_rows; not a result column)
    duplicate: bool = False  # took the answer of an equal row of its shard (worker/row_dedup.py; not a column)


def error_row(req: RowRequest) -> RowResult:
    return RowResult(
        row=req.row,
        id=req.id,
        completion=None,
        finish_reason="error",
        prompt_tokens=0,
        cached_tokens=0,
        completion_tokens=0,
        error=req.error,
        endpoint=URL_OF_ENDPOINT[req.endpoint],
        adapter=req.adapter,
    )


def result_row(d: dict[str, Any], endpoint: str) -> RowResult:
    """A partial file's row (with its _row column) back to a RowResult; `endpoint` for files older
    than the endpoint column (default_endpoint)."""
    values = {k: d.get(k) for k in RowResult.__dataclass_fields__ if k not in ("row", "constrained", "duplicate")}
    values["endpoint"] = values["endpoint"] or endpoint
    values["constrained"] = bool(d.get(CONSTRAINED_COLUMN))
    values["duplicate"] = bool(d.get(DUPLICATE_COLUMN))
    return RowResult(row=int(d[ROW_COLUMN]), **values)


def _continuation_logprob(out: Any, req: RowRequest) -> float | None:
    """Sum of the logprobs of the last `req.continuation_tokens` prompt tokens."""
    lps = out.prompt_logprobs
    if lps is None or req.continuation_tokens == 0:
        return None
    ids = list(out.prompt_token_ids)
    total = 0.0
    for pos in range(len(ids) - req.continuation_tokens, len(ids)):
        lp = lps[pos]
        if isinstance(lp, dict):  # token_id -> logprob (top-k plus the actual token)
            lp = lp[ids[pos]]
        total += float(lp)
    return total


def from_output(out: Any, req: RowRequest, token_text: Callable[[int], str] | None = None,
                tokenizer: Any = None) -> RowResult:  # fmt: skip
    """A RowResult from the engine's RequestOutput; `token_text` decodes one token id (logprobs);
    `tokenizer` (the engine's) splits a thinking row and parses its tool calls (worker/chat_answer.py)."""
    # a row fails when any of its choices failed (a forked choice can fail alone, e.g. no KV room)
    failed = out.finish_reason == "error" or any(c.finish_reason == "error" for c in out.outputs)
    likelihood = req.continuation_tokens > 0
    cont_lp = None
    out_error = None
    if likelihood and not failed:
        try:
            cont_lp = _continuation_logprob(out, req)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            failed, out_error = True, f"no prompt logprobs for the continuation: {exc}"
    choices = out.outputs  # one per choice, index order (choice 0 is also `out`'s own fields)
    s = req.sampling
    chat = None
    if s is not None and not failed and (s.reasoning is not None or req.tools is not None):
        if tokenizer is None:
            raise ValueError("a thinking or tool-calling row's output needs the tokenizer")
        chat = [chat_answer(c, list(out.prompt_token_ids), s, tokenizer, req.tools, req.tool_format,
                            f"{req.id}:{req.row}:{c.index}") for c in choices]  # fmt: skip
    answers = [a.text for a in chat] if chat else [c.text for c in choices]
    reasons = [a.finish_reason for a in chat] if chat else [c.finish_reason for c in choices]
    texts = [(req.echo_text or "") + t for t in answers]
    several = s is not None and s.n > 1 and not failed
    constraint = s.constraint if s is not None else None
    json_answer = constraint is not None and constraint.is_json
    parsed = [parsed_value(t, c.finish_reason) for t, c in zip(answers, choices, strict=True)] if json_answer else None
    thinks = chat is not None and s is not None and s.reasoning is not None
    logprobs = None
    if s is not None and s.logprobs is not None and not likelihood and not failed:
        if token_text is None:
            raise ValueError("logprobs asked without a token_text decoder")
        logprobs = [_token_logprobs(c.token_ids, c.logprobs or [], s.logprobs, token_text) for c in choices]
    return RowResult(
        row=req.row,
        id=req.id,
        completion=None if failed else texts[0],
        finish_reason="error" if failed else reasons[0],
        prompt_tokens=int(out.prompt_tokens),
        cached_tokens=int(out.cached_tokens),
        completion_tokens=sum(len(c.token_ids) for c in choices),
        error=(out.error or "engine error") if failed and out_error is None else out_error,
        continuation_logprob=cont_lp,
        continuation_tokens=req.continuation_tokens if likelihood else None,
        endpoint=URL_OF_ENDPOINT[req.endpoint],
        completions=texts if several else None,
        finish_reasons=reasons if several else None,
        logprobs=logprobs,
        parsed=parsed[0] if parsed and not failed else None,
        parsed_choices=parsed if parsed and several else None,
        reasoning=chat[0].reasoning if chat else None,
        reasoning_tokens=sum(a.reasoning_tokens for a in chat) if chat and thinks else None,
        reasoning_choices=[a.reasoning for a in chat] if chat and several and thinks else None,
        tool_calls=chat[0].tool_calls if chat else None,
        tool_calls_choices=[a.tool_calls for a in chat] if chat and several and req.tools is not None else None,
        response_fields=req.response_fields,
        adapter=req.adapter,
        constrained=constraint is not None,
    )


def parsed_value(text: str, finish_reason: str) -> str | None:
    """A JSON-constrained choice's value, re-serialized compactly (key order kept, non-ASCII as is);
    None unless it finished "stop" with text that parses (a length or error end, or a stop string
    that cut the value short)."""
    if finish_reason != "stop":
        return None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except ValueError:
        return None
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _token_logprobs(
    token_ids: list[int], per_token: list[dict[int, float]], top: int, token_text: Callable[[int], str]
) -> list[dict[str, Any]]:
    """One choice's logprobs: per generated token the sampled token and the `top` likeliest of the
    step's dict (the engine's top-k plus the sampled token), likeliest first."""
    out: list[dict[str, Any]] = []
    for tid, lps in zip(token_ids, per_token, strict=False):
        best = sorted(lps.items(), key=lambda kv: -kv[1])[:top]
        out.append(
            {
                "token": token_text(tid),
                "token_id": tid,
                "logprob": lps.get(tid),
                "top_logprobs": [{"token": token_text(t), "token_id": t, "logprob": lp} for t, lp in best],
            }
        )
    return out


def rows_table(rows: list[RowResult], likelihood: bool, with_row: bool, id_type: str = "string") -> pa.Table:
    """Rows in the result schema (+ likelihood columns; + _row for partial files); `id_type`: the
    manifest's InputPlan.id_type."""
    schema = datasets.result_schema(likelihood, id_type)
    cols: dict[str, pa.Array] = {}
    for field in schema:
        cols[field.name] = pa.array([getattr(r, field.name) for r in rows], field.type)
    table = pa.Table.from_pydict(cols, schema=schema)
    if with_row:
        table = table.append_column(ROW_COLUMN, pa.array([r.row for r in rows], pa.int64()))
        table = table.append_column(CONSTRAINED_COLUMN, pa.array([r.constrained for r in rows], pa.bool_()))
        table = table.append_column(DUPLICATE_COLUMN, pa.array([r.duplicate for r in rows], pa.bool_()))
    return table
