"""`/v1/batches`: create, retrieve, list and cancel a tenant's batches (OpenAI's Batch API), and
`GET /v1/batches/{id}/cost`, freight's cost report of a batch."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

from anyio import to_thread
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jobs.api import files
from jobs.api.batches import (
    BatchRecord,
    RequestCounts,
    batch_ids,
    cancel_time,
    create_record,
    read_record,
    request_cancel,
)
from jobs.api.context import ServeContext, serve_context, tenant
from jobs.api.errors import APIError, bad_request, not_found
from jobs.api.ids import BATCH_PREFIX, new_id
from jobs.api.layout import job_prefix, sub_store
from jobs.api.pages import page
from jobs.api.tenants import batches_in_flight, read_limits
from jobs.endpoints import ENDPOINT_URLS
from jobs.errors import FreightError
from jobs.lifecycle import parse_window

router = APIRouter()

MAX_METADATA_PAIRS, MAX_KEY_CHARS, MAX_VALUE_CHARS = 16, 64, 512
MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 30 * 86_400  # OpenAI's bounds of output_expires_after.seconds
_create_locks: dict[str, threading.Lock] = {}
_locks_lock = threading.Lock()


class OutputExpiresAfter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"]
    seconds: int = Field(ge=MIN_EXPIRY_S, le=MAX_EXPIRY_S)


class CreateBatch(BaseModel):
    """POST /v1/batches's body (OpenAI's BatchCreateParams); unknown fields are refused by name."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    output_expires_after: OutputExpiresAfter | None = None


async def _json_body(request: Request) -> dict[str, Any]:
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise bad_request(f"Content-Type {ctype or '(none)'!r}: send the body as JSON (application/json).",
                          code="unsupported_content_type")  # fmt: skip
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise bad_request(f"The body is not valid JSON ({exc}).", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(f"The body must be a JSON object, not {type(body).__name__}.", code="invalid_json")
    return body


def _parse(body: dict[str, Any]) -> CreateBatch:
    try:
        return CreateBatch.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err.get("loc", ())) or None
        if err.get("type") == "missing":
            raise bad_request(f"Missing required parameter: '{param}'.", param, "missing_required_parameter") from None
        if err.get("type") == "extra_forbidden":
            raise bad_request(f"Unrecognized request argument supplied: '{param}'.", param, "unknown_parameter") from None
        raise bad_request(f"Invalid value for '{param}': {err.get('msg')}.", param, "invalid_value") from None


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise bad_request(f"metadata holds {len(metadata)} pairs: {MAX_METADATA_PAIRS} at most.", "metadata")
    for key, value in metadata.items():
        if len(key) > MAX_KEY_CHARS:
            raise bad_request(f"metadata key {key[:20]!r}... is longer than {MAX_KEY_CHARS} characters.", "metadata")
        if len(value) > MAX_VALUE_CHARS:
            raise bad_request(f"metadata[{key!r}] is longer than {MAX_VALUE_CHARS} characters.", "metadata")


@router.post("/v1/batches")
async def create_batch(request: Request, who: str = Depends(tenant)) -> dict[str, Any]:
    params = _parse(await _json_body(request))
    return await to_thread.run_sync(_create, serve_context(request), who, params)


