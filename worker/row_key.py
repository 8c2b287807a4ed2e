"""A row's answer identity: which rows are deterministic, and the digest of everything that decides
their answer. Duplicate rows of a shard share it (worker/row_dedup.py); the result cache keys on it
with the model's identity (worker/result_cache.py).

A row is deterministic when its answer is a function of its request alone: greedy, sampled with a
seed the row gave itself (a column or body field, not the one derived from the job seed and the row
id), an embedding, or likelihood scoring. Its digest covers every field of its RowRequest but those
in NOT_ANSWER, with every field of its SamplingParams (constraint included): a field added to either
joins the digest by itself, so a new setting that can change an answer can never be left out.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from typing import Any

from pydantic import BaseModel

from worker.row_requests import RowRequest

# RowRequest fields that name or refuse a row, say where its seed came from, or are repeated in its
# response object (a /v1/responses row's metadata and its sampling as run, which other fields hold):
# never its answer.
NOT_ANSWER = frozenset({"row", "id", "error", "seeded", "response_fields"})
KEY_VERSION = "freight-row/1"  # bump when the canonical form below changes


def deterministic(req: RowRequest) -> bool:
    """True when `req` always gets the same answer from the same model (see the module docstring)."""
    if req.error is not None:
        return False
    if req.endpoint == "embeddings" or req.sampling is None:
        return True
    return req.sampling.greedy or req.seeded


def canonical(value: Any) -> Any:
    """`value` as plain JSON data: dataclasses and pydantic models by field name, tuples as lists,
    bytes as hex, enums by value; anything else JSON cannot say is refused (TypeError), so a new field
    type is handled on purpose, never by its repr."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, BaseModel):
        return canonical(value.model_dump(mode="json"))
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, enum.Enum):
        return canonical(value.value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"{type(value).__name__} has no canonical form for a row key")


def answer_fields(req: RowRequest) -> dict[str, Any]:
    """The fields of `req` that decide its answer, as plain JSON data."""
    return {f.name: canonical(getattr(req, f.name)) for f in dataclasses.fields(req) if f.name not in NOT_ANSWER}


def row_digest(req: RowRequest, context: Any = None) -> bytes:
    """sha256 of the row's answer fields and `context` (JSON data: the model's identity for the result
    cache; None within one job, whose rows share the model)."""
    body = json.dumps([KEY_VERSION, context, answer_fields(req)], sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False)  # fmt: skip
    return hashlib.sha256(body.encode()).digest()
