"""The result cache in an object store: a folder or s3:// prefix shared by jobs.

    CACHE/freight-result-cache.json                  {"format": ...}: this folder is a result cache
    CACHE/spaces/<space>/space.json                  what the space is: model, fingerprint, settings
    CACHE/spaces/<space>/segments/<sha256>.parquet   answers of one committed shard (segments.py)
    CACHE/spaces/<space>/index/<job>-<shard>-<seg>.parquet   a segment's keys, written with it
    CACHE/spaces/<space>/index/<job>.parquet         a finished job's, merged at finalize
    CACHE/spaces/<space>/index/all-<sha>.parquet     everything, merged by `freight cache prune`

A space is one model content fingerprint under one set of numerics (quantization, the engine's
numerics version, device and dtype): only its rows can share answers. Its id is chosen by the worker
(worker/result_cache.py); this module only stores.

Costs in requests: a lookup process lists the space's index objects and reads those it has not read
(once per job, then every `refresh_s`); a shard's lookup then reads the segments its keys are in (one
per source shard: a rerun reads one segment per shard). A write is two put_if_absent (segment, then
its index object); both names follow from the content, so a repeated write is a no-op and a write
interrupted between the two leaves a segment no index names (a miss, removed by prune).

Nothing here fails a job: a read that fails is a logged miss, a write that fails a logged warning.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from jobs.errors import FreightError, ObjectNotFoundError, StorageError
from jobs.log import get_logger
from jobs.result_cache.index import SegmentInfo, SpaceIndex, encode_index, key_prefixes
from jobs.result_cache.segments import Entry, SegmentError, decode, encode, entries
from jobs.settings import Settings
from jobs.storage import ObjectStore, open_store
from jobs.storage.local import LocalStore

log = get_logger(__name__)

FORMAT = "freight.result-cache/1"
MARKER_KEY = "freight-result-cache.json"
READ_ERRORS = (StorageError, ObjectNotFoundError, OSError, ValueError)


def space_prefix(space: str) -> str:
    return f"spaces/{space}/"


class CacheError(FreightError):
    """A result cache that cannot be used (the path is a file, not writable, another folder's)."""


class ResultCache:
    """One result cache (a folder or s3:// prefix). `open` checks it is usable and marks it."""

    def __init__(self, store: ObjectStore, refresh_s: float = 60.0, segments_held: int = 64) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self.segments_held = segments_held
        self._spaces: dict[str, CacheSpace] = {}

    @property
    def url(self) -> str:
        return self.store.url

    @classmethod
    def open(cls, url: str, settings: Settings | None = None, *, create: bool = True) -> ResultCache:
        """The cache at `url`; CacheError, in words that say what to do, when it is a file, cannot be
        written, or is a folder of other files. `create`: make and mark it when absent (else a missing
        cache is refused)."""
        try:
            store = open_store(url, settings)
        except ValueError as exc:
            raise CacheError(f"--result-cache {url}: {exc}") from None
        if isinstance(store, LocalStore):
            _check_local(store, create)
        try:
            marker = store.get(MARKER_KEY)
        except ObjectNotFoundError:
            marker = None
        except StorageError as exc:
            raise CacheError(f"--result-cache {url} cannot be read: {exc}") from None
        if marker is None:
            if not create:
                raise CacheError(f"{url} is not a freight result cache (no {MARKER_KEY})")
            if store.list(""):
                raise CacheError(
                    f"--result-cache {url} holds other files: give a new or empty folder (a result cache "
                    f"is marked by its {MARKER_KEY})"
                )
            try:
                store.put_if_absent(MARKER_KEY, json.dumps({"format": FORMAT}).encode())
            except (StorageError, OSError) as exc:
                raise CacheError(f"--result-cache {url} cannot be written: {exc}") from None
        elif json.loads(marker or b"{}").get("format") != FORMAT:
            raise CacheError(f"--result-cache {url} was written by another freight version ({marker[:80]!r})")
        return cls(store)

    def space(self, space: str, describe: dict[str, Any] | None = None) -> CacheSpace:
        """The space `space` (its index read on first use); `describe` is written once as its space.json."""
        if space not in self._spaces:
            self._spaces[space] = CacheSpace(self, space, describe or {})
        return self._spaces[space]

    def spaces(self) -> list[str]:
        return sorted({k.split("/")[1] for k in self.store.list("spaces/") if k.count("/") >= 2})


def _check_local(store: LocalStore, create: bool) -> None:
    root = store.root
    if root.exists() and not root.is_dir():
        raise CacheError(f"--result-cache {root} is a file: give a folder (new, or one freight made)")
    if not root.exists():
        if not create:
            raise CacheError(f"--result-cache {root} does not exist")
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"--result-cache {root} cannot be created: {exc.strerror or exc}") from None
    probe = root / f".tmp-probe-{time.time_ns()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise CacheError(f"--result-cache {root} is not writable ({exc.strerror or exc}): give a folder "
                         "this user may write") from None  # fmt: skip


@dataclass(frozen=True)
class Hit:
    """A cached answer found for a key, and the segment it came from."""

    entry: Entry
    segment: str


