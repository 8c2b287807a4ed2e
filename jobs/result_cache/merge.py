"""A finished job's result-cache index objects merged into one, at finalize (jobs/finalize.py)."""

from __future__ import annotations

from jobs.log import get_logger
from jobs.result_cache.options import read_cache_options
from jobs.result_cache.store import READ_ERRORS, CacheError, ResultCache
from jobs.settings import Settings
from jobs.storage import ObjectStore

log = get_logger(__name__)


def merge_job_index(out: ObjectStore, job_id: str, spaces: set[str], settings: Settings | None = None) -> int:
    """Merge the per-shard index objects the job wrote in each of `spaces` of its cache (OUT/cache.json)
    into one per space; how many were merged. Never fails the job: a problem is logged, the loose
    objects stay (readers read them all the same; `freight cache prune` merges them)."""
    if not spaces:
        return 0
    merged = 0
    try:
        options = read_cache_options(out)
        if options.url is None:
            return 0
        cache = ResultCache.open(options.url, settings, create=False)
        for space in sorted(spaces):
            merged += cache.space(space).merge_job(job_id)
    except (CacheError, *READ_ERRORS) as exc:
        log.warning("result_cache_merge_skipped", job_id=job_id, error=str(exc))
    return merged
