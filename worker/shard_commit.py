"""Committing a computed shard, and what a shard attempt leaves behind when it doesn't commit.

The result object OUT/shards/<n>.parquet is created with put_if_absent; its Parquet metadata carries
the shard record too (so the record commits atomically with the rows), and the winner then writes
OUT/costs/<n>.json and drops the shard's partial files. A loser records its attempt under waste/.
OUT/shards/ holds the Parquet results only (standard readers open the folder with no flags).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from jobs import datasets
from jobs.cost import AttemptRecord, ShardPricing, ShardRecord, usd
from jobs.manifest import (
    RECORD_METADATA_KEY,
    Manifest,
    partial_prefix,
    shard_record_key,
    shard_result_key,
    waste_key,
)
from jobs.storage import ObjectStore
from worker.shard_rows import RowResult, rows_table

Status = Literal["committed", "already_committed", "lost_race", "interrupted"]


@dataclass(frozen=True)
class ShardOutcome:
    """What a shard attempt did. `record` is set when it committed; `attempt_record` when it did not
    commit after doing work (interrupted, lost race)."""

    shard: int
    status: Status
    rows: int
    rows_failed: int
    record: ShardRecord | None = None
    attempt_record: AttemptRecord | None = None


@dataclass(frozen=True)
class ComputedShard:
    """A shard whose rows are all done (in input order), not yet committed."""

    manifest: Manifest
    rows: list[RowResult]
    record: ShardRecord
    pricing: ShardPricing
    rows_attempted: int  # rows this attempt ran through the engine

    @property
    def index(self) -> int:
        return self.record.shard


def commit_shard(store: ObjectStore, shard: ComputedShard) -> ShardOutcome:
    """Commit `shard` unless another attempt already did ("lost_race": its cost goes to waste/)."""
    record = shard.record
    likelihood = shard.manifest.spec.continuation_column is not None
    out = rows_table(shard.rows, likelihood, with_row=False, id_type=shard.manifest.input.id_type)
    out = out.replace_schema_metadata({RECORD_METADATA_KEY: record.model_dump_json().encode()})
    if not store.put_if_absent(shard_result_key(shard.index), datasets.write_result(out)):
        rec = attempt_record(
            shard.manifest,
            shard.index,
            record.attempt,
            "lost_race",
            shard.pricing,
            record.billed_seconds,
            shard.rows_attempted,
            0,
            record.worker,
        )
        store.put(waste_key(shard.index, record.attempt, uuid.uuid4().hex[:8]), rec.model_dump_json().encode())
        return ShardOutcome(
            shard=shard.index,
            status="lost_race",
            rows=record.rows,
            rows_failed=record.rows_failed,
            attempt_record=rec,
        )
    store.put(shard_record_key(shard.index), record.model_dump_json(indent=1).encode())
    for key in store.list(partial_prefix(shard.index)):
        store.delete(key)  # the committed result supersedes them
    return ShardOutcome(
        shard=shard.index, status="committed", rows=record.rows, rows_failed=record.rows_failed, record=record
    )


def attempt_record(
    manifest: Manifest,
    shard: int,
    attempt: int,
    reason: Any,
    pricing: ShardPricing,
    billed_seconds: float,
    attempted: int,
    saved: int,
    worker: str,
) -> AttemptRecord:
    """The cost record of an attempt that did not commit; `saved` of its `attempted` rows are kept."""
    cost = usd(billed_seconds, pricing.price_per_hour)
    kept = saved / attempted if attempted else 0.0  # share of the attempt's work the next attempt reuses
    return AttemptRecord(
        job_id=manifest.job_id,
        shard=shard,
        attempt=attempt,
        reason=reason,
        rows_attempted=attempted,
        rows_saved=saved,
        billed_seconds=billed_seconds,
        instance_type=pricing.instance_type,
        market=pricing.market,
        price_per_hour=pricing.price_per_hour,
        cost_usd=cost,
        on_demand_cost_usd=usd(billed_seconds, pricing.on_demand_price_per_hour),
        wasted_usd=cost * (1.0 - kept),
        worker=worker,
        recorded_at=time.time(),
    )


__all__ = ["ComputedShard", "ShardOutcome", "attempt_record", "commit_shard"]
