"""A cached answer as a row's result: the result cache's and the semantic cache's hits."""

from __future__ import annotations

from jobs.endpoints import URL_OF_ENDPOINT
from jobs.result_cache.segments import Entry
from worker.row_requests import RowRequest
from worker.shard_rows import RowResult


def cached_result(req: RowRequest, entry: Entry, how: str, similarity: float | None = None) -> RowResult:
    """The cached answer `entry` as `req`'s result row (its own row number, id, endpoint and
    response_fields)."""
    answer = {k: v for k, v in entry.answer.items() if k in RowResult.__dataclass_fields__}
    return RowResult(**{**answer, "row": req.row, "id": req.id, "endpoint": URL_OF_ENDPOINT[req.endpoint],
                        "response_fields": req.response_fields, "adapter": req.adapter, "error": None, "cached": how, "cached_from_job": entry.source_job,
                        "cached_from_row": entry.source_row, "cached_similarity": similarity})  # fmt: skip
