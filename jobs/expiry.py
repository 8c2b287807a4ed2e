"""How a job ends: succeeded (finalize), or expired (past its completion window), with notifications.

Expiry, in storage (the truth, like _SUCCESS):

    OUT/cost.json   the cost report over the committed shards and every recorded attempt (partial
                    rows saved by the stopped attempts included), with "state": "expired"
    OUT/_EXPIRED    written after it: {job_id, deadline, at, shards_missing}; its presence means expired

Written once (put_if_absent each) by whoever sees the job over (the embedded runner after its stop;
on the fleet the worker whose shard ended last). A resubmit of the same spec (`reopen`) deletes both,
so the job runs its missing shards and finalizes as usual.
"""

from __future__ import annotations

import json
import time
from typing import Any

from jobs.finalize import committed_shards, finalize, report_now
from jobs.lifecycle import read_lifecycle
from jobs.log import get_logger
from jobs.manifest import COST_KEY, SUCCESS_KEY, Manifest
from jobs.notify import clear_claims, notify_final
from jobs.profile_store import record_report
from jobs.settings import Settings
from jobs.storage import ObjectStore

log = get_logger(__name__)

EXPIRED_KEY = "_EXPIRED"


def is_expired(store: ObjectStore) -> bool:
    return store.exists(EXPIRED_KEY)


def expire_job(store: ObjectStore, manifest: Manifest, settings: Settings) -> dict[str, Any] | None:
    """Write the expired job's cost report, then _EXPIRED, then notify; returns the report (cost.json).

    None when the job is complete after all (every shard committed: it is finalized instead).
    Calling it again returns the same report and sends nothing more.
    """
    if store.exists(SUCCESS_KEY):
        return None
    done = committed_shards(store)
    if len(done) >= len(manifest.shards):
        finalize_and_notify(store, manifest, settings)
        return None
    report = report_now(store, manifest, sorted(done))
    report["state"] = "expired"
    report["shards_missing"] = len(manifest.shards) - len(done)
    if not store.put_if_absent(COST_KEY, json.dumps(report, indent=1).encode()):
        report = json.loads(store.get(COST_KEY))  # another process expired it first; its report stands
    deadline = read_lifecycle(store).deadline
    marker = {"job_id": manifest.job_id, "deadline": deadline, "at": time.time(),
              "shards_missing": report.get("shards_missing")}  # fmt: skip
    if store.put_if_absent(EXPIRED_KEY, json.dumps(marker).encode()):
        log.warning("job_expired", job_id=manifest.job_id, deadline=deadline, rows=report.get("rows"),
                    shards_missing=report.get("shards_missing"), cost_usd=report.get("cost_usd"))  # fmt: skip
    notify_final(store, manifest, "expired", report, settings)
    return report


def finalize_and_notify(store: ObjectStore, manifest: Manifest, settings: Settings) -> dict[str, Any]:
    """finalize (cost.json, _SUCCESS), then the "succeeded" notification (once: see jobs.notify).

    A report left by an expiry that raced the last commit is replaced: every shard is in after all.
    """
    if store.exists(COST_KEY) and not store.exists(SUCCESS_KEY):
        old = json.loads(store.get(COST_KEY))
        if old.get("state") == "expired":
            store.delete(COST_KEY)
            store.delete(EXPIRED_KEY)
    report = finalize(store, manifest)
    notify_final(store, manifest, "succeeded", report, settings)
    record_report(report, manifest, settings)  # every finished job refines its model's profile
    return report


def reopen(store: ObjectStore) -> None:
    """A new submission of the job: lift an expiry (its report goes; the job runs the missing shards
    and finalizes), and let this submission's end notify again."""
    if store.exists(EXPIRED_KEY) and not store.exists(SUCCESS_KEY):
        store.delete(EXPIRED_KEY)
        store.delete(COST_KEY)
    clear_claims(store)
