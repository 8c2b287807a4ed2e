"""finalize: OUT/cost.json, then OUT/_SUCCESS. Idempotent; any process may call it after the last commit."""

from __future__ import annotations

import json
import time
from typing import Any

from jobs import datasets
from jobs.cost import AttemptRecord, ShardRecord, build_report
from jobs.errors import JobIncompleteError, ObjectNotFoundError
from jobs.manifest import (
    COST_KEY,
    RECORD_METADATA_KEY,
    SHARDS_PREFIX,
    SUCCESS_KEY,
    Manifest,
    legacy_shard_record_key,
    read_manifest,
    shard_record_key,
    shard_result_key,
)
from jobs.result_cache.merge import merge_job_index
from jobs.storage import ObjectStore


def committed_shards(store: ObjectStore) -> set[int]:
    """Indices of shards whose result object exists (the definition of done)."""
    return {
        int(k[len(SHARDS_PREFIX) : -len(".parquet")])
        for k in store.list(SHARDS_PREFIX)
        if k.endswith(".parquet")
    }


def load_shard_record(store: ObjectStore, index: int) -> ShardRecord:
    """The shard's record: OUT/costs/<n>.json, OUT/shards/<n>.json (a job written before the costs/
    layout), or the copy in the result's Parquet metadata (a worker that died right after its commit)."""
    for key in (shard_record_key(index), legacy_shard_record_key(index)):
        try:
            return ShardRecord.model_validate_json(store.get(key))
        except ObjectNotFoundError:
            continue
    meta = datasets.read_result_schema(store.get(shard_result_key(index))).metadata or {}
    if RECORD_METADATA_KEY not in meta:
        raise ObjectNotFoundError(
            f"{store.url_of(shard_result_key(index))} is committed but its cost record is missing "
            f"({shard_record_key(index)} and the Parquet metadata {RECORD_METADATA_KEY.decode()})"
        )
    return ShardRecord.model_validate(json.loads(meta[RECORD_METADATA_KEY]))


def move_legacy_records(store: ObjectStore) -> int:
    """Move the records of a job written before the costs/ layout (OUT/shards/<n>.json) to
    OUT/costs/<n>.json, so OUT/shards/ holds Parquet only; returns how many moved. Idempotent: a record
    is copied (put_if_absent: a record already in costs/ stands) before its old object is deleted."""
    moved = 0
    for key in store.list(SHARDS_PREFIX):
        if not key.endswith(".json"):
            continue
        index = int(key[len(SHARDS_PREFIX) : -len(".json")])
        store.put_if_absent(shard_record_key(index), store.get(key))
        store.delete(key)
        moved += 1
    return moved


def load_attempt_records(store: ObjectStore) -> list[AttemptRecord]:
    return [
        AttemptRecord.model_validate_json(store.get(k)) for k in store.list("waste/") if k.endswith(".json")
    ]


def report_now(store: ObjectStore, manifest: Manifest, shard_indices: list[int]) -> dict[str, Any]:
    """The cost report over these committed shards (and every recorded wasted attempt), as of now."""
    return build_report(
        manifest.job_id,
        [load_shard_record(store, i) for i in shard_indices],
        load_attempt_records(store),
        started_at=manifest.created_at,
        finished_at=time.time(),
        default_instance_type=manifest.spec.instance_type,
        default_market=manifest.spec.market,
        default_price_per_hour=manifest.price_per_hour,
    )


def finalize(store: ObjectStore, manifest: Manifest | None = None) -> dict[str, Any]:
    """Write cost.json (once: put_if_absent) then _SUCCESS; return the cost report.

    Raises JobIncompleteError naming the uncommitted shards. Calling it again returns the same report.
    """
    move_legacy_records(store)  # an old-layout job leaves OUT/shards/ readable as one table
    if store.exists(SUCCESS_KEY):
        return json.loads(store.get(COST_KEY))
    manifest = manifest or read_manifest(store)
    done = committed_shards(store)
    missing = [s.index for s in manifest.shards if s.index not in done]
    if missing:
        head = ", ".join(str(i) for i in missing[:10]) + (" ..." if len(missing) > 10 else "")
        raise JobIncompleteError(
            f"{len(missing)} of {len(manifest.shards)} shards not committed yet ({head})"
        )
    report = report_now(store, manifest, [s.index for s in manifest.shards])
    report["state"] = "succeeded"
    data = json.dumps(report, indent=1).encode()
    if not store.put_if_absent(COST_KEY, data):
        report = json.loads(store.get(COST_KEY))  # another finalizer won; its report stands
    else:
        merge_job_index(store, manifest.job_id, {s["cache_space"] for s in report["shards"] if s.get("cache_space")})
    store.put_if_absent(SUCCESS_KEY, b"")
    return report
