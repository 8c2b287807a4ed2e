"""Committing a computed shard, and what a shard attempt leaves behind when it doesn't commit.

The result object OUT/shards/<n>.parquet is created with put_if_absent; its Parquet metadata carries
the shard record too (so the record commits atomically with the rows), and the winner then writes
OUT/costs/<n>.json and drops the shard's partial files. A loser records its attempt under waste/.
OUT/shards/ holds the Parquet results only (standard readers open the folder with no flags).

"The object exists" is not always a lost race: when the conditional PUT reached S3 but its response
did not come back (a reset or a read timeout after S3 stored it), the client's retry meets the
object its first try created and gets 412. The metadata's commit token (jobs.manifest.COMMIT_TOKEN_KEY)
tells this attempt's own object from another attempt's.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa

from jobs import datasets
from jobs.cost import AttemptRecord, ShardPricing, ShardRecord
from jobs.log import get_logger
from jobs.manifest import (
    COMMIT_TOKEN_KEY,
    RECORD_METADATA_KEY,
    Manifest,
    partial_prefix,
    shard_record_key,
    shard_result_key,
    waste_key,
)
from jobs.storage import ObjectStore
from worker.shard_rows import RowResult, rows_table

log = get_logger(__name__)
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
    # names this result's commit in its Parquet metadata; unique even between two deliveries of the
    # same shard with the same attempt number on the same worker (the record alone may not differ)
    commit_token: str = field(default_factory=lambda: uuid.uuid4().hex)
    # the job's result cache and the entries of the rows this attempt computed, written once committed
    cache_write: tuple[Any, list[Any]] | None = None

    @property
    def index(self) -> int:
        return self.record.shard


def commit_shard(store: ObjectStore, shard: ComputedShard) -> ShardOutcome:
    """Commit `shard` unless another attempt already did ("lost_race": its cost goes to waste/)."""
    record = shard.record
    likelihood = shard.manifest.spec.continuation_column is not None
    out = rows_table(shard.rows, likelihood, with_row=False, id_type=shard.manifest.input.id_type)
    meta = {RECORD_METADATA_KEY: record.model_dump_json().encode(), COMMIT_TOKEN_KEY: shard.commit_token.encode()}
    out = out.replace_schema_metadata(meta)
    key, token = shard_result_key(shard.index), shard.commit_token
    if not store.put_if_absent(key, datasets.write_result(out)) and not committed_by(store, key, token):
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
    for partial in store.list(partial_prefix(shard.index)):
        store.delete(partial)  # the committed result supersedes them
    if shard.cache_write is not None:  # only the commit's winner writes: the cache's exactly-once rule
        cache, entries = shard.cache_write
        cache.space.write(entries, record.job_id, shard.index, now=record.finished_at,
                          embedder=cache.semantic.embedder if cache.semantic is not None else None)  # fmt: skip
    return ShardOutcome(
        shard=shard.index, status="committed", rows=record.rows, rows_failed=record.rows_failed, record=record
    )


def committed_by(store: ObjectStore, key: str, token: str) -> bool:
    """put_if_absent found `key` already there: True iff it is the object of the commit named `token`
    (its PUT stored it, the response was lost, the client's retry got 412), False for another
    attempt's object (a lost race).

    Storage errors propagate (StorageUnavailableError, access refused, ObjectNotFoundError): without
    the object's metadata nothing says whose it is, and either guess can be wrong. "Committed" would
    write this attempt's record to costs/<n>.json, which finalize prefers to the object's own, so the
    job would bill another attempt's record; "lost_race" bills this attempt twice if the object is its
    own and, if the object has gone since, has the shard counted done when it is not. Raising leaves it
    to the caller's failure path: a Celery attempt counts a storage outage (no strike), backs off and
    is requeued, and the next delivery finds the shard committed and acks it (or, the object gone,
    computes it again); the embedded runner stops with the error and a rerun skips the committed shard.
    """
    data = store.get(key)
    try:
        meta = datasets.read_result_schema(data).metadata or {}
    except (pa.ArrowInvalid, OSError):
        return False  # not a Parquet file this code wrote, so not this commit's
    if meta.get(COMMIT_TOKEN_KEY) != token.encode():
        return False
    log.warning("shard_commit_response_lost", shard_key=key)  # the retry's 412 met this commit's own object
    return True


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
    charge = pricing.charge(billed_seconds)
    kept = saved / attempted if attempted else 0.0  # share of the attempt's work the next attempt reuses
    return AttemptRecord(
        job_id=manifest.job_id,
        shard=shard,
        attempt=attempt,
        reason=reason,
        rows_attempted=attempted,
        rows_saved=saved,
        billed_seconds=billed_seconds,
        **charge,
        wasted_usd=charge["cost_usd"] * (1.0 - kept),
        worker=worker,
        recorded_at=time.time(),
    )


__all__ = ["ComputedShard", "ShardOutcome", "attempt_record", "commit_shard", "committed_by"]
