"""RowSampling: one row's resolved sampling, from the job's flags and the row's checked fields.

A row's value wins over the job's flag, field by field. The rules that need the job are checked
here: n <= the cap (Settings.max_n), min_tokens <= max_tokens, token ids inside the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts.constraint import Constraint
from contracts.row_constraint import TEXT, RowConstraint, job_constraint
from jobs.spec import MAX_LOGPROBS, JobSpec, row_seed
from worker.request_body import SamplingFields


@dataclass(frozen=True)
class RowSampling:
    """Resolved sampling of one row (the job's flags, then the row's columns or body fields); the
    engine's SamplingParams fields of the same names (worker/shard_rows.py maps them)."""

    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    top_k: int = 0
    stop: tuple[str, ...] = ()
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None  # top_logprobs count per generated token; 0 = the sampled token's only
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    constraint: Constraint | None = None  # structured output: the row's own, else the job's


def resolve_sampling(
    spec: JobSpec,
    row_id: str | int,
    f: SamplingFields,
    max_tokens: int | None,
    logprobs: int | None,
    tokenizer: Any,
    max_n: int,
    constraint: RowConstraint = None,
) -> RowSampling:
    """The job's sampling with a row's checked fields `f` (None = the job's); the rules that need the
    job: n <= max_n, min_tokens <= max_tokens, token ids inside the vocabulary. `constraint`: the
    row's structured output (contracts/row_constraint.py): None takes the job's, TEXT none."""
    s = spec.sampling
    n = s.n if f.n is None else f.n
    if n > max_n:
        raise ValueError(f"n {n}: a row may ask for at most {max_n} choices (FREIGHT_MAX_N)")
    max_tokens = s.max_tokens if max_tokens is None else max_tokens
    min_tokens = s.min_tokens if f.min_tokens is None else f.min_tokens
    if min_tokens > max_tokens:
        raise ValueError(f"min_tokens {min_tokens}: must not exceed max_tokens ({max_tokens})")
    logit_bias = s.logit_bias if f.logit_bias is None else f.logit_bias
    stop_token_ids = f.stop_token_ids or ()
    vocab = getattr(tokenizer, "vocab_size", None)
    if vocab is not None:
        for name, ids in (("logit_bias", [t for t, _ in logit_bias]), ("stop_token_ids", stop_token_ids)):
            outside = [t for t in ids if t >= vocab]
            if outside:
                raise ValueError(f"{name}: token id {outside[0]} is outside the vocabulary (ids 0..{vocab - 1})")
    return RowSampling(
        max_tokens=max_tokens,
        temperature=s.temperature if f.temperature is None else float(f.temperature),
        top_p=s.top_p if f.top_p is None else float(f.top_p),
        seed=row_seed(s.seed, str(row_id)) if f.seed is None else f.seed,
        top_k=s.top_k if f.top_k is None else max(f.top_k, 0),
        stop=s.stop if f.stop is None else f.stop,
        n=n,
        presence_penalty=_pick(f.presence_penalty, s.presence_penalty),
        frequency_penalty=_pick(f.frequency_penalty, s.frequency_penalty),
        repetition_penalty=_pick(f.repetition_penalty, s.repetition_penalty),
        min_p=_pick(f.min_p, s.min_p),
        min_tokens=min_tokens,
        logit_bias=logit_bias,
        logprobs=logprobs,
        stop_token_ids=stop_token_ids,
        ignore_eos=bool(f.ignore_eos),
        skip_special_tokens=f.skip_special_tokens is not False,
        constraint=job_constraint(s) if constraint is None else (None if constraint == TEXT else constraint),
    )


def _pick(value: float | None, default: float) -> float:
    return default if value is None else float(value)


def column_logprobs(asked: bool | int | None, top: int | None, job: int | None) -> int | None:
    """A Parquet row's logprobs: `top_logprobs` K, or `logprobs` true (K = 0: the sampled token's
    only) / false (off) / an integer K; both null: the job's --logprobs."""
    if asked is False:
        if top is not None:
            raise ValueError(f"top_logprobs {top}: needs logprobs true (or null), not false")
        return None
    if top is not None:
        return top
    if asked is None:
        return job
    if asked is True:
        return 0
    if not 0 <= asked <= MAX_LOGPROBS:
        raise ValueError(f"logprobs {asked}: must be true, false or a top count in 0..{MAX_LOGPROBS}")
    return asked
