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
    # vLLM's names and meanings (issue 15's engine contract)
    n: int = 1  # choices per request
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    min_tokens: int = 0  # EOS and stop ids cannot end a request before this many tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), sorted by id; a dict is accepted
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        # Accept lists for convenience; store tuples so the object stays hashable and frozen.
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        object.__setattr__(self, "logit_bias", tuple(sorted((int(t), float(b)) for t, b in bias)))
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
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        if not -2.0 <= self.presence_penalty <= 2.0 or not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError("presence_penalty and frequency_penalty must be in [-2, 2]")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0 (1 is off), got {self.repetition_penalty}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if any(t < 0 for t, _ in self.logit_bias):
            raise ValueError("logit_bias token ids must be >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
