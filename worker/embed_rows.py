"""A shard's embeddings rows (RowRequest.endpoint == "embeddings") through Engine.embed_stream.

Rows come from `--task embed` Parquet jobs (every row: `row_requests.build_requests`) or from JSONL `/v1/embeddings`
lines. Result rows: the `embedding` column (list<float32>), prompt_tokens, no completion, finish
reason "stop", completion_tokens 0 (the cost report then prices input tokens only). A checkpoint
without a pooling config fails each embeddings row with the engine's message; the shard goes on.
"""

from __future__ import annotations

from typing import Any

from jobs.endpoints import URL_OF_ENDPOINT
from worker.row_engine import RowSink
from worker.row_requests import RowRequest
from worker.shard_rows import RowResult

ENDPOINT = "embeddings"


def split_embeddings(requests: list[RowRequest]) -> tuple[list[RowRequest], list[RowRequest]]:
    """(embeddings rows, the others), each in the given order."""
    embed = [r for r in requests if r.endpoint == ENDPOINT]
    return embed, [r for r in requests if r.endpoint != ENDPOINT] if embed else requests


def _result(req: RowRequest, out: Any = None, error: str | None = None) -> RowResult:
    """A row's result from its EmbeddingOutput, or the row's error."""
    error = error or (out.error if out is not None else None)
    return RowResult(
        row=req.row,
        id=req.id,
        completion=None,
        finish_reason="error" if error else "stop",
        prompt_tokens=int(out.prompt_tokens) if out is not None else 0,
        cached_tokens=0,
        completion_tokens=0,
        error=error,
        embedding=None if error else out.embedding.tolist(),
        endpoint=URL_OF_ENDPOINT[ENDPOINT],
    )


def collect_embeddings(engine: Any, pending: list[RowRequest], sink: RowSink) -> bool:
    """Embed `pending` into `sink`; True if stopped before all finished (see collect_rows)."""
    if not pending:
        return False
    if sink.stopping():
        return True
    if engine.pooling is None:  # the model cannot embed: each row says why
        outs = ((req, _result(req, error=engine.pooling_error)) for req in pending)
    else:
        stream = engine.embed_stream([r.prompt for r in pending], [r.dimensions for r in pending], sink.should_stop)
        outs = ((pending[o.index], _result(pending[o.index], o)) for o in stream)
    return sink.drain(outs, len(pending))
