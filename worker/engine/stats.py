"""EngineStats: cumulative counters of one Engine; snapshot() freezes them for differencing."""

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

    def snapshot(self) -> StatsSnapshot:
        return StatsSnapshot(**{f.name: getattr(self, f.name) for f in fields(self)})
