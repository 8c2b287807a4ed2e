"""What a result cache holds (`freight cache stats`) and how it is kept small (`freight cache prune`).

Prune, per space: read every index object, choose the segments to remove (created before
`older_than` seconds ago; then the oldest until the space's segments fit `max_bytes` together with
the other spaces' — the limit is for the whole cache), write one merged index object of the rest,
delete the index objects it merged, then the removed segments and any segment no index names (a write
stopped between its two puts). A job reading meanwhile sees at worst a miss.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from jobs.errors import ObjectNotFoundError
from jobs.log import get_logger
from jobs.result_cache.index import SegmentInfo, SpaceIndex, encode_index
from jobs.result_cache.store import READ_ERRORS, ResultCache, space_prefix

log = get_logger(__name__)


@dataclass(frozen=True)
class SpaceStats:
    space: str
    describe: dict[str, Any]
    segments: int
    entries: int
    bytes: int
    index_objects: int
    oldest: float | None
    newest: float | None
    semantic_entries: int = 0


@dataclass
class PruneResult:
    segments_removed: int = 0
    entries_removed: int = 0
    bytes_removed: int = 0
    index_objects_merged: int = 0
    spaces: list[str] = field(default_factory=list)


def _full_index(cache: ResultCache, space: str) -> SpaceIndex:
    index = SpaceIndex()
    for key in cache.store.list(space_prefix(space) + "index/"):
        if not key.endswith(".parquet"):
            continue
        try:
            index.add(key, cache.store.get(key))
        except ObjectNotFoundError:
            continue
        except READ_ERRORS as exc:
            log.warning("result_cache_index_skipped", object=cache.store.url_of(key), error=str(exc))
    return index


def _describe(cache: ResultCache, space: str) -> dict[str, Any]:
    try:
        data = json.loads(cache.store.get(space_prefix(space) + "space.json"))
        return data if isinstance(data, dict) else {}
    except (ObjectNotFoundError, *READ_ERRORS):
        return {}


def cache_stats(cache: ResultCache) -> list[SpaceStats]:
    """Per space: segments, entries, bytes, index objects, oldest and newest entry."""
    out: list[SpaceStats] = []
    for space in cache.spaces():
        index = _full_index(cache, space)
        segments = list(index.segments.values())
        created = [s.created_at for s in segments]
        out.append(SpaceStats(
            space=space, describe=_describe(cache, space), segments=len(segments),
            entries=sum(s.rows for s in segments), bytes=sum(s.bytes for s in segments),
            index_objects=len(index.loaded), oldest=min(created, default=None), newest=max(created, default=None),
            semantic_entries=sum(s.rows for s in segments if s.embedder),
        ))  # fmt: skip
    return out


def prune(cache: ResultCache, *, older_than: float | None = None, max_bytes: int | None = None,
          now: float | None = None) -> PruneResult:  # fmt: skip
    """Remove segments created more than `older_than` seconds ago, then the oldest until the cache's
    segments total at most `max_bytes`; merge each space's index into one object."""
    now = time.time() if now is None else now
    result = PruneResult()
    indexes = {space: _full_index(cache, space) for space in cache.spaces()}
    doomed: set[tuple[str, str]] = set()
    for space, index in indexes.items():
        for s in index.segments.values():
            if older_than is not None and s.created_at < now - older_than:
                doomed.add((space, s.name))
    if max_bytes is not None:
        kept = sorted(((s.created_at, space, s) for space, index in indexes.items() for s in index.segments.values()
                       if (space, s.name) not in doomed), key=lambda t: t[0])  # fmt: skip
        total = sum(s.bytes for _, _, s in kept)
        for _, space, s in kept:
            if total <= max_bytes:
                break
            doomed.add((space, s.name))
            total -= s.bytes
    for space, index in indexes.items():
        _prune_space(cache, space, index, {name for sp, name in doomed if sp == space}, result)
    return result


def _prune_space(cache: ResultCache, space: str, index: SpaceIndex, doomed: set[str], result: PruneResult) -> None:
    store, prefix = cache.store, space_prefix(space)
    keep: dict[str, SegmentInfo] = {n: s for n, s in index.segments.items() if n not in doomed}
    keys = index.segment_keys()
    if keep and (doomed or len(index.loaded) > 1):
        data = encode_index({n: keys[n] for n in keep}, keep)
        merged_key = prefix + f"index/all-{hashlib.sha256(data).hexdigest()[:16]}.parquet"
        store.put_if_absent(merged_key, data)
        merged = [k for k in sorted(index.loaded) if k != merged_key]
        for key in merged:
            store.delete(key)
        result.index_objects_merged += len(merged)
    elif not keep:
        for key in sorted(index.loaded):
            store.delete(key)
    indexed = set(index.segments)
    for key, size in store.sizes(prefix + "segments/"):
        name = key.rsplit("/", 1)[-1].removesuffix(".parquet")
        if name in doomed or name not in indexed:
            store.delete(key)
            result.segments_removed += 1
            result.bytes_removed += size
            result.entries_removed += index.segments[name].rows if name in index.segments else 0
    if doomed:
        result.spaces.append(space)
