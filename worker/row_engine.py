"""A shard's requests through the engine: RowSampling -> SamplingParams, outputs -> RowResults."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from worker.row_requests import RowRequest
from worker.shard_rows import RowResult, from_output


def sampling_params(req: RowRequest, cache: dict[Any, Any] | None = None) -> Any:
    """The engine's SamplingParams for a row (every RowSampling field, vLLM's names). With `cache`,
    rows that decode alike share one object: greedy rows ignore their seed (nothing is drawn), so a
    greedy job builds a single one."""
    from worker.engine.sampling_params import SamplingParams

    s = req.sampling
    assert s is not None  # invariant: only rows without an error reach the engine
    likelihood = req.continuation_tokens > 0
    seed = None if s.temperature == 0 else s.seed
    key = (dataclasses.replace(s, seed=0) if seed is None else s, likelihood)
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
        n=s.n,
        presence_penalty=s.presence_penalty,
        frequency_penalty=s.frequency_penalty,
        repetition_penalty=s.repetition_penalty,
        min_p=s.min_p,
        min_tokens=s.min_tokens,
        logit_bias=s.logit_bias,
        logprobs=s.logprobs,
        stop_token_ids=s.stop_token_ids,
        ignore_eos=s.ignore_eos,
        skip_special_tokens=s.skip_special_tokens,
        constraint=s.constraint,
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
    cache: dict[Any, Any] = {}
    params = [sampling_params(req, cache) for req in pending]
    texts: dict[int, str] = {}  # token id -> text, for the logprobs column

    def token_text(tid: int) -> str:
        if tid not in texts:
            texts[tid] = engine.tokenizer.decode([tid], skip_special_tokens=False)
        return texts[tid]

    stream = engine.stream(prompts, params, should_stop=should_stop)
    outs = ((pending[o.index], from_output(o, pending[o.index], token_text)) for o in stream)
    return drain(outs, len(pending), results, should_stop, on_result)


def drain(
    outs: Iterator[tuple[RowRequest, RowResult]],
    expected: int,
    results: dict[int, RowResult],
    should_stop: Callable[[], bool] | None,
    on_result: Callable[[RowResult], None],
) -> bool:
    """Record each (request, result) as the engine yields it; True if the engine stopped early
    (asked to), RuntimeError if it returned fewer than `expected` rows without being asked."""
    finished = 0
    for req, res in outs:
        results[req.row] = res
        finished += 1
        on_result(res)
    if finished < expected:
        if should_stop is None or not should_stop():
            raise RuntimeError(f"engine returned {finished} of {expected} rows without being stopped")
        return True
    return False
