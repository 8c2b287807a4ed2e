"""Durable markers that distributed mode writes in OUT (storage stays the truth; Redis may forget).

OUT/_CANCELLED             the job was cancelled (JSON: job_id, at); committed shards stay
OUT/failures/<n>.json      shard n failed for good (JSON: job_id, shard, rows, attempts, reason, at)
OUT/failures.json          the failures manifest: every failed shard, written when the last shard ends
"""

from __future__ import annotations

import json
import time
from typing import Any

from jobs.storage import ObjectStore

CANCEL_KEY = "_CANCELLED"
FAILURES_PREFIX = "failures/"
FAILURES_KEY = "failures.json"


def failure_key(shard: int) -> str:
    return f"{FAILURES_PREFIX}{shard:05d}.json"


def write_cancel(store: ObjectStore, job_id: str) -> bool:
    """Write the cancel marker; False if it was already there."""
    return store.put_if_absent(CANCEL_KEY, json.dumps({"job_id": job_id, "at": time.time()}).encode())


def is_cancelled(store: ObjectStore) -> bool:
    return store.exists(CANCEL_KEY)


def write_failure(store: ObjectStore, record: dict[str, Any]) -> bool:
    """Mark one shard failed (first reason wins); False if it was already marked."""
    return store.put_if_absent(failure_key(int(record["shard"])), json.dumps(record, indent=1).encode())


def is_failed(store: ObjectStore, shard: int) -> bool:
    return store.exists(failure_key(shard))


def read_failures(store: ObjectStore) -> list[dict[str, Any]]:
    """Every failed shard's record, by shard index."""
    keys = [k for k in store.list(FAILURES_PREFIX) if k.endswith(".json")]
    return sorted((json.loads(store.get(k)) for k in keys), key=lambda r: int(r["shard"]))


def failed_shards(store: ObjectStore) -> set[int]:
    prefix = len(FAILURES_PREFIX)
    return {int(k[prefix : -len(".json")]) for k in store.list(FAILURES_PREFIX) if k.endswith(".json")}


def write_failures_manifest(store: ObjectStore, job_id: str) -> list[dict[str, Any]]:
    """OUT/failures.json: {job_id, shards_failed, failures: [...]}; rewritten whole (same content)."""
    failures = read_failures(store)
    body = {"job_id": job_id, "shards_failed": len(failures), "failures": failures}
    store.put(FAILURES_KEY, json.dumps(body, indent=1).encode())
    return failures
