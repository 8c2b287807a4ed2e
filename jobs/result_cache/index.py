"""A result-cache space's index: which segment holds which key, read without reading the segments.

An index object is a Parquet table of `key` (uint64: a key's first 8 bytes, big-endian) and
`segment` (a position in the metadata's segment list), with the metadata `freight.result_cache.index`
holding that list: per segment its name, the job and shard that wrote it, rows, bytes, created_at, and
`embedder` (the semantic cache's embedder fingerprint when its rows carry prompt vectors, else null).

A key's 8-byte prefix may name a segment that holds another key of the same prefix; the segment's
full 16-byte keys settle it. The same key in several segments (a job rerun into another OUT, two jobs
at once) is fine: any of them holds the same answer, and the newest is read first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

INDEX_METADATA_KEY = b"freight.result_cache.index"


@dataclass(frozen=True)
class SegmentInfo:
    name: str
    job_id: str
    shard: int
    rows: int
    bytes: int
    created_at: float
    embedder: str | None = None  # the semantic embedder's fingerprint when its rows carry vectors


def key_prefixes(keys: list[bytes]) -> np.ndarray:
    """Each 16-byte key's first 8 bytes as a uint64 (big-endian), the index's search key."""
    if not keys:
        return np.zeros(0, np.uint64)
    return np.frombuffer(b"".join(k[:8] for k in keys), dtype=">u8").astype(np.uint64)


def encode_index(entries: dict[str, np.ndarray], segments: dict[str, SegmentInfo]) -> bytes:
    """An index object over `entries` (segment name -> its keys' prefixes, key_prefixes) with
    `segments` described."""
    names = sorted(entries, key=lambda n: segments[n].created_at)
    keys: list[np.ndarray] = []
    where: list[np.ndarray] = []
    for i, name in enumerate(names):
        prefixes = entries[name]
        keys.append(prefixes)
        where.append(np.full(len(prefixes), i, np.int32))
    all_keys = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
    all_where = np.concatenate(where) if where else np.zeros(0, np.int32)
    order = np.argsort(all_keys, kind="stable")
    table = pa.table({"key": pa.array(all_keys[order], pa.uint64()), "segment": pa.array(all_where[order], pa.int32())})
    meta = {"segments": [vars(segments[n]) for n in names]}
    table = table.replace_schema_metadata({INDEX_METADATA_KEY: json.dumps(meta).encode()})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def decode_index(data: bytes) -> tuple[np.ndarray, np.ndarray, list[SegmentInfo]]:
    """(sorted key prefixes, segment position of each, the segments) of an index object; ValueError
    when it is not one."""
    try:
        table = pq.read_table(pa.BufferReader(data))
        meta = json.loads((table.schema.metadata or {})[INDEX_METADATA_KEY])
        segments = [SegmentInfo(**s) for s in meta["segments"]]
        keys = table.column("key").to_numpy().astype(np.uint64)
        where = table.column("segment").to_numpy().astype(np.int32)
    except (pa.ArrowInvalid, OSError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a result-cache index object: {exc}") from None
    if len(keys) and (where.min() < 0 or where.max() >= len(segments)):
        raise ValueError("not a result-cache index object: a key names a segment it does not list")
    return keys, where, segments


class SpaceIndex:
    """The index objects of one space loaded so far, searched together. Each object stays its own
    sorted chunk (a refresh adds chunks, never re-sorts the loaded ones)."""

    def __init__(self) -> None:
        self.loaded: set[str] = set()  # index object keys read
        self.segments: dict[str, SegmentInfo] = {}
        self._chunks: list[tuple[np.ndarray, np.ndarray, list[str]]] = []

    def add(self, object_key: str, data: bytes) -> None:
        keys, where, segments = decode_index(data)
        self.loaded.add(object_key)
        for s in segments:
            self.segments.setdefault(s.name, s)
        self._chunks.append((keys, where, [s.name for s in segments]))

    @property
    def entries(self) -> int:
        return sum(len(keys) for keys, _, _ in self._chunks)

    def candidates(self, keys: list[bytes]) -> dict[bytes, list[str]]:
        """For each key, the segments whose index lists its prefix, newest first (none: absent)."""
        found: dict[bytes, list[str]] = {}
        if not keys or not self._chunks:
            return found
        query = key_prefixes(keys)
        for chunk_keys, where, names in self._chunks:
            lo = np.searchsorted(chunk_keys, query, side="left")
            hi = np.searchsorted(chunk_keys, query, side="right")
            for i in np.nonzero(hi > lo)[0]:
                for pos in range(lo[i], hi[i]):
                    found.setdefault(keys[i], []).append(names[where[pos]])
        for key, names in found.items():
            unique = dict.fromkeys(names)  # keep first occurrences
            found[key] = sorted(unique, key=lambda n: -self.segments[n].created_at)
        return found

    def segment_keys(self) -> dict[str, np.ndarray]:
        """Segment name -> the key prefixes the loaded objects list for it (compaction)."""
        out: dict[str, list[np.ndarray]] = {}
        for chunk_keys, where, names in self._chunks:
            for i, name in enumerate(names):
                out.setdefault(name, []).append(chunk_keys[where == i])
        return {name: np.unique(np.concatenate(parts)) for name, parts in out.items()}