def _create(ctx: ServeContext, who: str, params: CreateBatch) -> dict[str, Any]:
    if params.endpoint not in ENDPOINT_URLS:
        raise bad_request(f"Invalid endpoint '{params.endpoint}': this server runs {', '.join(ENDPOINT_URLS)}.",
                          "endpoint", "invalid_value")  # fmt: skip
    try:
        window = parse_window(params.completion_window, ctx.config.min_completion_window_s, "completion_window")
    except ValueError as exc:
        raise bad_request(f"Invalid completion_window: {exc}.", "completion_window", "invalid_value") from None
    _check_metadata(params.metadata)
    source = files.read_record(ctx.store, who, params.input_file_id)
    if source is None:
        raise not_found("file", params.input_file_id, "input_file_id")
    if source.purpose != "batch":
        raise bad_request(f"File {source.id} has purpose '{source.purpose}': a batch's input is a file uploaded "
                          "with purpose 'batch'.", "input_file_id", "invalid_file_purpose")  # fmt: skip
    with _locks_lock:
        lock = _create_locks.setdefault(who, threading.Lock())
    with lock:  # two creates of one tenant cannot both pass the limit below
        limit = read_limits(ctx.store, who, ctx.config.limits).max_batches_in_flight
        if limit is not None and batches_in_flight(ctx.store, who) >= limit:
            raise APIError(429, f"You have {limit} batches in flight, your limit: wait for one to end or cancel "
                           "one (POST /v1/batches/{id}/cancel).", type="insufficient_quota",
                           code="batch_limit_exceeded")  # fmt: skip
        now = int(time.time())
        record = BatchRecord(
            id=new_id(BATCH_PREFIX), endpoint=params.endpoint, input_file_id=source.id,
            completion_window=params.completion_window, created_at=now, expires_at=int(now + window),
            request_counts=RequestCounts(total=source.lines), metadata=params.metadata, tenant=who,
            output_expires_after=params.output_expires_after.seconds if params.output_expires_after else None,
        )  # fmt: skip
        create_record(ctx.store, record)
    if ctx.runner is not None:
        ctx.runner.nudge()
    return record.public()


def _owned(ctx: ServeContext, who: str, batch_id: str) -> BatchRecord:
    record = read_record(ctx.store, who, batch_id)
    if record is None:
        raise not_found("batch", batch_id, "batch_id")
    return record


# The poll: answered as JSON straight from the record (no response model to validate it against, no
# jsonable_encoder pass: the record's public fields are JSON values already).
@router.get("/v1/batches/{batch_id}", response_class=JSONResponse)
def retrieve_batch(request: Request, batch_id: str, who: str = Depends(tenant)) -> JSONResponse:
    ctx = serve_context(request)
    record = _owned(ctx, who, batch_id)
    return JSONResponse(record.public(None if record.final else cancel_time(ctx.store, who, batch_id)))


@router.get("/v1/batches")
def list_batches(
    request: Request,
    who: str = Depends(tenant),
    after: str | None = None,
    limit: int = Query(20, ge=1, le=100),
) -> dict[str, Any]:
    ctx = serve_context(request)

    def records(chosen: list[str]) -> Iterator[dict[str, Any]]:
        for batch_id in chosen:
            record = read_record(ctx.store, who, batch_id)
            if record is not None:
                yield record.public(None if record.final else cancel_time(ctx.store, who, batch_id))

    return page(batch_ids(ctx.store, who), records, after=after, limit=limit, newest_first=True, what="batch")


@router.post("/v1/batches/{batch_id}/cancel")
def cancel_batch(request: Request, batch_id: str, who: str = Depends(tenant)) -> dict[str, Any]:
    ctx = serve_context(request)
    record = _owned(ctx, who, batch_id)
    if record.final:
        raise bad_request(f"Cannot cancel batch {batch_id}: it is {record.status} already.", "batch_id",
                          "batch_not_cancellable")  # fmt: skip
    request_cancel(ctx.store, who, batch_id, record.job_id, time.time())
    if ctx.runner is not None:
        ctx.runner.nudge()
    return record.public(cancel_time(ctx.store, who, batch_id))


@router.get("/v1/batches/{batch_id}/cost")
def batch_cost(request: Request, batch_id: str, who: str = Depends(tenant)) -> dict[str, Any]:
    """The job's cost.json once it has one (completed, expired), else a report over the shards
    committed so far, its `state` the batch's status."""
    from jobs.finalize import committed_shards, report_now
    from jobs.manifest import read_manifest
    from jobs.status import read_cost

    ctx = serve_context(request)
    record = _owned(ctx, who, batch_id)
    if record.job_id is None:
        raise bad_request(f"Batch {batch_id} is {record.status} and has no job: no cost.", "batch_id", "no_cost")
    job = sub_store(ctx.store, job_prefix(who, batch_id), ctx.settings)
    try:
        report = read_cost(job)
        if report is None:
            report = report_now(job, read_manifest(job), sorted(committed_shards(job)))
            report["state"] = record.public(cancel_time(ctx.store, who, batch_id))["status"]
    except FreightError as exc:
        raise APIError(500, f"The cost of batch {batch_id} cannot be read: {exc}", type="server_error") from None
    return report
