"""`/v1/files`: upload, list, retrieve, download and delete a tenant's files (OpenAI's Files API)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from itertools import chain
from typing import Any, Literal

from anyio import to_thread
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from jobs.api import batches
from jobs.api.context import ServeContext, serve_context, tenant
from jobs.api.errors import APIError, bad_request, not_found
from jobs.api.files import FileRecord, delete_file, file_ids, read_record, save_record, stored_bytes
from jobs.api.ids import FILE_PREFIX, new_id
from jobs.api.layout import ACTIVE_PREFIX, file_content, parse_active
from jobs.api.pages import page
from jobs.api.retention import purge_job_rows
from jobs.api.tenants import read_limits
from jobs.api.upload import Upload, receive_upload
from jobs.errors import ObjectNotFoundError

router = APIRouter()

MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 30 * 86_400  # OpenAI's bounds of expires_after.seconds
MULTIPART_SLACK = 64 << 10  # a multipart body's bytes beyond its file, at most, for the early quota check
_quota_locks: dict[str, asyncio.Lock] = {}


def quota_error(used: int, adding: int, limit: int) -> APIError:
    return APIError(
        429, f"This upload ({adding:,} bytes) would take your stored files to {used + adding:,} bytes, over "
        f"your limit of {limit:,}: delete files you no longer need (DELETE /v1/files/{{id}}).",
        type="insufficient_quota", code="storage_limit_exceeded",
    )  # fmt: skip


@router.post("/v1/files")
async def create_file(request: Request, who: str = Depends(tenant)) -> dict[str, Any]:
    ctx = serve_context(request)
    limits = await to_thread.run_sync(read_limits, ctx.store, who, ctx.config.limits)
    limit = limits.max_stored_bytes
    if limit is not None:
        declared = max(int(request.headers.get("content-length") or 0) - MULTIPART_SLACK, 0)
        used = await to_thread.run_sync(stored_bytes, ctx.store, who)
        if used + declared > limit:
            raise quota_error(used, declared, limit)
    file_id = new_id(FILE_PREFIX)
    upload = await receive_upload(
        request, lambda: ctx.store.writer(file_content(who, file_id)), ctx.config.max_upload_bytes,
        ctx.config.max_upload_lines,
    )  # fmt: skip
    try:
        expires_at = _expiry(upload, ctx)
        lock = _quota_locks.setdefault(who, asyncio.Lock())
        async with lock:  # two uploads of one tenant cannot both pass the check below
            if limit is not None:
                used = await to_thread.run_sync(stored_bytes, ctx.store, who)
                if used + upload.bytes > limit:
                    raise quota_error(used, upload.bytes, limit)
            await to_thread.run_sync(upload.writer.commit)
    except BaseException:
        upload.writer.abort()
        raise
    now = int(time.time())
    record = FileRecord(
        id=file_id, bytes=upload.bytes, created_at=now, filename=upload.filename, purpose="batch",
        expires_at=None if expires_at is None else now + expires_at, lines=upload.lines,
    )  # fmt: skip
    await to_thread.run_sync(save_record, ctx.store, who, record)
    return record.public()


def _expiry(upload: Upload, ctx: ServeContext) -> int | None:
    """Seconds the file lives: expires_after[seconds] (anchor created_at), else the server's TTL."""
    purpose = upload.fields.get("purpose")
    if purpose is None:
        raise bad_request("Missing required parameter: 'purpose'.", "purpose", "missing_required_parameter")
    if purpose != "batch":
        raise bad_request(f"Invalid purpose '{purpose}': this server keeps batch input files, purpose 'batch'.",
                          "purpose", "invalid_value")  # fmt: skip
    anchor = upload.fields.get("expires_after[anchor]")
    seconds = upload.fields.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return ctx.config.file_ttl_s
    if anchor != "created_at":
        raise bad_request(f"Invalid expires_after[anchor] {anchor!r}: the anchor is 'created_at'.",
                          "expires_after.anchor", "invalid_value")  # fmt: skip
    if seconds is None or not seconds.strip().isdigit() or not MIN_EXPIRY_S <= int(seconds) <= MAX_EXPIRY_S:
        raise bad_request(f"Invalid expires_after[seconds] {seconds!r}: give {MIN_EXPIRY_S} (an hour) to "
                          f"{MAX_EXPIRY_S} (30 days).", "expires_after.seconds", "invalid_value")  # fmt: skip
    return int(seconds)


@router.get("/v1/files")
def list_files(
    request: Request,
    who: str = Depends(tenant),
    after: str | None = None,
    limit: int = Query(10_000, ge=1, le=10_000),
    order: Literal["asc", "desc"] = "desc",
    purpose: str | None = None,
) -> dict[str, Any]:
    ctx = serve_context(request)
    ids = file_ids(ctx.store, who)
    now = time.time()

    def records(chosen: list[str]) -> Iterator[dict[str, Any]]:
        for file_id in chosen:
            record = read_record(ctx.store, who, file_id, now)
            if record is not None and (purpose is None or record.purpose == purpose):
                yield record.public()

    return page(ids, records, after=after, limit=limit, newest_first=order == "desc", what="file")


def _owned(ctx: ServeContext, who: str, file_id: str) -> FileRecord:
    record = read_record(ctx.store, who, file_id)
    if record is None:
        raise not_found("file", file_id, "file_id")
    return record


@router.get("/v1/files/{file_id}")
def retrieve_file(request: Request, file_id: str, who: str = Depends(tenant)) -> dict[str, Any]:
    return _owned(serve_context(request), who, file_id).public()


@router.get("/v1/files/{file_id}/content")
def file_content_route(request: Request, file_id: str, who: str = Depends(tenant)) -> StreamingResponse:
    ctx = serve_context(request)
    record = _owned(ctx, who, file_id)
    chunks = ctx.store.read_chunks(file_content(who, file_id))
    try:  # the first piece here: a file deleted meanwhile is a 404, not a broken answer
        first = next(chunks, b"")
    except ObjectNotFoundError:
        raise not_found("file", file_id, "file_id") from None
    headers = {"content-length": str(record.bytes),
               "content-disposition": f'attachment; filename="{_safe_name(record.filename)}"'}  # fmt: skip
    return StreamingResponse(chain([first], chunks), media_type="application/octet-stream", headers=headers)


def _safe_name(name: str) -> str:
    return "".join(c if c.isprintable() and c not in '"\\' else "_" for c in name)[:200] or "file.jsonl"


@router.delete("/v1/files/{file_id}")
def delete_file_route(request: Request, file_id: str, who: str = Depends(tenant)) -> dict[str, Any]:
    ctx = serve_context(request)
    record = _owned(ctx, who, file_id)
    for key in ctx.store.list(f"{ACTIVE_PREFIX}{who}/"):
        batch = batches.read_record(ctx.store, who, parse_active(key)[1])
        if batch is not None and not batch.final and batch.input_file_id == file_id:
            raise bad_request(
                f"File {file_id} is the input of batch {batch.id}, which is {batch.status}: cancel the batch "
                "(POST /v1/batches/{id}/cancel) or delete the file once it has ended.", "file_id", "file_in_use",
            )  # fmt: skip
    delete_file(ctx.store, who, record)
    if record.batch_id is not None:  # the rows behind a batch's outputs go with its last output file
        purge_job_rows(ctx.store, who, record.batch_id)
    return {"id": file_id, "object": "file", "deleted": True}
