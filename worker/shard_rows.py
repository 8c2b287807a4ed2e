"""Result rows of a shard: engine outputs -> RowResult -> Arrow table in the design's result schema."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from jobs import datasets
from worker.row_requests import RowRequest

ROW_COLUMN = "_row"  # global row number; only in partial files, never in committed results


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
    embedding: list[float] | None = None  # embeddings rows (worker/embed_rows.py)


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
    )


def result_row(d: dict[str, Any]) -> RowResult:
    """A partial file's row (with its _row column) back to a RowResult."""
    return RowResult(
        row=int(d[ROW_COLUMN]), **{k: d.get(k) for k in RowResult.__dataclass_fields__ if k != "row"}
    )


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


def from_output(out: Any, req: RowRequest) -> RowResult:
    failed = out.finish_reason == "error"
    likelihood = isinstance(req.prompt, list)
    cont_lp = None
    if likelihood and not failed:
        try:
            cont_lp = _continuation_logprob(out, req)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            failed, out_error = True, f"no prompt logprobs for the continuation: {exc}"
        else:
            out_error = None
    else:
        out_error = None
    return RowResult(
        row=req.row,
        id=req.id,
        completion=None if failed else out.text,
        finish_reason="error" if failed else out.finish_reason,
        prompt_tokens=int(out.prompt_tokens),
        cached_tokens=int(out.cached_tokens),
        completion_tokens=len(out.token_ids),
        error=(out.error or "engine error") if out.finish_reason == "error" else out_error,
        continuation_logprob=cont_lp,
        continuation_tokens=req.continuation_tokens if likelihood else None,
    )


def sampling_params(req: RowRequest, cache: dict[tuple[Any, ...], Any] | None = None) -> Any:
    """The engine's SamplingParams for a row. With `cache`, rows that decode alike share one object:
    greedy rows ignore their seed (nothing is drawn), so a greedy job builds a single one."""
    from worker.engine.sampling_params import SamplingParams

    s = req.sampling
    assert s is not None  # invariant: only rows without an error reach the engine
    likelihood = isinstance(req.prompt, list)
    seed = None if s.temperature == 0 else s.seed
    key = (s.max_tokens, s.temperature, s.top_p, s.top_k, s.stop, seed, likelihood)
    if cache is not None and (hit := cache.get(key)) is not None:
        return hit
    params = SamplingParams(
        max_tokens=s.max_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        stop=s.stop,
        seed=seed,
        prompt_logprobs=likelihood,
    )
    if cache is not None:
        cache[key] = params
    return params


def collect_rows(
    engine: Any,
    pending: list[RowRequest],
    results: dict[int, RowResult],
    should_stop: Callable[[], bool] | None,
    on_result: Callable[[RowResult], None],
) -> bool:
    """Run `pending` through the engine, filling `results`; True if stopped before all finished."""
    if not pending:
        return False
    if should_stop is not None and should_stop():
        return True
    prompts = [req.prompt for req in pending]
    cache: dict[tuple[Any, ...], Any] = {}
    params = [sampling_params(req, cache) for req in pending]
    finished = 0
    for out in engine.stream(prompts, params, should_stop=should_stop):
        req = pending[out.index]
        res = from_output(out, req)
        results[req.row] = res
        finished += 1
        on_result(res)
    if finished < len(pending):
        if should_stop is None or not should_stop():
            raise RuntimeError(f"engine returned {finished} of {len(pending)} rows without being stopped")
        return True
    return False


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
    return table
