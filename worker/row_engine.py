"""A shard's requests through the engine: each row's SamplingParams as built (worker/row_sampling.py),
outputs -> RowResults."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from contracts.sampling import SamplingParams
from worker.row_requests import RowRequest
from worker.shard_rows import RowResult, from_output


def sampling_params(req: RowRequest, cache: dict[SamplingParams, SamplingParams] | None = None) -> SamplingParams:
    """The engine's SamplingParams of a row. With `cache`, rows that decode alike share one object
    (greedy rows carry no seed, so a greedy job passes a single one)."""
    s = req.sampling
    assert s is not None  # invariant: only rows without an error reach the engine
    return s if cache is None else cache.setdefault(s, s)


@dataclass(frozen=True)
class RowSink:
    """Where a shard's row results go as the engine yields them: `results` by row, `on_result` told
    of each, `should_stop` (None: never) asked whether the attempt is to stop early."""

    results: dict[int, RowResult]
    should_stop: Callable[[], bool] | None
    on_result: Callable[[RowResult], None]

    def stopping(self) -> bool:
        return self.should_stop is not None and self.should_stop()

    def drain(self, outs: Iterator[tuple[RowRequest, RowResult]], expected: int) -> bool:
        """Record each (request, result) as the engine yields it; True if the engine stopped early
        (asked to), RuntimeError if it returned fewer than `expected` rows without being asked."""
        finished = 0
        for req, res in outs:
            self.results[req.row] = res
            finished += 1
            self.on_result(res)
        if finished < expected:
            if not self.stopping():
                raise RuntimeError(f"engine returned {finished} of {expected} rows without being stopped")
            return True
        return False


def collect_rows(engine: Any, pending: list[RowRequest], sink: RowSink, cache_salt: str | None = None) -> bool:
    """Run `pending` through the engine into `sink`; True if stopped before all finished. `cache_salt`:
    the job's (JobSpec.cache_salt), whose prompts share prefix-cache blocks with its salt's only."""
    if not pending:
        return False
    if sink.stopping():
        return True
    prompts = [req.prompt for req in pending]
    cache: dict[Any, Any] = {}
    params = [sampling_params(req, cache) for req in pending]
    texts: dict[int, str] = {}  # token id -> text, for the logprobs column

    def token_text(tid: int) -> str:
        if tid not in texts:
            texts[tid] = engine.tokenizer.decode([tid], skip_special_tokens=False)
        return texts[tid]

    adapters = [req.adapter for req in pending] if any(req.adapter for req in pending) else None
    stream = engine.stream(prompts, params, should_stop=sink.should_stop, adapters=adapters, cache_salt=cache_salt)
    outs = ((pending[o.index], from_output(o, pending[o.index], token_text, engine.tokenizer)) for o in stream)
    return sink.drain(outs, len(pending))
