"""Batch records: the OpenAI batch object of each batch, kept in the store beside its freight job.

The API writes a record once, at create (status validating), with the `active/` entry that puts
the batch on the batch process's work list; from then on the batch process is the record's only
writer (validating -> in_progress -> finalizing -> a final state, live request counts). A cancel is
the job's `_CANCELLED` marker (jobs/markers.py), written by the API: its presence makes an unfinished
batch read as "cancelling" until the batch process records "cancelled". So the record plus one
marker is the whole state, and a restarted server reads everything back from the store.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from jobs.api.ids import BATCH_PREFIX, is_id
from jobs.api.layout import active_key, batch_record, batches_prefix, job_prefix
from jobs.errors import ObjectNotFoundError
from jobs.markers import CANCEL_KEY
from jobs.storage import ObjectStore

Status = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"]
FINAL: tuple[Status, ...] = ("completed", "failed", "expired", "cancelled")
UNFINISHED: tuple[Status, ...] = ("validating", "in_progress", "finalizing")

PUBLIC_FIELDS = (
    "id", "object", "endpoint", "errors", "input_file_id", "completion_window", "status", "output_file_id",
    "error_file_id", "created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at",
    "failed_at", "expired_at", "cancelling_at", "cancelled_at", "request_counts", "metadata", "model", "usage",
)  # fmt: skip


class RequestCounts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchRecord(BaseModel):
    """The OpenAI batch object (PUBLIC_FIELDS: every field of the SDK's `Batch`) and freight's fields."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: dict[str, Any] | None = None  # {"object": "list", "data": [{code, message, param, line}]}
    input_file_id: str
    completion_window: str
    status: Status = "validating"
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = RequestCounts()
    metadata: dict[str, str] | None = None
    model: str | None = None
    usage: dict[str, Any] | None = None  # {input_tokens, input_tokens_details, output_tokens, ...}
    # freight's fields
    tenant: str
    output_expires_after: int | None = Field(None, description="seconds from an output file's creation")
    job_id: str | None = Field(None, description="the freight job (tenants/<t>/jobs/<batch id>/), once planned")
    attempts: int = Field(0, description="times the batch process took the batch up (a crash loop ends at a cap)")
    pending_output_file_id: str | None = Field(None, description="output file id chosen at finalizing")
    pending_error_file_id: str | None = Field(None, description="error file id chosen at finalizing")

    def public(self, cancel_at: int | None = None) -> dict[str, Any]:
        """The OpenAI batch object; `cancel_at`: when a cancel was asked (the job's _CANCELLED marker),
        which makes an unfinished batch "cancelling"."""
        out = self.model_dump(include=set(PUBLIC_FIELDS))
        if cancel_at is not None and self.status in UNFINISHED:
            out["status"] = "cancelling"
            out["cancelling_at"] = cancel_at
        return out

    @property
    def final(self) -> bool:
        return self.status in FINAL


def create_record(store: ObjectStore, record: BatchRecord) -> None:
    """A new batch: its record, then its active/ entry (the batch process's work list)."""
    store.put(batch_record(record.tenant, record.id), record.model_dump_json().encode())
    store.put(active_key(record.tenant, record.id), b"")


def save_record(store: ObjectStore, record: BatchRecord) -> None:
    """Replace the record (the batch process's transitions); a final one leaves the work list."""
    store.put(batch_record(record.tenant, record.id), record.model_dump_json().encode())
    if record.final:
        store.delete(active_key(record.tenant, record.id))


def read_record(store: ObjectStore, tenant: str, batch_id: str) -> BatchRecord | None:
    """The tenant's batch `batch_id`, or None: not an id, or not this tenant's."""
    if not is_id(BATCH_PREFIX, batch_id):
        return None
    try:
        return BatchRecord.model_validate(json.loads(store.get(batch_record(tenant, batch_id))))
    except ObjectNotFoundError:
        return None


def batch_ids(store: ObjectStore, tenant: str) -> list[str]:
    """The tenant's batch ids, oldest first (ids sort by creation time)."""
    prefix = batches_prefix(tenant)
    return [k[len(prefix) : -len(".json")] for k in store.list(prefix) if k.endswith(".json")]


def cancel_key(tenant: str, batch_id: str) -> str:
    """The batch's cancel marker: its job's _CANCELLED (one marker for the API, the batch process and
    the fleet's workers)."""
    return f"{job_prefix(tenant, batch_id)}/{CANCEL_KEY}"


def cancel_time(store: ObjectStore, tenant: str, batch_id: str) -> int | None:
    """When the batch's cancel was asked (unix seconds), or None."""
    try:
        return int(json.loads(store.get(cancel_key(tenant, batch_id)))["at"])
    except ObjectNotFoundError:
        return None


def request_cancel(store: ObjectStore, tenant: str, batch_id: str, job_id: str | None, now: float) -> bool:
    """Write the cancel marker (first wins: False when it was there); the format of jobs/markers.py."""
    body = json.dumps({"job_id": job_id, "at": now}).encode()
    return store.put_if_absent(cancel_key(tenant, batch_id), body)
