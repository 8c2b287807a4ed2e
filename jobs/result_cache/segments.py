"""A result-cache segment: the answers of one committed shard's deterministic rows, as one Parquet
object named by the sha256 of its bytes.

Columns: `key` (16 bytes: the row's cache key), `source_job`, `source_row` (the id, as text),
`seconds` (the engine seconds the answer took, jobs.cost.row_seconds), `created_at` (unix s), then
the answer: every result column but the row's own (ANSWERLESS), at its result type. A column added to
the results joins the answer by itself. Optional `vector` (float32 list): the prompt's embedding under
the semantic cache's embedder, with `group` (16 bytes: the row's settings without its prompt).

The name is the content's hash, so a reader checks every byte it gets: a truncated or damaged segment
fails the check (or Parquet's) and is skipped with a warning, never served.
"""

from __future__ import annotations

import functools
import hashlib
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from jobs import datasets

KEY_BYTES = 16
# result columns that belong to the row, not to its answer (response_fields: what a response repeats of
# the row's own request)
ANSWERLESS = frozenset({"id", "endpoint", "error", "cached", "cached_from_job", "cached_from_row", "cached_similarity",
                        "response_fields", "adapter"})  # fmt: skip
ENTRY_FIELDS = [
    pa.field("key", pa.binary(KEY_BYTES), nullable=False),
    pa.field("source_job", pa.string(), nullable=False),
    pa.field("source_row", pa.string(), nullable=False),
    pa.field("seconds", pa.float64(), nullable=False),
    pa.field("created_at", pa.float64(), nullable=False),
]
SEMANTIC_FIELDS = [pa.field("group", pa.binary(KEY_BYTES)), pa.field("vector", pa.list_(pa.float32()))]


class SegmentError(ValueError):
    """A segment's bytes are not the segment its name promises (truncated, damaged, not Parquet)."""


@functools.cache
def answer_fields() -> tuple[pa.Field, ...]:
    """The answer columns of a segment: the result columns (likelihood ones included) but ANSWERLESS."""
    return tuple(f for f in datasets.result_schema(likelihood=True) if f.name not in ANSWERLESS)


def segment_schema() -> pa.Schema:
    return pa.schema([*ENTRY_FIELDS, *answer_fields(), *SEMANTIC_FIELDS])


@dataclass(frozen=True)
class Entry:
    """One cached answer: its key, where it came from, and the answer's result columns by name."""

    key: bytes
    source_job: str
    source_row: str
    seconds: float
    answer: dict[str, Any]
    created_at: float = 0.0
    group: bytes | None = None
    vector: list[float] | None = None


def encode(entries: list[Entry], now: float | None = None) -> tuple[str, bytes]:
    """(name, Parquet bytes) of a segment holding `entries`; the name is the bytes' sha256."""
    now = time.time() if now is None else now
    schema = segment_schema()
    columns: dict[str, list[Any]] = {f.name: [] for f in schema}
    for e in entries:
        if len(e.key) != KEY_BYTES:
            raise ValueError(f"a cache key has {KEY_BYTES} bytes, got {len(e.key)}")
        columns["key"].append(e.key)
        columns["source_job"].append(e.source_job)
        columns["source_row"].append(e.source_row)
        columns["seconds"].append(float(e.seconds))
        columns["created_at"].append(e.created_at or now)
        columns["group"].append(e.group)
        columns["vector"].append(e.vector)
        for f in answer_fields():
            columns[f.name].append(e.answer.get(f.name))
    table = pa.Table.from_pydict(columns, schema=schema)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    data = sink.getvalue().to_pybytes()
    return hashlib.sha256(data).hexdigest(), data


def decode(name: str, data: bytes) -> pa.Table:
    """The entries of segment `name`; SegmentError when the bytes are not that segment."""
    if hashlib.sha256(data).hexdigest() != name:
        raise SegmentError(f"segment {name} does not match its hash ({len(data):,} bytes): truncated or damaged")
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise SegmentError(f"segment {name} is not Parquet: {exc}") from None
    missing = [f.name for f in ENTRY_FIELDS if f.name not in table.column_names]
    if missing:
        raise SegmentError(f"segment {name} lacks the columns {', '.join(missing)}")
    return table


def entries(table: pa.Table, rows: list[int] | None = None) -> list[Entry]:
    """Entries of a decoded segment (the given row positions, or all), answer columns by name; a
    column a newer writer added is kept, one an older writer lacked is None."""
    if rows is not None:
        table = table.take(rows)
    names = [f.name for f in answer_fields()]
    out: list[Entry] = []
    for d in table.to_pylist():
        out.append(Entry(key=d["key"], source_job=d["source_job"], source_row=d["source_row"], seconds=d["seconds"],
                         created_at=d["created_at"], answer={n: d.get(n) for n in names},
                         group=d.get("group"), vector=d.get("vector")))  # fmt: skip
    return out
