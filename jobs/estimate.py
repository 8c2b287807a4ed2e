"""A job's predicted engine time and cost, from its token counts and a throughput profile.

    engine_seconds = computed_prompt_tokens / prefill_tokens_per_s
                   + completion_tokens / decode_tokens_per_s
                   + decode_context_tokens / decode_context_tokens_per_s   (when the profile has it)
    completion_tokens (expected) = sum over rows of expected_tokens(max_tokens, stop_hazard)
    billed_seconds = load_seconds + shards x shard_overhead_s + engine_seconds
    (rows a shard computes once with an equal row, and rows the result cache holds, count no tokens)
    cost_usd = billed_seconds / 3600 x price per hour (on-demand and spot both given)

as cost.json bills a run (each shard's wall time plus the model load). A job with LoRA adapters also gets
each adapter's rows, tokens, engine seconds (the same formula over its rows) and its share of the cost
by those seconds, as cost.json's `adapters` and `base` split a run. No torch here: the counts come
out of worker.estimate_tokens, which the CLI (freight_cli/estimate.py) runs and hands in.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from jobs.cost import PriceTable
from jobs.errors import FreightError
from jobs.profile_store import Profile


@dataclass(frozen=True)
class Estimate:
    rows: int
    rows_bad: int
    shards: int
    prompt_tokens: int
    computed_prompt_tokens: int
    completion_tokens: int
    max_completion_tokens: int
    engine_seconds: float
    billed_seconds: float
    hours: float
    instance_type: str
    market: str
    price_per_hour: float
    cost_usd: float
    on_demand_cost_usd: float
    spot_cost_usd: float | None
    confidence: str  # "measured" (a profile from a run of this model here) or "default"
    rows_deduplicated: int = 0  # rows computed once with an equal row of their shard (no work)
    rows_cached: int = 0  # rows the result cache is expected to serve (no work)
    # a job with LoRA adapters: {name: rows, computed_prompt_tokens, completion_tokens, engine_seconds,
    # cost_usd} of the rows it computes, and `base` the same for the model's own rows
    adapters: dict[str, dict[str, float]] | None = None
    base: dict[str, float] | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate(counts: Any, profile: Profile, prices: PriceTable, instance_type: str, market: str,
             price_per_hour: float | None = None) -> Estimate:  # fmt: skip
    """`counts`: worker.estimate_tokens.TokenCounts (any object with its fields)."""
    completion = round(counts.expected_completion_tokens)
    decode = completion / profile.decode_tokens_per_s
    if profile.decode_context_tokens_per_s is not None:
        decode += counts.decode_context_tokens / profile.decode_context_tokens_per_s
    engine = counts.computed_prompt_tokens / profile.prefill_tokens_per_s + decode
    billed = profile.load_seconds + counts.shards * profile.shard_overhead_s + engine
    chosen = prices.pricing(instance_type, market, price_per_hour)  # type: ignore[arg-type]
    try:
        spot = prices.pricing(instance_type, "spot", price_per_hour).price_per_hour if price_per_hour is None else None
    except FreightError:  # an instance type known only through --price-per-hour
        spot = None
    split: dict[str, dict[str, float]] = {}
    for name, (rows, computed, expected, context) in (getattr(counts, "adapters", None) or {}).items():
        seconds = computed / profile.prefill_tokens_per_s + expected / profile.decode_tokens_per_s
        if profile.decode_context_tokens_per_s is not None:
            seconds += context / profile.decode_context_tokens_per_s
        split[name] = {"rows": rows, "computed_prompt_tokens": computed, "completion_tokens": round(expected),
                       "engine_seconds": seconds,
                       "cost_usd": billed / 3600.0 * chosen.price_per_hour * (seconds / engine if engine else 0.0)}  # fmt: skip
    return Estimate(
        rows=counts.rows, rows_bad=counts.rows_bad, shards=counts.shards, prompt_tokens=counts.prompt_tokens,
        computed_prompt_tokens=counts.computed_prompt_tokens, completion_tokens=completion,
        max_completion_tokens=counts.max_completion_tokens, engine_seconds=engine, billed_seconds=billed,
        hours=billed / 3600.0, instance_type=instance_type, market=market,
        price_per_hour=chosen.price_per_hour, cost_usd=billed / 3600.0 * chosen.price_per_hour,
        on_demand_cost_usd=billed / 3600.0 * chosen.on_demand_price_per_hour,
        spot_cost_usd=billed / 3600.0 * spot if spot is not None else None, confidence=profile.source,
        rows_deduplicated=getattr(counts, "rows_deduplicated", 0), rows_cached=getattr(counts, "rows_cached", 0),
        adapters={k: v for k, v in split.items() if k} if split else None,
        base=split.get("", {"rows": 0, "computed_prompt_tokens": 0, "completion_tokens": 0, "engine_seconds": 0.0,
                            "cost_usd": 0.0}) if split else None,
    )  # fmt: skip
