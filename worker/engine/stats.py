"""EngineStats: cumulative counters of one Engine; snapshot() freezes them for differencing.

Busy time is split between prefill and decode step by step (`EngineStats.add_busy`): a step is one
forward pass in which every token is a row of every matmul, so its time is shared in proportion to
the prefill tokens (prompt chunks, recompute, the first token) and decode tokens (one per decoding
sequence) it computes. A pure decode step is all decode time; a pure prefill step all prefill time.
Callers use the split to price input and output tokens by the engine time each side took.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class StatsSnapshot:
    """A frozen copy of EngineStats; `later - earlier` gives the work done in between."""

    prompt_tokens: int = 0  # tokens of admitted prompts, each request counted once
    cached_tokens: int = 0  # of those, tokens served from the prefix cache at first admission
    computed_prefill_tokens: int = 0  # tokens run through the model in prefill (incl. recompute)
    decode_tokens: int = 0  # tokens generated (sampled), all requests
    steps: int = 0  # engine steps (model forward passes)
    busy_seconds: float = 0.0  # wall time spent inside steps
    preemptions: int = 0  # sequences preempted (their KV recomputed later)
    prefill_seconds: float = 0.0  # busy_seconds = prefill_seconds + decode_seconds (module docstring)
    decode_seconds: float = 0.0
    constrained_requests: int = 0  # requests (choices) decoded under a structured-output constraint
    mask_seconds: float = 0.0  # host time spent filling their allowed-token masks
    spec_runs: int = 0  # speculation: sequences verified (one per sequence and verify step)
    spec_proposed_tokens: int = 0  # tokens proposed and verified
    spec_accepted_tokens: int = 0  # of those, accepted (each verified sequence also gets one own token)
    spec_grammar_cut_tokens: int = 0  # proposals of constrained rows dropped before verification (the grammar refuses them)

    @property
    def spec_acceptance_rate(self) -> float:
        """Accepted / proposed tokens (0.0 when nothing was proposed)."""
        return self.spec_accepted_tokens / self.spec_proposed_tokens if self.spec_proposed_tokens else 0.0

    @property
    def spec_mean_accepted_length(self) -> float:
        """Tokens a verified sequence gained per verify step: accepted + its own (0.0 without any)."""
        return (self.spec_accepted_tokens + self.spec_runs) / self.spec_runs if self.spec_runs else 0.0

    def __sub__(self, other: StatsSnapshot) -> StatsSnapshot:
        return StatsSnapshot(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})


@dataclass
class EngineStats:
    """Mutable counters; same fields as StatsSnapshot. Only the engine writes them."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    computed_prefill_tokens: int = 0
    decode_tokens: int = 0
    steps: int = 0
    busy_seconds: float = 0.0
    preemptions: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    constrained_requests: int = 0
    mask_seconds: float = 0.0
    spec_runs: int = 0
    spec_proposed_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_grammar_cut_tokens: int = 0

    def add_busy(self, seconds: float, prefill_tokens: int, decode_tokens: int) -> None:
        """Count one step's `seconds`, shared between prefill and decode by the step's token counts
        (a step with neither, e.g. only errors, counts as prefill: it served admissions)."""
        self.busy_seconds += seconds
        computed = prefill_tokens + decode_tokens
        decode = seconds * decode_tokens / computed if computed else 0.0
        self.decode_seconds += decode
        self.prefill_seconds += seconds - decode

    def snapshot(self) -> StatsSnapshot:
        return StatsSnapshot(**{f.name: getattr(self, f.name) for f in fields(self)})
