"""JobReader: one job OUT's objects, read through the ObjectCache, from a StoreIndex listing.

What `freight status` and `freight cost` read (the manifest, the shards' cost records, the waste
records, cost.json), but each object once per process, and the sums over a job's shard records
kept between polls (JobTotals): a record never changes once committed, so a poll adds the records
that committed since the last one, and a 10,000-shard job costs what its new shards cost.
"""

from __future__ import annotations

import bisect
import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from jobs.cost import AttemptRecord, ShardRecord, split_cost, usd
from jobs.dashboard.objects import ObjectCache
from jobs.dashboard.scan import OutKeys
from jobs.errors import ObjectNotFoundError
from jobs.finalize import load_shard_record
from jobs.manifest import COST_KEY, MANIFEST_KEY, Manifest, read_manifest, shard_record_key
from jobs.markers import failure_key
from jobs.storage import ObjectStore


@dataclass
class JobTotals:
    """Sums over the committed shards' records added so far (jobs.cost.build_report's sums, kept)."""

    shards: set[int] = field(default_factory=set)
    rows: int = 0
    rows_failed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    busy_seconds: float = 0.0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    cost_usd: float = 0.0
    on_demand_cost_usd: float = 0.0
    busy_cost_usd: float = 0.0  # each shard's cost times its engine-busy share of its billed time
    market_cost_usd: Counter[str] = field(default_factory=Counter)
    spec_proposed_tokens: int = 0
    spec_accepted_tokens: int = 0
    constrained_rows: int = 0
    result_cache_hits: int = 0
    result_cache_semantic_hits: int = 0
    result_cache_usd_saved: float = 0.0
    deduplicated_rows: int = 0
    first_started_at: float | None = None
    billed: list[tuple[float, float]] = field(default_factory=list)  # (finished_at, cost), sorted
    with_failed_rows: list[int] = field(default_factory=list)  # shards with a failed row, sorted
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, r: ShardRecord) -> None:
        self.shards.add(r.shard)
        self.rows += r.rows
        self.rows_failed += r.rows_failed
        self.prompt_tokens += r.prompt_tokens
        self.cached_tokens += r.cached_tokens
        self.completion_tokens += r.completion_tokens
        self.reasoning_tokens += r.reasoning_tokens
        self.busy_seconds += r.busy_seconds
        self.prefill_seconds += r.prefill_seconds
        self.decode_seconds += r.decode_seconds
        self.cost_usd += r.cost_usd
        self.on_demand_cost_usd += r.on_demand_cost_usd
        if r.billed_seconds > 0:
            self.busy_cost_usd += r.cost_usd * min(r.busy_seconds / r.billed_seconds, 1.0)
        self.market_cost_usd[r.market] += r.cost_usd
        self.spec_proposed_tokens += r.spec_proposed_tokens
        self.spec_accepted_tokens += r.spec_accepted_tokens
        self.constrained_rows += r.constrained_rows
        self.result_cache_hits += r.cache_hits
        self.result_cache_semantic_hits += r.cache_semantic_hits
        self.result_cache_usd_saved += usd(r.cache_hit_seconds, r.price_per_hour)
        self.deduplicated_rows += r.deduplicated_rows
        if self.first_started_at is None or r.started_at < self.first_started_at:
            self.first_started_at = r.started_at
        bisect.insort(self.billed, (r.finished_at, r.cost_usd))
        if r.rows_failed:
            bisect.insort(self.with_failed_rows, r.shard)


class JobReader:
    """Reads of one OUT (`store`: the OUT itself) that the dashboard's views share."""

    def __init__(self, store: ObjectStore, out: OutKeys, cache: ObjectCache, totals: JobTotals) -> None:
        self.store, self.out, self.cache, self._totals = store, out, cache, totals

    def manifest(self) -> Manifest:
        return self.cache.get(self.store.url_of(MANIFEST_KEY), lambda: read_manifest(self.store))

    def shard_record(self, index: int) -> ShardRecord:
        return self.cache.get(self.store.url_of(shard_record_key(index)), lambda: load_shard_record(self.store, index))

    def totals(self) -> JobTotals:
        """The sums over every committed shard whose record is readable (a shard committed a moment
        before its record, by a worker that died in between, joins once the record appears)."""
        with self._totals.lock:
            for index in sorted(self.out.committed - self._totals.shards):
                try:
                    self._totals.add(self.shard_record(index))
                except ObjectNotFoundError:
                    continue
            return self._totals

    def shard_records(self, indices: list[int]) -> list[ShardRecord]:
        """The records of these committed shards (those readable), by shard."""
        out = []
        for index in sorted(indices):
            try:
                out.append(self.shard_record(index))
            except ObjectNotFoundError:
                continue
        return out

    def attempt_records(self) -> list[AttemptRecord]:
        return [
            self.cache.get(self.store.url_of(k), lambda k=k: AttemptRecord.model_validate_json(self.store.get(k)))
            for k in self.out.waste
        ]

    def final_report(self) -> dict[str, Any] | None:
        """cost.json of a finalized job (written once, by finalize), else None."""
        if not self.out.has(COST_KEY):
            return None
        return self.cache.get(self.store.url_of(COST_KEY), lambda: json.loads(self.store.get(COST_KEY)))

    def report(self) -> dict[str, Any]:
        """The cost report's figures: cost.json's once finalized, else build_report's over the shards
        committed so far (the same sums and the same input/output split; no per-shard list)."""
        final = self.final_report()
        if final is not None:
            return final
        t, attempts = self.totals(), self.attempt_records()
        cost = t.cost_usd + sum(a.cost_usd for a in attempts)
        input_cost, output_cost = split_cost(cost, t.prefill_seconds, t.decode_seconds,
                                             t.prompt_tokens - t.cached_tokens, t.completion_tokens)  # fmt: skip
        return {
            "rows": t.rows, "rows_failed": t.rows_failed, "prompt_tokens": t.prompt_tokens,
            "cached_tokens": t.cached_tokens, "completion_tokens": t.completion_tokens,
            "reasoning_tokens": t.reasoning_tokens,
            "busy_seconds": t.busy_seconds, "cost_usd": cost, "input_cost_usd": input_cost,
            "output_cost_usd": output_cost,
            "usd_per_million_input_tokens": input_cost / t.prompt_tokens * 1e6 if t.prompt_tokens else None,
            "usd_per_million_output_tokens": output_cost / t.completion_tokens * 1e6 if t.completion_tokens else None,
            "cache_hit_rate": t.cached_tokens / t.prompt_tokens if t.prompt_tokens else 0.0,
            "spec_proposed_tokens": t.spec_proposed_tokens, "spec_accepted_tokens": t.spec_accepted_tokens,
            "constrained_rows": t.constrained_rows, "result_cache_hits": t.result_cache_hits,
            "result_cache_semantic_hits": t.result_cache_semantic_hits,
            "result_cache_usd_saved": t.result_cache_usd_saved, "deduplicated_rows": t.deduplicated_rows,
            "on_demand_cost_usd": t.on_demand_cost_usd + sum(a.on_demand_cost_usd for a in attempts),
            "wasted_cost_usd": sum(a.wasted_usd for a in attempts),
        }  # fmt: skip

    def failures(self) -> list[dict[str, Any]]:
        """The records of the shards that failed for good (jobs.markers.read_failures), by shard."""
        keys = [failure_key(i) for i in sorted(self.out.failed)]
        return [self.cache.get(self.store.url_of(k), lambda k=k: json.loads(self.store.get(k))) for k in keys]
