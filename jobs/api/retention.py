"""The sweeper: files past their expires_at are deleted, and with a batch's last output file, the
rows its job kept (shards/, partial/; its manifest and cost report stay).

Driven by the `expiring/<unix s>/<tenant>/<file id>` entries each expiring file has (jobs/api/layout.py),
which list in time order, so a pass reads only what is due. An expired file is gone for reads at its
expires_at already (jobs/api/files.py); the sweeper frees its bytes. A batch's input file is kept
while the batch is unfinished (it still reads it). Also swept: a file's bytes whose record never came
(the server died between the two writes) and, in a local store, temp files of uploads cut off by a
dead server (OrphanSweep).
"""

from __future__ import annotations

import json
from pathlib import Path

from jobs.api.files import FileRecord, delete_file
from jobs.api.layout import (
    EXPIRING_PREFIX,
    KEYS_PREFIX,
    file_record,
    files_prefix,
    job_prefix,
    parse_expiring,
)
from jobs.errors import ObjectNotFoundError
from jobs.log import get_logger
from jobs.manifest import PARTIAL_ROOT, SHARDS_PREFIX
from jobs.storage import ObjectStore

log = get_logger(__name__)

ORPHAN_AGE_S = 86_400.0


def sweep(store: ObjectStore, now: float, in_use: set[tuple[str, str]]) -> int:
    """Delete every file due by `now` but those in `in_use` ((tenant, file id) of unfinished batches'
    inputs); returns how many files went."""
    deleted = 0
    for key in store.list(EXPIRING_PREFIX):
        at, tenant, file_id = parse_expiring(key)
        if at > now:
            break  # keys sort by time
        if (tenant, file_id) in in_use:
            continue
        try:
            record = FileRecord.model_validate(json.loads(store.get(file_record(tenant, file_id))))
        except ObjectNotFoundError:
            store.delete(key)  # deleted by its tenant meanwhile
            continue
        if record.expires_at is not None and record.expires_at > now:
            store.delete(key)  # a stale entry (the record's expiry moved)
            continue
        delete_file(store, tenant, record)
        store.delete(key)
        if record.batch_id is not None:
            purge_job_rows(store, tenant, record.batch_id)
        deleted += 1
        log.info("file_expired", tenant=tenant, file_id=file_id, bytes=record.bytes)
    return deleted


def purge_job_rows(store: ObjectStore, tenant: str, batch_id: str) -> None:
    """Once neither output file of a batch is left, delete the rows its job keeps (shards/, partial/):
    the results leave the store with the files that carry them."""
    from jobs.api.batches import read_record

    batch = read_record(store, tenant, batch_id)
    if batch is None:
        return
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id is not None and store.exists(file_record(tenant, file_id)):
            return
    prefix = job_prefix(tenant, batch_id)
    for key in store.list(f"{prefix}/{SHARDS_PREFIX}") + store.list(f"{prefix}/{PARTIAL_ROOT}"):
        store.delete(key)


class OrphanSweep:
    """Files' bytes without a record, deleted when two passes in a row find them so (the record follows
    its bytes within milliseconds, and passes are ServeConfig.sweep_s apart); in a local store, upload
    temp files a day old too (a server killed mid-upload)."""

    def __init__(self) -> None:
        self._suspects: set[str] = set()

    def __call__(self, store: ObjectStore, now: float) -> int:
        tenants = set()
        for key in store.list(KEYS_PREFIX):
            try:
                tenants.add(json.loads(store.get(key))["tenant"])
            except (ObjectNotFoundError, ValueError, KeyError):
                continue
        gone, suspects = 0, set()
        for tenant in sorted(tenants):
            keys = store.list(files_prefix(tenant))
            records = {k[: -len(".json")] for k in keys if k.endswith(".json")}
            for key in keys:
                if key.endswith(".jsonl") and key[: -len(".jsonl")] not in records:
                    if key in self._suspects:
                        store.delete(key)
                        gone += 1
                    else:
                        suspects.add(key)
            folder = store.local_path(files_prefix(tenant) + "x")
            if folder is not None and folder.parent.is_dir():
                gone += _local_temps(folder.parent, now)
        self._suspects = suspects
        return gone


def _local_temps(folder: Path, now: float) -> int:
    gone = 0
    for path in folder.glob(".tmp-*"):
        try:
            if now - path.stat().st_mtime > ORPHAN_AGE_S:
                path.unlink()
                gone += 1
        except FileNotFoundError:
            continue
    return gone
