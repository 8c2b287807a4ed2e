"""RequestOutput: what the engine returns for one prompt."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestOutput:
    """The result of one request.

    finish_reason: "stop" (EOS, a stop id or a stop string), "length" (max_tokens or the model's
    context), "error" (the request could not run; `error` says why) or "cancelled".
    `text` is the decoded completion without special tokens, cut before a matched stop string.
    `cached_tokens`: prompt tokens served from the prefix cache when the request was first admitted.
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

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)
