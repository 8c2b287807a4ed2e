"""RequestOutput: what the engine returns for one prompt; CompletionOutput: one of its n choices."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CompletionOutput:
    """One choice of a request (SamplingParams.n of them, `index` 0..n-1).

    `logprobs` per generated token: the top-k token ids' log-probabilities plus the sampled token's,
    of the raw model distribution (None unless the request asked for logprobs)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str
    logprobs: list[dict[int, float]] | None = None


@dataclass(frozen=True)
class RequestOutput:
    """The result of one request.

    finish_reason: "stop" (EOS, a stop id or a stop string), "length" (max_tokens or the model's
    context), "error" (the request could not run; `error` says why) or "cancelled".
    `text` is the decoded completion (special tokens skipped unless asked), cut before a matched stop
    string. `cached_tokens`: prompt tokens served from the prefix cache when the request was first
    admitted. `outputs` holds every choice in index order; text, token_ids, finish_reason and
    logprobs are choice 0's (filled from those four when `outputs` is not given).
    """

    index: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    error: str | None = None
    logprobs: list[dict[int, float]] | None = None
    prompt_logprobs: list[float | None] | None = None
    outputs: list[CompletionOutput] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.outputs:
            self.outputs.append(CompletionOutput(0, self.text, self.token_ids, self.finish_reason, self.logprobs))

    @property
    def completion_tokens(self) -> int:
        """Generated tokens over all choices (as OpenAI's usage counts them)."""
        return sum(len(o.token_ids) for o in self.outputs)
