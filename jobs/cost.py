"""Cost accounting: the price table, shard cost records, attempt (waste) records and the job report.

A shard is billed for its wall time on the worker (read, engine, write, commit) plus the model load
seconds charged to it (the first shard a worker runs after loading pays the load).
"""

from __future__ import annotations

import tomllib
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from jobs.errors import FreightError

SHIPPED_PRICES = Path(__file__).with_name("prices.toml")
Market = Literal["on-demand", "spot"]


class ShardPricing(BaseModel):
    """What one worker-hour costs where a shard runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    instance_type: str
    market: Market
    price_per_hour: float = Field(ge=0.0)
    on_demand_price_per_hour: float = Field(ge=0.0)

    def charge(self, seconds: float) -> dict[str, Any]:
        """The price fields of a cost record for `seconds` billed here: instance type, market, hourly
        price, and the cost in USD at that price and at the on-demand one."""
        return {
            "instance_type": self.instance_type,
            "market": self.market,
            "price_per_hour": self.price_per_hour,
            "cost_usd": usd(seconds, self.price_per_hour),
            "on_demand_cost_usd": usd(seconds, self.on_demand_price_per_hour),
        }


class PriceTable:
    """instance type -> {"on_demand": USD/h, "spot": USD/h}, from the shipped TOML or a given file."""

    def __init__(self, prices: dict[str, dict[str, float]]):
        self.prices = prices

    @classmethod
    def load(cls, path: str | Path | None = None) -> PriceTable:
        path = Path(path) if path else SHIPPED_PRICES
        try:
            raw = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise FreightError(f"price table {path} is unreadable: {exc}") from exc
        prices: dict[str, dict[str, float]] = {}
        for name, entry in raw.items():
            if not isinstance(entry, dict) or "on_demand" not in entry:
                raise FreightError(f'price table {path}: ["{name}"] needs on_demand (and spot) USD/hour')
            prices[name] = {
                "on_demand": float(entry["on_demand"]),
                "spot": float(entry.get("spot", entry["on_demand"])),
            }
        return cls(prices)

    def pricing(self, instance_type: str, market: Market, override: float | None = None) -> ShardPricing:
        """Resolve prices; `override` replaces the market price (and the on-demand one if unknown)."""
        entry = self.prices.get(instance_type)
        if entry is None and override is None:
            known = ", ".join(sorted(self.prices))
            raise FreightError(
                f"unknown instance type '{instance_type}': pass --price-per-hour or use one of {known}"
            )
        price = override if override is not None else entry["spot" if market == "spot" else "on_demand"]  # type: ignore[index]
        on_demand = entry["on_demand"] if entry is not None else price
        return ShardPricing(
            instance_type=instance_type,
            market=market,
            price_per_hour=price,
            on_demand_price_per_hour=on_demand,
        )


class AdapterUsage(BaseModel):
    """One LoRA adapter's share of a shard (or job): its rows, the tokens of those that ran (as the
    record counts them) and the engine seconds of those this attempt computed (row_seconds: each row
    its share of the attempt's prefill and decode time by its tokens)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rows: int = 0
    rows_failed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    busy_seconds: float = 0.0

    def __add__(self, other: AdapterUsage) -> AdapterUsage:
        return AdapterUsage(**{k: getattr(self, k) + getattr(other, k) for k in type(self).model_fields})


BASE_USAGE = ""  # ShardRecord.adapters' key of the model's own rows (no adapter name is empty)


class ShardRecord(BaseModel):
    """OUT/costs/<n>.json: committed together with the shard's results (same put_if_absent rule)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    shard: int
    attempt: int
    rows: int
    rows_failed: int
    rows_from_partial: int = Field(0, description="rows reused from an interrupted attempt")
    # tokens of the rows that ran (a row refused with an error, e.g. too long, counts none)
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    reasoning_tokens: int = Field(0, description="of completion_tokens, the thinking of chat rows that think")
    busy_seconds: float = Field(description="engine busy time in this attempt")
    prefill_seconds: float = Field(0.0, description="of busy_seconds, the prefill share (EngineStats)")
    decode_seconds: float = Field(0.0, description="of busy_seconds, the decode share")
    constrained_rows: int = Field(0, description="rows decoded under a structured-output constraint")
    mask_seconds: float = Field(0.0, description="engine host time filling their allowed-token masks")
    spec_proposed_tokens: int = Field(0, description="speculative decoding: tokens proposed and verified")
    spec_accepted_tokens: int = Field(0, description="of those, accepted")
    spec_grammar_cut_tokens: int = Field(
        0, description="proposals of constrained rows dropped before verification (their grammar refused them)"
    )
    deduplicated_rows: int = Field(0, description="rows that took the answer of an equal row of the shard")
    deduplicated_prompt_tokens: int = Field(0, description="their prompt tokens, not computed")
    deduplicated_completion_tokens: int = Field(0, description="their completion tokens, not computed")
    deduplicated_seconds: float = Field(
        0.0, description="engine seconds their answers took once, each counted again per copy (row_seconds)"
    )
    cache_hits: int = Field(0, description="rows served from the result cache (exact and semantic)")
    cache_semantic_hits: int = Field(0, description="of those, served by the semantic cache")
    cache_hit_prompt_tokens: int = Field(0, description="their prompt tokens, not computed")
    cache_hit_completion_tokens: int = Field(0, description="their completion tokens, not computed")
    cache_hit_seconds: float = Field(0.0, description="engine seconds their answers took when computed")
    cache_entries: int = Field(0, description="rows this shard computed and offered to the result cache")
    cache_space: str | None = Field(None, description="the result cache's space of the job's model")
    adapters: dict[str, AdapterUsage] = Field(
        default_factory=dict, description="a job with LoRA adapters: each adapter's rows, tokens and engine "
        "seconds, the model's own rows under the empty name",
    )
    model_fingerprint: str | None = Field(
        None, description="the checkpoint's content fingerprint (jobs/model_fingerprint.py), when the attempt "
        "computed it (a job with a result cache)"
    )
    load_seconds: float = Field(description="model load time charged to this shard")
    wall_seconds: float = Field(description="shard start to commit on the worker")
    billed_seconds: float
    instance_type: str
    market: Market
    price_per_hour: float
    on_demand_price_per_hour: float
    cost_usd: float
    on_demand_cost_usd: float
    worker: str
    started_at: float
    finished_at: float


class AttemptRecord(BaseModel):
    """OUT/waste/<n>-<attempt>-<token>.json: an attempt that did not commit (interrupted, lost race,
    raised an error).

    `cost_usd` is all it cost; `wasted_usd` the part not saved as partial rows for the next attempt.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    shard: int
    attempt: int
    reason: Literal["interrupted", "lost_race", "already_committed", "error"]
    rows_attempted: int
    rows_saved: int
    billed_seconds: float
    instance_type: str
    market: Market
    price_per_hour: float
    cost_usd: float
    on_demand_cost_usd: float
    wasted_usd: float
    worker: str
    recorded_at: float


def usd(seconds: float, price_per_hour: float) -> float:
    return seconds * price_per_hour / 3600.0


def row_seconds(
    computed_prompt: int, completion: int, prefill_seconds: float, decode_seconds: float,
    computed_prompt_total: int, completion_total: int,
) -> float:
    """The engine seconds one row's answer took: its share of an attempt's prefill seconds by the
    prompt tokens it computed (not served from the prefix cache), and of its decode seconds by its
    completion tokens (the engine runs rows together, so a row's own time is not measured)."""
    prefill = prefill_seconds * computed_prompt / computed_prompt_total if computed_prompt_total else 0.0
    decode = decode_seconds * completion / completion_total if completion_total else 0.0
    return prefill + decode


def _per_million(cost: float, tokens: int) -> float | None:
    return cost / tokens * 1e6 if tokens else None


def split_cost(
    cost: float, prefill_seconds: float, decode_seconds: float, computed_prompt: int, completion: int
) -> tuple[float, float]:
    """(input, output) parts of `cost`, by each side's share of engine time: prefill time prices the
    input tokens, decode time the output tokens. Time outside the engine (model load, reading,
    writing) is shared the same way. Records without the time split (written before it existed)
    fall back to the computed tokens of each side: prompt tokens not served from the cache, and
    completion tokens."""
    engine = prefill_seconds + decode_seconds
    if engine > 0:
        share = prefill_seconds / engine
    elif computed_prompt + completion > 0:
        share = computed_prompt / (computed_prompt + completion)
    else:
        share = 1.0
    return cost * share, cost * (1.0 - share)


def _dedup_report(shards: list[ShardRecord]) -> dict[str, Any]:
    """What computing each shard's duplicate rows once saved: rows, tokens, and the engine seconds of
    their answers at each shard's price (worker/row_dedup.py)."""
    prompt = sum(r.deduplicated_prompt_tokens for r in shards)
    completion = sum(r.deduplicated_completion_tokens for r in shards)
    return {
        "deduplicated_rows": sum(r.deduplicated_rows for r in shards),
        "deduplicated_prompt_tokens": prompt,
        "deduplicated_completion_tokens": completion,
        "deduplicated_tokens": prompt + completion,
        "deduplicated_seconds": sum(r.deduplicated_seconds for r in shards),
        "deduplicated_usd_saved": sum(usd(r.deduplicated_seconds, r.price_per_hour) for r in shards),
    }


def _cache_report(shards: list[ShardRecord]) -> dict[str, Any]:
    """What the result cache saved: rows served, their tokens, and the engine seconds their answers
    took when computed, at each shard's price per hour (worker/result_cache.py)."""
    prompt = sum(r.cache_hit_prompt_tokens for r in shards)
    completion = sum(r.cache_hit_completion_tokens for r in shards)
    return {
        "result_cache_hits": sum(r.cache_hits for r in shards),
        "result_cache_semantic_hits": sum(r.cache_semantic_hits for r in shards),
        "result_cache_prompt_tokens": prompt,
        "result_cache_completion_tokens": completion,
        "result_cache_tokens": prompt + completion,
        "result_cache_seconds": sum(r.cache_hit_seconds for r in shards),
        "result_cache_usd_saved": sum(usd(r.cache_hit_seconds, r.price_per_hour) for r in shards),
        "result_cache_entries_written": sum(r.cache_entries for r in shards),
    }


def _adapter_report(shards: list[ShardRecord]) -> dict[str, Any]:
    """A job with LoRA adapters: `adapters` {name: usage} and `base` (the model's own rows), each with
    its cost: a shard's cost shared by its adapters' engine seconds (by rows where it computed none)."""
    totals: dict[str, AdapterUsage] = {}
    costs: dict[str, float] = {}
    for r in shards:
        busy = sum(u.busy_seconds for u in r.adapters.values())
        rows = sum(u.rows for u in r.adapters.values())
        for name, usage in r.adapters.items():
            totals[name] = totals.get(name, AdapterUsage()) + usage
            share = usage.busy_seconds / busy if busy else usage.rows / rows if rows else 0.0
            costs[name] = costs.get(name, 0.0) + r.cost_usd * share
    if not totals:
        return {}

    def entry(name: str) -> dict[str, Any]:
        u = totals.get(name, AdapterUsage())
        tokens = u.prompt_tokens + u.completion_tokens
        return {**u.model_dump(), "cost_usd": costs.get(name, 0.0),
                "tokens_per_second": tokens / u.busy_seconds if u.busy_seconds else None}  # fmt: skip

    return {"adapters": {name: entry(name) for name in sorted(totals) if name != BASE_USAGE},
            "base": entry(BASE_USAGE)}  # fmt: skip


def build_report(
    job_id: str,
    shards: list[ShardRecord],
    attempts: list[AttemptRecord],
    *,
    started_at: float,
    finished_at: float,
    default_instance_type: str,
    default_market: Market,
    default_price_per_hour: float,
) -> dict[str, Any]:
    """cost.json: the design's keys (and a few more), summed over shard and attempt records."""
    shards = sorted(shards, key=lambda r: r.shard)
    prompt = sum(r.prompt_tokens for r in shards)
    cached = sum(r.cached_tokens for r in shards)
    completion = sum(r.completion_tokens for r in shards)
    reasoning = sum(r.reasoning_tokens for r in shards)
    busy = sum(r.busy_seconds for r in shards)
    prefill_s = sum(r.prefill_seconds for r in shards)
    decode_s = sum(r.decode_seconds for r in shards)
    proposed = sum(r.spec_proposed_tokens for r in shards)
    accepted = sum(r.spec_accepted_tokens for r in shards)
    grammar_cut = sum(r.spec_grammar_cut_tokens for r in shards)
    billed = sum(r.billed_seconds for r in shards) + sum(a.billed_seconds for a in attempts)
    cost = sum(r.cost_usd for r in shards) + sum(a.cost_usd for a in attempts)
    on_demand = sum(r.on_demand_cost_usd for r in shards) + sum(a.on_demand_cost_usd for a in attempts)
    types = Counter(r.instance_type for r in shards) or Counter([default_instance_type])
    markets = {r.market for r in shards} or {default_market}
    input_cost, output_cost = split_cost(cost, prefill_s, decode_s, prompt - cached, completion)
    return {
        "job_id": job_id,
        "rows": sum(r.rows for r in shards),
        "rows_failed": sum(r.rows_failed for r in shards),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "completion_tokens": completion,
        # of completion_tokens, the thinking (priced as output: its share of the output cost)
        "reasoning_tokens": reasoning,
        "answer_tokens": completion - reasoning,
        "busy_seconds": busy,
        "prefill_seconds": prefill_s,
        "decode_seconds": decode_s,
        "load_seconds": sum(r.load_seconds for r in shards),
        "constrained_rows": sum(r.constrained_rows for r in shards),
        "mask_seconds": sum(r.mask_seconds for r in shards),
        "billed_seconds": billed,
        "wall_seconds": max(0.0, finished_at - started_at),
        "instance_type": ",".join(t for t, _ in types.most_common()),
        "market": markets.pop() if len(markets) == 1 else "mixed",
        # effective price: what the billed seconds cost per hour (the table price on one instance type)
        "price_per_hour": cost / billed * 3600.0 if billed else default_price_per_hour,
        "cost_usd": cost,
        # the cost split by engine time (split_cost); each side per million of its tokens
        "input_cost_usd": input_cost,
        "output_cost_usd": output_cost,
        "reasoning_cost_usd": output_cost * reasoning / completion if completion else 0.0,
        "usd_per_million_input_tokens": _per_million(input_cost, prompt),
        "usd_per_million_output_tokens": _per_million(output_cost, completion),
        "tokens_per_second": (prompt + completion) / busy if busy else None,
        "cache_hit_rate": cached / prompt if prompt else 0.0,
        "spec_proposed_tokens": proposed,
        "spec_accepted_tokens": accepted,
        "spec_acceptance_rate": accepted / proposed if proposed else None,
        "spec_grammar_cut_tokens": grammar_cut,
        **_dedup_report(shards),
        **_cache_report(shards),
        **_adapter_report(shards),
        "on_demand_cost_usd": on_demand,
        "wasted_cost_usd": sum(a.wasted_usd for a in attempts),
        "uncommitted_attempts": len(attempts),
        "started_at": started_at,
        "finished_at": finished_at,
        "shards": [r.model_dump(mode="json") for r in shards],
    }
