"""A job's cache options: which result cache it reads and writes, and whether it uses the semantic
cache. They belong to a submission, not to the job spec (the results are the same with or without a
cache, so a rerun with another cache is the same job, resumed), so they live beside the manifest in
`OUT/cache.json`, replaced (or removed) by each run or submit, where the embedded runner and every worker read them:

    {"url": "/data/cache" | "s3://bucket/cache" | null, "semantic_threshold": 0.97 | null,
     "embed_model": "/models/embedder" | null}
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from jobs.errors import FreightError, ObjectNotFoundError
from jobs.storage import ObjectStore

CACHE_OPTIONS_KEY = "cache.json"
OFF = ("off", "none")  # --result-cache off: no cache, even with FREIGHT_RESULT_CACHE set


def cache_off(value: str) -> bool:
    """`value` (a --result-cache flag, FREIGHT_RESULT_CACHE, a suite file's result_cache) turns the
    cache off: "off" or "none" in any case, or empty; never a folder of that name."""
    return not value.strip() or value.strip().lower() in OFF


class CacheOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str | None = Field(None, description="the result cache: a folder or s3://bucket/prefix; None: off")
    semantic_threshold: float | None = Field(
        None, gt=0.0, le=1.0, description="reuse the answer of a cached prompt at least this similar (cosine)"
    )
    embed_model: str | None = Field(None, description="the `--task embed` checkpoint that embeds prompts")

    @model_validator(mode="after")
    def _semantic_needs(self) -> CacheOptions:
        if self.semantic_threshold is not None and self.embed_model is None:
            raise ValueError("--semantic-cache needs --embed-model (a --task embed checkpoint that embeds the prompts)")
        if self.embed_model is not None and self.semantic_threshold is None:
            raise ValueError("--embed-model embeds prompts for the semantic cache: give --semantic-cache THRESHOLD too")
        if self.semantic_threshold is not None and self.url is None:
            raise ValueError("--semantic-cache reuses answers of the result cache: give --result-cache DIR too "
                             "(or FREIGHT_RESULT_CACHE)")  # fmt: skip
        return self

    @property
    def enabled(self) -> bool:
        return self.url is not None


def cache_options(
    result_cache: str | None, semantic_cache: float | None, embed_model: str | None, default_url: str | None
) -> CacheOptions:
    """The options of the flags: `result_cache` (a URL, off (cache_off), or None for `default_url`,
    which is FREIGHT_RESULT_CACHE, off the same way); FreightError, naming the flag, for a bad combination or value."""
    url = default_url if result_cache is None else result_cache
    if url is not None and cache_off(url):
        url = None
    if semantic_cache is not None and not 0.0 < semantic_cache <= 1.0:
        raise FreightError(f"--semantic-cache {semantic_cache:g}: a cosine similarity threshold in (0, 1], e.g. 0.97")
    try:
        return CacheOptions(url=url, semantic_threshold=semantic_cache, embed_model=embed_model)
    except ValidationError as exc:
        raise FreightError(str(exc.errors()[0]["msg"]).removeprefix("Value error, ")) from None


def write_cache_options(store: ObjectStore, options: CacheOptions) -> None:
    """Replace OUT/cache.json (each submission's options replace the last one's); without a cache
    there is none (a job that never had one leaves no file)."""
    if options.enabled:
        store.put(CACHE_OPTIONS_KEY, options.model_dump_json(indent=1).encode())
    else:
        store.delete(CACHE_OPTIONS_KEY)


def read_cache_options(store: ObjectStore) -> CacheOptions:
    """OUT/cache.json, or no cache when the job never had one."""
    try:
        return CacheOptions.model_validate(json.loads(store.get(CACHE_OPTIONS_KEY)))
    except ObjectNotFoundError:
        return CacheOptions()