class CacheSpace:
    """One space of a result cache: lookups by key, segment writes, index merges."""

    def __init__(self, cache: ResultCache, space: str, describe: dict[str, Any]) -> None:
        self.cache, self.space, self.describe = cache, space, describe
        self.prefix = space_prefix(space)
        self.index = SpaceIndex()
        self.refreshed_at = -1.0
        self._held: OrderedDict[str, tuple[pa.Table, dict[bytes, int]]] = OrderedDict()  # decoded segments
        self._bad: set[str] = set()
        self._described = False

    @property
    def store(self) -> ObjectStore:
        return self.cache.store

    # -- reading ---------------------------------------------------------------------------------

    def refresh(self, force: bool = False) -> None:
        """Read the index objects not read yet (at most every refresh_s unless `force`)."""
        now = time.monotonic()
        if not force and self.refreshed_at >= 0 and now - self.refreshed_at < self.cache.refresh_s:
            return
        self.refreshed_at = now
        try:
            listed = self.store.list(self.prefix + "index/")
        except READ_ERRORS as exc:
            log.warning("result_cache_unreadable", cache=self.cache.url, error=str(exc))
            return
        for key in listed:
            if key in self.index.loaded or not key.endswith(".parquet"):
                continue
            try:
                self.index.add(key, self.store.get(key))
            except ObjectNotFoundError:
                continue  # merged into another index object since the listing
            except READ_ERRORS as exc:
                log.warning("result_cache_index_skipped", object=self.store.url_of(key), error=str(exc))
                self.index.loaded.add(key)

    def lookup(self, keys: list[bytes]) -> dict[bytes, Hit]:
        """The cached answers of `keys` that the cache holds (a read that fails is a logged miss)."""
        self.refresh()
        found: dict[bytes, Hit] = {}
        wanted = self.index.candidates(keys)
        by_segment: dict[str, list[bytes]] = {}
        for key, names in wanted.items():
            by_segment.setdefault(names[0], []).append(key)
        pending = dict(wanted)
        while by_segment:  # a key whose newest segment is unreadable or lacks it tries the next one
            name, asked = by_segment.popitem()
            held = self._segment(name)
            present = [key for key in asked if held is not None and key in held[1]]
            if held is not None and present:
                for key, entry in zip(present, entries(held[0], [held[1][k] for k in present]), strict=True):
                    found[key] = Hit(entry, name)
                    pending.pop(key)
            for key in asked:
                if key in found:
                    continue
                names = pending.pop(key)
                rest = names[names.index(name) + 1 :]
                if rest:
                    pending[key] = rest
                    by_segment.setdefault(rest[0], []).append(key)
        return found

    def _segment(self, name: str) -> tuple[pa.Table, dict[bytes, int]] | None:
        if name in self._held:
            self._held.move_to_end(name)
            return self._held[name]
        if name in self._bad:
            return None
        try:
            table = decode(name, self.store.get(self.prefix + f"segments/{name}.parquet"))
        except (SegmentError, *READ_ERRORS) as exc:
            log.warning("result_cache_segment_skipped", segment=name, cache=self.cache.url, error=str(exc))
            self._bad.add(name)
            return None
        positions = {k: i for i, k in enumerate(table.column("key").to_pylist())}
        self._held[name] = (table, positions)
        while len(self._held) > self.cache.segments_held:
            self._held.popitem(last=False)
        return self._held[name]

    def segments_with_vectors(self, embedder: str) -> list[str]:
        """Segments whose rows carry prompt vectors of `embedder` (the semantic cache)."""
        self.refresh()
        return [s.name for s in self.index.segments.values() if s.embedder == embedder]

    def segment_entries(self, name: str) -> list[Entry]:
        """Every entry of segment `name` ([] when unreadable: logged)."""
        held = self._segment(name)
        return [] if held is None else entries(held[0])

    # -- writing ---------------------------------------------------------------------------------

    def write(self, rows: list[Entry], job_id: str, shard: int, now: float, embedder: str | None = None) -> str | None:
        """Store `rows` as one segment and its index object; the segment's name, or None when nothing
        was written (no rows, or the cache refused: logged). `now` stamps the entries (the shard's
        finish time: a repeated write of the same shard makes the same bytes, a no-op)."""
        if not rows:
            return None
        name, data = encode(rows, now=now)
        info = SegmentInfo(name=name, job_id=job_id, shard=shard, rows=len(rows), bytes=len(data), created_at=now,
                           embedder=embedder)  # fmt: skip
        index = encode_index({name: key_prefixes([e.key for e in rows])}, {name: info})
        try:
            if not self._described:
                self.store.put_if_absent(self.prefix + "space.json", json.dumps(self.describe, indent=1).encode())
                self._described = True
            self.store.put_if_absent(self.prefix + f"segments/{name}.parquet", data)
            self.store.put_if_absent(self.prefix + f"index/{job_id}-{shard:05d}-{name[:16]}.parquet", index)
        except (StorageError, OSError) as exc:
            log.warning("result_cache_write_failed", cache=self.cache.url, segment=name, error=str(exc))
            return None
        return name

    def merge_job(self, job_id: str) -> int:
        """Merge a finished job's per-shard index objects into one (`index/<job>.parquet`), so later
        jobs read one object for it; returns how many were merged (0 when nothing was, or another
        finalizer did it: its merged object stands, the loose ones stay until prune)."""
        loose = [k for k in self.store.list(self.prefix + f"index/{job_id}-") if k.endswith(".parquet")]
        if not loose:
            return 0
        merged = SpaceIndex()
        for key in loose:
            try:
                merged.add(key, self.store.get(key))
            except ObjectNotFoundError:
                return 0  # another finalizer merged them
            except READ_ERRORS as exc:
                log.warning("result_cache_index_skipped", object=self.store.url_of(key), error=str(exc))
        data = encode_index(merged.segment_keys(), merged.segments)
        if not self.store.put_if_absent(self.prefix + f"index/{job_id}.parquet", data):
            return 0
        for key in sorted(merged.loaded):
            self.store.delete(key)
        return len(merged.loaded)

