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
    SUCCESS_KEY,
    Manifest,
    read_manifest,
    shard_record_key,
    shard_result_key,
)
from jobs.storage import ObjectStore


def committed_shards(store: ObjectStore) -> set[int]:
    """Indices of shards whose result object exists (the definition of done)."""
    return {
        int(k[len("shards/") : -len(".parquet")]) for k in store.list("shards/") if k.endswith(".parquet")
    }


def load_shard_record(store: ObjectStore, index: int) -> ShardRecord:
    """The shard's record: OUT/shards/<n>.json, or the copy in the result's Parquet metadata."""
    try:
        return ShardRecord.model_validate_json(store.get(shard_record_key(index)))
    except ObjectNotFoundError:
        meta = datasets.read_result_schema(store.get(shard_result_key(index))).metadata or {}
        if RECORD_METADATA_KEY not in meta:
            raise
        return ShardRecord.model_validate(json.loads(meta[RECORD_METADATA_KEY]))


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
    store.put_if_absent(SUCCESS_KEY, b"")
    return report
