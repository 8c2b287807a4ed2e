"""A job's results as OpenAI Batch output and error files (`freight results OUT --format openai`).

One JSON line per request, as OpenAI's batch output holds them:
`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}` (the body:
jobs/openai_bodies.py, a /v1/responses row's jobs/openai_response.py). A row that ran
goes to the output file (status 200, `error` null); a failed row goes to the error file (status 400
with OpenAI's error body, and `error` = {code, message}); a cancelled row has `response` null. Lines
keep the input's order. Ids are derived from the job id and the row number, so an export is the
same every time it is made. `custom_id` is the row's id (JSONL: the line's custom_id; Parquet: the
--id-column value, else the row index).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from jobs import datasets
from jobs.endpoints import CHAT_URL, EMBEDDINGS_URL, ENDPOINT_URLS, RESPONSES_URL, default_endpoint
from jobs.errors import FreightError
from jobs.finalize import load_shard_record
from jobs.manifest import Manifest, ShardPlan, partial_prefix, shard_result_key
from jobs.openai_bodies import embedding_body, error_body, generation_body
from jobs.openai_response import response_body
from jobs.storage import ObjectStore

FAILED_REASONS = ("error", "cancelled")


@dataclass(frozen=True)
class OpenAIExport:
    """What an export wrote: `requests` lines in all, `failed` of them to the error file; the tokens
    of the requests in the output file (a finalized job's equal its cost report's)."""

    requests: int
    failed: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(frozen=True)
class RequestIds:
    """The ids of one request's lines: `line` (batch_req_...), `request` (req_...), `body`
    (chatcmpl-... / cmpl-... / resp_... and a response's msg_..., without the prefix)."""

    line: str
    request: str
    body: str

    @classmethod
    def of(cls, job_id: str, row: int) -> RequestIds:
        h = hashlib.blake2b(f"freight:{job_id}:{row}".encode(), digest_size=36).hexdigest()  # 72 hex
        return cls(line=f"batch_req_{h[:24]}", request=f"req_{h[24:48]}", body=h[48:])


def check_exportable(manifest: Manifest) -> None:
    """Raise FreightError for a job whose results have no OpenAI Batch shape."""
    if manifest.spec.continuation_column is not None:
        raise FreightError(
            f"job {manifest.job_id} scores continuations (--continuation-column): its results have no "
            "OpenAI Batch shape; export them with --to FILE.parquet or FILE.jsonl"
        )


def request_line(
    row: dict[str, Any], row_number: int, manifest: Manifest, created: int
) -> tuple[dict[str, Any], bool]:
    """(the row's line, failed)."""
    ids = RequestIds.of(manifest.job_id, row_number)
    endpoint = row.get("endpoint") or (
        EMBEDDINGS_URL if row.get("embedding") is not None else default_endpoint(manifest.input)
    )
    if endpoint not in ENDPOINT_URLS:
        raise ValueError(f"row {row['id']!r}: endpoint {endpoint!r} is none of {', '.join(ENDPOINT_URLS)}")
    line: dict[str, Any] = {"id": ids.line, "custom_id": str(row["id"])}
    # the row's LoRA adapter (vLLM names an adapter's responses so), else the served name (freight serve
    # --models), else as `vllm run-batch` names it: as the job was given it
    model = row.get("adapter") or manifest.spec.model_name or manifest.spec.model
    if row.get("error") is not None or row["finish_reason"] in FAILED_REASONS:
        message = row.get("error") or f"the request ended with finish_reason {row['finish_reason']!r}"
        if row["finish_reason"] == "cancelled":
            line["response"] = None
            line["error"] = {"code": "batch_cancelled", "message": message}
        else:
            response = {"status_code": 400, "request_id": ids.request, "body": error_body(message)}
            line["response"] = response
            line["error"] = {"code": "invalid_request", "message": message}
        return line, True
    if endpoint == EMBEDDINGS_URL:
        body = embedding_body(row, model)
    elif endpoint == RESPONSES_URL:
        body = response_body(row, "resp_" + ids.body, "msg_" + ids.body, created, model)
    else:
        prefix = "chatcmpl-" if endpoint == CHAT_URL else "cmpl-"
        body = generation_body(row, endpoint, prefix + ids.body, created, model)
    line["response"] = {"status_code": 200, "request_id": ids.request, "body": body}
    line["error"] = None
    return line, False


Line = tuple[dict[str, Any], bool, dict[str, Any] | None]  # (line, failed, the result row of a line that ran)


def shard_lines(store: ObjectStore, manifest: Manifest, shard: ShardPlan) -> Iterator[Line]:
    """(line, failed, row) for each row of a committed shard, in input order."""
    table = datasets.read_result(store.get(shard_result_key(shard.index)))
    rows = shard.row_indices()
    if table.num_rows != len(rows):
        raise FreightError(
            f"{store.url_of(shard_result_key(shard.index))} holds {table.num_rows} rows, its plan "
            f"{len(rows)}: the job's results do not match its manifest"
        )
    created = int(load_shard_record(store, shard.index).finished_at)
    for row_number, row in zip(rows, table.to_pylist(), strict=True):
        line, bad = request_line(row, row_number, manifest, created)
        yield line, bad, row


# A job that ended before some shards ran: their requests go to the error file, as OpenAI's
ENDED = {  # error codes for a batch's unrun requests
    "expired": ("batch_expired", "this request could not be run before the job's completion window ended"),
    "cancelled": ("batch_cancelled", "the job was cancelled before this request ran"),
    "failed": ("batch_failed", "this request's shard failed on every attempt; see the job's failures.json"),
}


def partial_rows(store: ObjectStore, shard: ShardPlan) -> dict[int, dict[str, Any]]:
    """Rows an uncommitted shard's interrupted attempts finished (OUT/partial/<shard>/), by row number;
    a later attempt's row wins (all agree: seeds are per row)."""
    done: dict[int, dict[str, Any]] = {}
    for key in store.list(partial_prefix(shard.index)):
        if key.endswith(".parquet"):
            for row in datasets.read_result(store.get(key)).to_pylist():
                done[int(row["row"])] = row
    return done


def ended_shard_lines(
    store: ObjectStore, manifest: Manifest, shard: ShardPlan, ended: str, settings: Any = None
) -> Iterator[Line]:
    """The lines of an uncommitted shard of an ended job, in input order: its rows that an interrupted
    attempt finished, as they ran; every other request to the error file as `ENDED[ended]`."""
    code, message = ENDED[ended]
    finished = partial_rows(store, shard)
    table = datasets.InputReader(manifest.input, settings).read(shard.ranges)
    rows = shard.row_indices()
    column = manifest.input.id_column
    ids = table.column(column).to_pylist() if column else [None] * len(rows)
    created = int(time.time())
    for row, value in zip(rows, ids, strict=True):
        if row in finished:
            line, bad = request_line(finished[row], row, manifest, created)
            yield line, bad, finished[row]
            continue
        line = {"id": RequestIds.of(manifest.job_id, row).line, "custom_id": str(row if value is None else value),
                "response": None, "error": {"code": code, "message": message}}  # fmt: skip
        yield line, True, None


def export_openai(
    store: ObjectStore,
    manifest: Manifest,
    shard_indices: list[int],
    output: IO[bytes],
    errors: IO[bytes],
    ended: str | None = None,
    settings: Any = None,
) -> OpenAIExport:
    """Write the lines of these committed shards (in shard order) to `output` and `errors`; with
    `ended` ("expired", "cancelled" or "failed"), the other shards' lines too: the rows their
    interrupted attempts finished, and every other request to `errors` (ENDED)."""
    check_exportable(manifest)
    total = failed = prompt = cached = completion = reasoning = 0
    for shard in manifest.shards:
        if shard.index in shard_indices:
            lines: Iterator[Line] = shard_lines(store, manifest, shard)
        elif ended is not None:
            lines = ended_shard_lines(store, manifest, shard, ended, settings)
        else:
            continue
        for line, bad, row in lines:
            (errors if bad else output).write((json.dumps(line, ensure_ascii=False) + "\n").encode())
            total += 1
            failed += bad
            if not bad and row is not None:
                prompt += int(row["prompt_tokens"])
                cached += int(row["cached_tokens"])
                completion += int(row["completion_tokens"])
                reasoning += int(row.get("reasoning_tokens") or 0)
    return OpenAIExport(total, failed, prompt, cached, completion, reasoning)


__all__ = ["OpenAIExport", "RequestIds", "check_exportable", "export_openai"]
