"""A batch's end: its output and error files written (what `freight results --format openai` writes)
and its record made final, with request counts and usage.

Idempotent, so a batch process that dies mid-way redoes it from the start: the file ids are chosen
once and kept in the record (`pending_*_file_id`) before a byte is written, and each file is
published whole (ObjectWriter) and then recorded. A file is made only when it has a line, as
OpenAI's are: a batch whose requests all ran has no error file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from jobs.api.batches import BatchRecord, RequestCounts, save_record
from jobs.api.config import ServeConfig
from jobs.api.files import FileRecord
from jobs.api.files import save_record as save_file
from jobs.api.ids import FILE_PREFIX, new_id
from jobs.api.layout import file_content
from jobs.finalize import committed_shards
from jobs.manifest import Manifest
from jobs.openai_output import OpenAIExport, export_openai
from jobs.settings import Settings
from jobs.storage import ObjectStore
from jobs.storage.base import ObjectWriter

# a job's end -> the batch's final status
FINAL_STATUS = {"succeeded": "completed", "cancelled": "cancelled", "expired": "expired", "failed": "failed"}


@dataclass(frozen=True)
class Ending:
    """How the job ended: `kind` (a key of FINAL_STATUS); `errors`: errors.data of a failed one."""

    kind: str
    errors: list[dict[str, Any]] | None = None


class _Counting(ObjectWriter):
    """A writer that counts lines and publishes only when it got some."""

    def __init__(self, inner: ObjectWriter) -> None:
        self.inner, self.lines = inner, 0

    def write(self, data: bytes) -> int:
        self.lines += data.count(b"\n")
        self.bytes_written += len(data)
        return self.inner.write(data)

    def commit(self) -> None:
        if self.lines:
            self.inner.commit()
        else:
            self.inner.abort()

    def abort(self) -> None:
        self.inner.abort()


def finish_batch(
    store: ObjectStore,
    record: BatchRecord,
    job: ObjectStore,
    manifest: Manifest,
    ending: Ending,
    config: ServeConfig,
    settings: Settings,
    cancel_at: int | None = None,
) -> BatchRecord:
    """Write the batch's output and error files from its job `job`, then its final record; returns it."""
    if record.pending_output_file_id is None or record.pending_error_file_id is None:
        record = record.model_copy(update={"pending_output_file_id": new_id(FILE_PREFIX),
                                           "pending_error_file_id": new_id(FILE_PREFIX)})  # fmt: skip
        save_record(store, record)
    out_id, err_id = record.pending_output_file_id, record.pending_error_file_id
    assert out_id is not None and err_id is not None  # set just above
    ended = None if ending.kind == "succeeded" else ending.kind
    output = _Counting(store.writer(file_content(record.tenant, out_id)))
    errors = _Counting(store.writer(file_content(record.tenant, err_id)))
    with output, errors:
        done = export_openai(job, manifest, sorted(committed_shards(job)), output, errors, ended, settings)
    now = int(time.time())
    ttl = record.output_expires_after or config.output_ttl_s
    made: dict[str, str | None] = {}
    for field, file_id, writer, suffix in (("output_file_id", out_id, output, "output"),
                                           ("error_file_id", err_id, errors, "error")):  # fmt: skip
        made[field] = None
        if writer.lines:
            save_file(store, record.tenant, FileRecord(
                id=file_id, bytes=writer.bytes_written, created_at=now, filename=f"{record.id}_{suffix}.jsonl",
                purpose="batch_output", expires_at=None if ttl is None else now + ttl, lines=writer.lines,
                batch_id=record.id,
            ))  # fmt: skip
            made[field] = file_id
    status = FINAL_STATUS[ending.kind]
    update: dict[str, Any] = {
        "status": status,
        f"{status}_at": now,
        **made,
        "request_counts": RequestCounts(total=done.requests, completed=done.requests - done.failed, failed=done.failed),
        "usage": usage(done),
        "pending_output_file_id": None,
        "pending_error_file_id": None,
    }
    if status == "cancelled":
        update["cancelling_at"] = cancel_at or now
    if ending.errors:
        update["errors"] = {"object": "list", "data": ending.errors}
    final = record.model_copy(update=update)
    save_record(store, final)
    return final


def usage(done: OpenAIExport) -> dict[str, Any]:
    """The batch's usage (the SDK's BatchUsage) from the tokens of the requests that ran."""
    return {
        "input_tokens": done.prompt_tokens,
        "input_tokens_details": {"cached_tokens": done.cached_tokens},
        "output_tokens": done.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    }
