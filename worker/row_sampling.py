"""One row's SamplingParams: the job's (SamplingSpec.defaults) with the row's given fields over it.

A row's value wins over the job's flag, field by field; every field's rule was checked when the
row's body or columns were parsed (worker/request_body.py), the cross-field ones (min_tokens <=
max_tokens, wherever each came from) are checked here, with the rules that need the job: n <= the
cap (Settings.max_n), token ids inside the vocabulary.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from contracts.reasoning import ReasoningFormat
from contracts.row_constraint import TEXT, RowConstraint
from contracts.sampling import MAX_LOGPROBS, REQUEST_FIELDS, SamplingParams, row_sampling_error
from jobs.spec import JobSpec, row_seed


def resolve_sampling(
    spec: JobSpec,
    row_id: str | int,
    fields: BaseModel,
    max_tokens: int | None,
    logprobs: int | None,
    tokenizer: Any,
    max_n: int,
    constraint: RowConstraint = None,
    reasoning: ReasoningFormat | None = None,
) -> SamplingParams:
    """The job's sampling with a row's checked `fields` (worker/request_body.py SamplingFields: None =
    the job's) over it; `max_tokens` the row's own (a body's max_completion_tokens wins), `logprobs`
    as the surface resolved it, `constraint` the row's structured output (contracts/row_constraint.py):
    None takes the job's, TEXT none. A greedy row draws nothing: its seed is None, so equal greedy
    rows are equal params (one object in the engine, worker/row_engine.py). `reasoning`: the model's
    reasoning format for a chat row of a model that thinks (None: the row does not think, and the
    job's --reasoning-budget does not apply to it; its own reasoning_budget is its error)."""
    job = spec.sampling.defaults()
    given = {name: value for name in REQUEST_FIELDS if (value := getattr(fields, name)) is not None}
    if max_tokens is not None:
        given["max_tokens"] = max_tokens
    n = given.get("n", job.n)
    if n > max_n:
        raise ValueError(f"n {n}: a row may ask for at most {max_n} choices (FREIGHT_MAX_N)")
    if given.get("temperature", job.temperature) == 0:
        given["seed"] = None
    elif "seed" not in given:
        given["seed"] = row_seed(spec.sampling.seed, str(row_id))
    if constraint is not None:
        given["constraint"] = None if constraint == TEXT else constraint
    if reasoning is not None:
        given["reasoning"] = reasoning
    elif "reasoning_budget" in given:
        raise ValueError(f"reasoning_budget {given['reasoning_budget']}: this request does not think (only the chat "
                         "requests of a model whose chat template marks its thinking do); leave it out")  # fmt: skip
    elif job.reasoning_budget is not None:
        given["reasoning_budget"] = None  # the job's budget bounds the rows that think
    try:
        sampling = job.updated(**given, logprobs=logprobs)
    except ValidationError as exc:
        raise ValueError(row_sampling_error(exc)) from None
    vocab = getattr(tokenizer, "vocab_size", None)
    if vocab is not None:
        for name, ids in (("logit_bias", [t for t, _ in sampling.logit_bias]), ("stop_token_ids", sampling.stop_token_ids)):
            outside = [t for t in ids if t >= vocab]
            if outside:
                raise ValueError(f"{name}: token id {outside[0]} is outside the vocabulary (ids 0..{vocab - 1})")
    return sampling


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
