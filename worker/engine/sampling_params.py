"""SamplingParams: how one request is decoded. Frozen and validated on construction."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding settings.

    temperature 0 is greedy. A request draws from its own torch.Generator seeded with `seed`, so
    its output does not depend on which other requests share its batch. `logprobs=k` returns the
    top-k log-probabilities (of the unscaled model distribution) per generated token; the sampled
    token is always included. `prompt_logprobs=True` returns each prompt token's log-probability
    given the tokens before it (the first is None); such a request skips the prefix cache.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k cut
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: bool = False

    def __post_init__(self) -> None:
        # Accept lists for convenience; store tuples so the object stays hashable and frozen.
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0 or None, got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
