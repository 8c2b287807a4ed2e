"""A job's result cache as its shards use it: the key of a row, hits as result rows, computed rows
as cache entries (docs/design/result-cache.md).

The key of a deterministic row (worker/row_key.py) is the first 16 bytes of the sha256 of
- its space: the model's content fingerprint (jobs/model_fingerprint.py), the quantization (with its
  group size), and the engine's numerics (worker/engine/numerics.py: version, device type, dtype), all of which can move
  an answer;
- speculative decoding (method, K, the draft's fingerprint) for sampled rows only: speculation never
  changes a greedy answer, while a seeded draw under speculation may differ from one without;
- for a row of a LoRA adapter, the adapter folder's content fingerprint (its name is among the
  answer fields, which only tells the rows of one job apart);
- the row's answer fields.
Only deterministic rows are looked up and written, and only rows that finished without an error.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from jobs.log import get_logger
from jobs.manifest import Manifest
from jobs.model_cache import resolve_adapter, resolve_model
from jobs.model_fingerprint import model_fingerprint
from jobs.result_cache.options import CacheOptions, read_cache_options
from jobs.result_cache.segments import KEY_BYTES, Entry, answer_fields
from jobs.result_cache.store import CacheError, CacheSpace, ResultCache
from jobs.settings import Settings
from jobs.storage import ObjectStore
from worker.cached_rows import cached_result
from worker.engine.numerics import engine_numerics
from worker.row_key import deterministic, row_digest
from worker.row_requests import RowRequest
from worker.shard_rows import RowResult

log = get_logger(__name__)
NOT_CACHED = ("error", "cancelled")  # finish reasons never written


def space_of(fingerprint: str, quantization: str | None, numerics: str) -> tuple[str, dict[str, Any]]:
    """(space id, its description) of answers of one checkpoint content under one set of numerics."""
    describe = {"fingerprint": fingerprint, "quantization": quantization, "numerics": numerics}
    digest = hashlib.sha256(json.dumps(describe, sort_keys=True).encode()).hexdigest()
    return digest[:32], describe


@dataclass
class JobCache:
    """The result cache of one job, with the parts of its key every row shares."""

    space: CacheSpace
    job_id: str
    speculation: Any = None  # [method, K, draft fingerprint] of a job with speculative decoding
    semantic: Any = None  # worker/semantic_cache.py SemanticCache, when the job opted in
    adapters: dict[str, str] = field(default_factory=dict)  # LoRA adapter name -> its folder's fingerprint

    def key(self, req: RowRequest) -> bytes:
        sampled = req.sampling is not None and not req.sampling.greedy
        context = {"space": self.space.space, "speculation": self.speculation if sampled else None}
        if req.adapter is not None:
            context["adapter"] = self.adapters[req.adapter]
        return row_digest(req, context)[:KEY_BYTES]

    def lookup(self, requests: list[RowRequest]) -> tuple[dict[int, RowResult], dict[int, float]]:
        """The rows of `requests` the cache answers: (row -> result marked cached "exact", row -> the
        engine seconds the answer took when computed). Non-deterministic rows are never looked up."""
        keyed = {self.key(req): req for req in requests if deterministic(req)}
        hits: dict[int, RowResult] = {}
        seconds: dict[int, float] = {}
        for key, hit in self.space.lookup(list(keyed)).items():
            req = keyed[key]
            hits[req.row] = cached_result(req, hit.entry, "exact")
            seconds[req.row] = hit.entry.seconds
        return hits, seconds

    def indexed(self, requests: list[RowRequest]) -> set[int]:
        """The rows of `requests` whose keys the cache's index lists (`freight estimate`'s expected
        hits: the index alone, no segment read)."""
        keyed = {self.key(req): req.row for req in requests if deterministic(req)}
        self.space.refresh()
        return {keyed[k] for k in self.space.index.candidates(list(keyed))}

    def entries(self, computed: list[tuple[RowRequest, RowResult, float]],
                vectors: dict[int, tuple[bytes, list[float]]] | None = None) -> list[Entry]:  # fmt: skip
        """Cache entries of a shard's rows computed by this job: (request, result, engine seconds)
        of each, with the semantic cache's (group, vector) of the rows it embedded; rows that are not
        deterministic, failed, or did not compute their answer are left out."""
        vectors = vectors or {}
        out = []
        for req, res, secs in computed:
            if not deterministic(req) or res.error is not None or res.finish_reason in NOT_CACHED:
                continue
            if res.cached is not None or res.duplicate:
                continue
            answer = {f.name: getattr(res, f.name) for f in answer_fields() if f.name in RowResult.__dataclass_fields__}
            group, vector = vectors.get(req.row, (None, None))
            out.append(Entry(key=self.key(req), source_job=self.job_id, source_row=str(res.id), seconds=secs,
                             answer=answer, group=group, vector=vector))  # fmt: skip
        return out


def open_job_cache(out: ObjectStore, manifest: Manifest, engine: Any, settings: Settings,
                   options: CacheOptions | None = None) -> JobCache | None:  # fmt: skip
    """The job's cache as OUT/cache.json names it (`options` when the caller read them), or None:
    no cache, or one that cannot be used now (logged: the job runs without it)."""
    options = options if options is not None else read_cache_options(out)
    if options.url is None:
        return None
    try:
        job = job_cache(ResultCache.open(options.url, settings), manifest, engine_numerics(engine.config), settings)
    except (CacheError, OSError) as exc:
        log.warning("result_cache_off", cache=options.url, error=str(exc))
        return None
    if options.semantic_threshold is not None:
        from worker.semantic_cache import open_semantic_cache

        job.semantic = open_semantic_cache(job, options, settings, engine.config.device)
    return job


def job_cache(cache: ResultCache, manifest: Manifest, numerics: str, settings: Settings) -> JobCache:
    """The JobCache of `manifest`'s job in `cache` for an engine of `numerics` (the model's
    fingerprint computed, or read from the profile store)."""
    spec = manifest.spec
    fingerprint = model_fingerprint(resolve_model(spec.model, settings), settings)
    space, describe = space_of(fingerprint, spec.quantization_label, numerics)
    speculation = None
    if spec.speculative is not None:
        draft = None
        if spec.speculative.startswith("draft:"):
            draft = model_fingerprint(resolve_model(spec.speculative.removeprefix("draft:"), settings), settings)
        speculation = [spec.speculative.split(":", 1)[0], spec.speculative_tokens, draft]
    adapters = {name: model_fingerprint(resolve_adapter(name, path, settings), settings)
                for name, path in spec.adapters.items()}  # fmt: skip
    return JobCache(space=cache.space(space, {**describe, "model": spec.model}), job_id=manifest.job_id,
                    speculation=speculation, adapters=adapters)  # fmt: skip
