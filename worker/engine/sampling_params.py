"""SamplingParams: how one request is decoded. Frozen and validated on construction."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from contracts.constraint import Constraint


def _bias_pairs(value: object) -> tuple[tuple[int, float], ...]:
    """logit_bias as sorted (token id, bias) pairs, from a dict (JSON keys may be strings) or pairs."""
    items = value.items() if isinstance(value, Mapping) else value
    try:
        pairs = {int(k): float(v) for k, v in items}  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise ValueError(f"logit_bias must map token ids to numbers, got {value!r}") from None
    bad = [t for t in pairs if t < 0]
    if bad:
        raise ValueError(f"logit_bias token ids must be >= 0, got {bad[:5]}")
    out_of_range = {t: b for t, b in pairs.items() if not -100.0 <= b <= 100.0}
    if out_of_range:
        raise ValueError(f"logit_bias values must be in [-100, 100], got {out_of_range}")
    return tuple(sorted(pairs.items()))


@dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding settings (vLLM's names and meanings).

    temperature 0 is greedy. A request draws from its own counter-based random stream keyed by `seed`,
    so its output does not depend on which other requests share its batch. `n` choices are forked
    from one prefill; choice i draws with seed + i (vLLM's rule), so choice 0 equals the n = 1 request.

    Logits processing, in vLLM's order (worker/engine/logits_processing.py): min_tokens (EOS and
    stop_token_ids at -inf until min_tokens tokens are generated), logit_bias (added), repetition
    penalty (over prompt and generated tokens: a positive logit divided by it, a negative one
    multiplied), frequency and presence penalties (over generated tokens: logit -= frequency * count
    + presence * (count > 0)); then greedy, or temperature, min_p (tokens below min_p times the top
    probability dropped), top-k, top-p and the draw.

    `constraint` restricts the text to a JSON schema, any JSON object, a regex, a choice or a grammar
    (token by token, a mask applied before the logits processing above); the request finishes with
    "stop" when the constraint is complete, "length" when max_tokens comes first.

    `logprobs=k` returns the top-k log-probabilities of the raw model distribution (before any of
    the above) per generated token, plus the sampled token's. `prompt_logprobs=True` returns each
    prompt token's log-probability given the tokens before it (the first is None); such a request
    skips the prefix cache.
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
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    skip_special_tokens: bool = True
    constraint: Constraint | None = None  # structured output (contracts/constraint.py)

    def __post_init__(self) -> None:
        # Accept lists and dicts for convenience; store tuples so the object stays hashable and frozen.
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be token ids >= 0, got {list(self.stop_token_ids)}")
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
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
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"repetition_penalty must be > 0 (1 disables it), got {self.repetition_penalty}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1] (0 disables it), got {self.min_p}")
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise ValueError(f"constraint must be a Constraint, got {type(self.constraint).__name__}")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be an integer in [0, max_tokens={self.max_tokens}], "
                             f"got {self.min_tokens!r}")  # fmt: skip

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Any of the three penalties is on: the row needs its token counts."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def processed(self) -> bool:
        """The row's logits are changed before sampling (penalties, logit_bias, min_tokens)."""
        return self.penalized or bool(self.logit_bias) or self.min_tokens > 0
