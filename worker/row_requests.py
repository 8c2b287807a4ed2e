"""A shard's input rows -> engine requests (prompt + per-row sampling), or a row error.

Per-row problems (null/empty prompt, bad override value, unrenderable messages) never fail the shard.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from jobs.errors import InputError
from jobs.manifest import InputPlan
from jobs.spec import JobSpec, row_seed


@dataclass(frozen=True)
class RowSampling:
    """Resolved sampling of one row (job defaults, then the row's override columns)."""

    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    top_k: int = 0
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class RowRequest:
    """One input row. Exactly one of `prompt` / `error` is set (token ids when scoring likelihood)."""

    row: int  # global row number
    id: str | int  # the input's id (its type kept: InputPlan.id_type), or the row number as a string
    prompt: str | list[int] | None
    sampling: RowSampling | None
    continuation_tokens: int = 0  # likelihood mode: the last n prompt tokens are the continuation
    error: str | None = None
    endpoint: str = "completions"  # "chat", "completions" or "embeddings" (OpenAI Batch's url)
    dimensions: int | None = None  # embeddings: keep the first n dimensions
    encoding_format: str = "float"  # embeddings: "float" or "base64" (how an OpenAI output file writes it)


def build_requests(
    table: pa.Table, rows: list[int], spec: JobSpec, plan: InputPlan, tokenizer: Any
) -> list[RowRequest]:
    """`table` holds the shard's rows in order (row i of the table is global row `rows[i]`)."""
    prompts = table.column(plan.prompt_column).to_pylist()
    ids = table.column(plan.id_column).to_pylist() if plan.id_column else [str(r) for r in rows]
    conts = table.column(plan.continuation_column).to_pylist() if plan.continuation_column else None
    overrides = {c: table.column(c).to_pylist() for c in plan.override_columns}
    out: list[RowRequest] = []
    for i, row in enumerate(rows):
        row_id = _row_id(ids[i], row)
        try:
            values = {c: v[i] for c, v in overrides.items()} if overrides else None
            sampling = _sampling(spec, row_id, values, json_text=plan.format == "jsonl")
            text = _prompt_text(prompts[i], plan.prompt_kind, tokenizer)
            if conts is None:
                out.append(RowRequest(row=row, id=row_id, prompt=text, sampling=sampling))
                continue
            cont = conts[i]
            if not isinstance(cont, str) or not cont:
                raise ValueError("empty continuation: likelihood scoring needs text to score")
            cont_ids = list(tokenizer.encode(cont, add_special_tokens=False))  # no BOS mid-sequence
            ids_all = list(tokenizer.encode(text)) + cont_ids
            greedy = RowSampling(max_tokens=1, temperature=0.0, top_p=1.0, seed=sampling.seed)
            out.append(
                RowRequest(
                    row=row, id=row_id, prompt=ids_all, sampling=greedy, continuation_tokens=len(cont_ids)
                )
            )
        except ValueError as exc:
            out.append(RowRequest(row=row, id=row_id, prompt=None, sampling=None, error=str(exc)))
    return out


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
    messages = json.loads(value) if isinstance(value, str) else value
    if not messages or not isinstance(messages, list):
        raise ValueError("no messages: expected a list of {role, content}")
    for m in messages:
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise ValueError("bad message: each needs a string role and string content")
    try:
        return tokenizer.apply_chat_template(
            [{"role": m["role"], "content": m["content"]} for m in messages], add_generation_prompt=True
        )
    except Exception as exc:  # a template error is this row's problem, not the shard's
        raise ValueError(f"chat template failed: {exc}") from exc


def _override(name: str, raw: Any, json_text: bool) -> Any:
    if raw is None:
        return None
    if json_text and isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"bad {name} {raw!r}") from exc
    return raw


def _sampling(
    spec: JobSpec, row_id: str | int, values: dict[str, Any] | None, json_text: bool
) -> RowSampling:
    """The job's sampling with this row's override columns (`values`, None when the input has none)."""
    s = spec.sampling
    if values is None:
        return RowSampling(
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            seed=row_seed(s.seed, str(row_id)),
            top_k=s.top_k,
            stop=s.stop,
        )
    max_tokens = _override("max_tokens", values.get("max_tokens"), json_text)
    temperature = _override("temperature", values.get("temperature"), json_text)
    top_p = _override("top_p", values.get("top_p"), json_text)
    seed = _override("seed", values.get("seed"), json_text)
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise ValueError(f"bad max_tokens {max_tokens!r}: expected an integer >= 1")
    if temperature is not None and (not _is_number(temperature) or not 0 <= temperature <= 100):
        raise ValueError(f"bad temperature {temperature!r}: expected a number in [0, 100]")
    if top_p is not None and (not _is_number(top_p) or not 0 < top_p <= 1):
        raise ValueError(f"bad top_p {top_p!r}: expected a number in (0, 1]")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63):
        raise ValueError(f"bad seed {seed!r}: expected an integer >= 0")
    return RowSampling(
        max_tokens=s.max_tokens if max_tokens is None else max_tokens,
        temperature=s.temperature if temperature is None else float(temperature),
        top_p=s.top_p if top_p is None else float(top_p),
        seed=row_seed(s.seed, str(row_id)) if seed is None else seed,
        top_k=s.top_k,
        stop=s.stop,
    )


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
