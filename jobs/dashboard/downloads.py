"""A job's results as downloads: one Parquet file, and the OpenAI Batch output and error files.

The Parquet file is the committed shards in shard order, as `freight results --to FILE.parquet`
writes it, built one shard at a time in a spooled temporary file (memory holds one shard, not the
job). The OpenAI files are what `freight results --format openai` writes; a served batch's own
output and error files, once it has them, are served as they are.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq

from jobs import datasets
from jobs.dashboard.job_reader import JobReader
from jobs.expiry import EXPIRED_KEY
from jobs.manifest import shard_result_key
from jobs.markers import CANCEL_KEY
from jobs.openai_output import export_openai
from jobs.storage import ObjectStore

CHUNK = 1 << 20
SPOOL_BYTES = 32 << 20  # an export larger than this goes to a temporary file on disk


def parquet_results(reader: JobReader) -> Iterator[bytes]:
    """The committed shards as one Parquet file (the first shard's schema; a job's shards share it)."""
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
        writer: pq.ParquetWriter | None = None
        schema: pa.Schema | None = None
        for index in sorted(reader.out.committed):
            table = datasets.read_result(reader.store.get(shard_result_key(index))).replace_schema_metadata(None)
            if writer is None:
                schema = table.schema
                writer = pq.ParquetWriter(spool, schema, compression="zstd")
            writer.write_table(table.cast(schema))
        if writer is None:
            writer = pq.ParquetWriter(spool, datasets.result_schema(likelihood=False), compression="zstd")
        writer.close()
        yield from _chunks(spool)


def openai_file(reader: JobReader, which: str) -> Iterator[bytes]:
    """`which` ("output" or "errors") of the OpenAI Batch files over the committed shards; an expired
    or cancelled job's unrun requests go to the error file, as `freight results` puts them."""
    if which not in ("output", "errors"):
        raise ValueError(f"which: 'output' or 'errors', not {which!r}")
    out = reader.out
    ended = "expired" if out.has(EXPIRED_KEY) else "cancelled" if out.has(CANCEL_KEY) else None
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool, _Discard() as other:
        output, errors = (spool, other) if which == "output" else (other, spool)
        export_openai(reader.store, reader.manifest(), sorted(out.committed), output, errors, ended)
        yield from _chunks(spool)


def stored_file(store: ObjectStore, key: str) -> Iterator[bytes]:
    """A stored object (a served batch's output or error file), in chunks."""
    yield from store.read_chunks(key)


def _chunks(spool: IO[bytes]) -> Iterator[bytes]:
    spool.seek(0)
    while chunk := spool.read(CHUNK):
        yield chunk


class _Discard:
    """A binary sink that keeps nothing: the export file not asked for."""

    def write(self, data: bytes) -> int:
        return len(data)

    def __enter__(self) -> _Discard:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
