"""File records: the OpenAI file object of each upload and each batch output, kept in the store.

A file is two objects (jobs/api/layout.py): its bytes (`<id>.jsonl`) and its record (`<id>.json`).
The bytes are published first, the record second, so a listed file always has its bytes; deleting
goes the other way (record first), so a deleted file leaves listings at once. A file past its
`expires_at` is gone for every read at that second, whether or not the sweeper
(jobs/api/retention.py) has removed its objects yet.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from jobs.api.ids import FILE_PREFIX, is_id
from jobs.api.layout import expiring_key, file_content, file_record, files_prefix
from jobs.errors import ObjectNotFoundError
from jobs.storage import ObjectStore

PUBLIC_FIELDS = ("id", "object", "bytes", "created_at", "filename", "purpose", "status", "expires_at", "status_details")


class FileRecord(BaseModel):
    """The OpenAI file object (PUBLIC_FIELDS, the API's answer) and freight's own fields."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str
    object: Literal["file"] = "file"
    bytes: int = Field(ge=0)
    created_at: int
    filename: str
    purpose: Literal["batch", "batch_output"]
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None
    # freight's fields
    lines: int = Field(0, ge=0, description="non-blank lines: the requests of a batch file")
    batch_id: str | None = Field(None, description="the batch a batch_output file came from")

    def public(self) -> dict[str, Any]:
        """The OpenAI file object."""
        return self.model_dump(include=set(PUBLIC_FIELDS))

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (time.time() if now is None else now) >= self.expires_at


def save_record(store: ObjectStore, tenant: str, record: FileRecord) -> None:
    """Write the record (its bytes are in the store already) and its entry in the sweeper's list."""
    if record.expires_at is not None:
        store.put(expiring_key(record.expires_at, tenant, record.id), b"")
    store.put(file_record(tenant, record.id), record.model_dump_json().encode())


def read_record(store: ObjectStore, tenant: str, file_id: str, now: float | None = None) -> FileRecord | None:
    """The tenant's file `file_id`, or None: not an id, another tenant's, deleted or expired."""
    if not is_id(FILE_PREFIX, file_id):
        return None
    try:
        record = FileRecord.model_validate(json.loads(store.get(file_record(tenant, file_id))))
    except ObjectNotFoundError:
        return None
    return None if record.expired(now) else record


def file_ids(store: ObjectStore, tenant: str) -> list[str]:
    """The ids of the tenant's file records, oldest first (ids sort by creation time)."""
    prefix = files_prefix(tenant)
    return [k[len(prefix) : -len(".json")] for k in store.list(prefix) if k.endswith(".json")]


def delete_file(store: ObjectStore, tenant: str, record: FileRecord) -> None:
    """Record first (the file leaves listings), then its bytes and its sweeper entry."""
    store.delete(file_record(tenant, record.id))
    store.delete(file_content(tenant, record.id))
    if record.expires_at is not None:
        store.delete(expiring_key(record.expires_at, tenant, record.id))


def stored_bytes(store: ObjectStore, tenant: str) -> int:
    """Bytes of the tenant's files (uploads and batch outputs), from one listing."""
    return sum(size for key, size in store.sizes(files_prefix(tenant)) if key.endswith(".jsonl"))
