"""The embedded runner: plan, shards and finalize in this process (no queue server)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from jobs.datasets import InputReader
from jobs.errors import ModelNotFoundError
from jobs.expiry import finalize_and_notify
from jobs.finalize import committed_shards
from jobs.log import get_logger
from jobs.manifest import PARTIAL_ROOT, Manifest
from jobs.model_cache import resolve_model
from jobs.settings import Settings, get_settings
from jobs.storage import ObjectStore
from worker.lazy_engine import EngineLoad, LazyEngine
from worker.result_cache import open_job_cache
from worker.shard import RowProgress, compute_shard
from worker.shard_commit import ComputedShard, ShardOutcome, commit_shard

log = get_logger(__name__)


@dataclass(frozen=True)
class LocalRun:
    """What run_local did. `report` is the cost report when the job completed, else None."""

    outcomes: tuple[ShardOutcome, ...]
    report: dict[str, Any] | None
    load_seconds: float

    @property
    def interrupted(self) -> bool:
        return self.report is None


def load_engine(
    manifest: Manifest, settings: Settings | None = None, device: str | None = None
) -> tuple[Any, float]:
    """(engine, seconds it took to load) for the manifest's model (S3 models via the local cache)."""
    spec = manifest.spec
    return load_model_engine(spec.model, spec.quantization, settings, device, spec.speculative, spec.speculative_tokens,
                             spec.quant_group)


def load_model_engine(
    model: str, quantization: str | None, settings: Settings | None = None, device: str | None = None,
    speculative: str | None = None, speculative_tokens: int | None = None, quant_group: int | None = None,
) -> tuple[Any, float]:
    """(engine, seconds it took to load) for `model` (a folder or s3:// prefix, as a job spec names it);
    speculative: the job spec's "ngram" | "draft:PATH" (None: off); quant_group: int4's group size."""
    from safetensors import SafetensorError

    from worker.engine import Engine

    t0 = time.perf_counter()
    model_dir = resolve_model(model, settings)
    config = engine_config(model, quantization, device, speculative, speculative_tokens, quant_group)
    try:
        engine = Engine.from_pretrained(str(model_dir), config)
    # a checkpoint the engine cannot use (jobs.model_check refused most before the manifest)
    except (ValueError, KeyError, OSError, SafetensorError) as exc:
        raise ModelNotFoundError(f"model {model} cannot be loaded: {exc}") from exc
    return engine, time.perf_counter() - t0


def engine_config(
    model: str, quantization: str | None, device: str | None = None, speculative: str | None = None,
    speculative_tokens: int | None = None, quant_group: int | None = None,
) -> Any:
    """The EngineConfig `load_model_engine` builds `model`'s engine with (device None: CUDA when torch
    sees one, else the CPU)."""
    import torch

    from worker.engine import EngineConfig
    from worker.engine.speculation.config import SpeculativeConfig

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        spec = None if speculative is None else SpeculativeConfig.parse(speculative, speculative_tokens)
        return EngineConfig(device=device, quantization=quantization, quant_group=quant_group, speculative=spec)
    except ValueError as exc:
        raise ModelNotFoundError(f"model {model} cannot be loaded: {exc}") from exc


def lazy_engine(
    manifest: Manifest, settings: Settings | None = None, device: str | None = None,
    load: EngineLoad | None = None,
) -> LazyEngine:
    """The manifest's engine, its weights loaded when a shard first has rows to compute (worker/lazy_engine.py);
    its tokenizer is read now, so a checkpoint without one fails here. `load`: how (default:
    `load_engine`, its seconds billed to the shard that loads it)."""
    from worker.engine.tokenizer import Tokenizer

    spec = manifest.spec
    model_dir = resolve_model(spec.model, settings)
    config = engine_config(spec.model, spec.quantization, device, spec.speculative, spec.speculative_tokens,
                           spec.quant_group)  # fmt: skip
    try:
        tokenizer = Tokenizer(model_dir)
    except (ValueError, OSError) as exc:
        raise ModelNotFoundError(f"model {spec.model} cannot be loaded: {exc}") from exc

    def load_now() -> tuple[Any, float]:
        engine, seconds = load_engine(manifest, settings, config.device)
        log.info("engine_loaded", model=spec.model, seconds=round(seconds, 3))
        return engine, seconds

    return LazyEngine(model_dir, config, tokenizer, load or load_now)


def partial_keys_by_shard(store: ObjectStore) -> dict[int, list[str]]:
    """Every shard's partial-row files, from one listing (not one per shard: on S3 each is a request)."""
    keys: dict[int, list[str]] = {}
    for key in store.list(PARTIAL_ROOT):
        if m := re.match(re.escape(PARTIAL_ROOT) + r"(\d+)/", key):
            keys.setdefault(int(m.group(1)), []).append(key)
    return keys


def next_attempt(partial_keys: list[str]) -> int:
    """One more than the highest attempt that left partial rows for a shard (0 if none), given the
    shard's partial keys."""
    attempts = [int(m.group(1)) for k in partial_keys if (m := re.search(r"/(\d+)\.parquet$", k))]
    return max(attempts, default=-1) + 1


def run_local(
    store: ObjectStore,
    manifest: Manifest,
    *,
    engine: Any = None,
    load_seconds: float = 0.0,
    settings: Settings | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_row: Callable[[RowProgress], None] | None = None,
    on_shard: Callable[[ShardOutcome], None] | None = None,
) -> LocalRun:
    """Run every uncommitted shard of the job in order, then finalize. Committed shards are skipped.

    Stops early (report None) when `should_stop` turns True; rerunning resumes. `engine`: an engine
    for the manifest's model, loaded or a LazyEngine (default: a LazyEngine, so a job the result cache
    answers in full loads no model); `load_seconds`: what loading it took, charged to the first shard
    run (a caller that keeps an engine across jobs charges it once).
    """
    done = committed_shards(store)
    todo = [s.index for s in manifest.shards if s.index not in done]
    if todo and engine is None:  # loaded by the first shard with rows to compute, billed to it
        engine = lazy_engine(manifest, settings)
    reader = InputReader(manifest.input, settings)
    partials = partial_keys_by_shard(store) if todo else {}
    job_cache = open_job_cache(store, manifest, engine, settings or get_settings()) if todo else None
    outcomes: list[ShardOutcome] = []

    def settled(outcome: ShardOutcome) -> None:
        outcomes.append(outcome)
        log.info(
            "shard_done",
            job_id=manifest.job_id,
            shard=outcome.shard,
            status=outcome.status,
            rows=outcome.rows,
            rows_failed=outcome.rows_failed,
        )
        if on_shard is not None:
            on_shard(outcome)

    charge = load_seconds  # the first shard run after the load pays for it
    # One shard's commit (result table, Parquet write, conditional put) runs on this thread while
    # the next shard computes; at most one is in flight, and its errors surface here.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="freight-commit") as committer:
        committing: Future[ShardOutcome] | None = None
        for index in todo:
            keys = partials.get(index, [])
            done = compute_shard(
                engine,
                store,
                manifest,
                index,
                attempt=next_attempt(keys),
                partial_keys=keys,
                should_stop=should_stop,
                load_seconds=charge,
                reader=reader,
                on_row=on_row,
                settings=settings,
                result_cache=job_cache,
            )
            charge = 0.0
            if committing is not None:
                settled(committing.result())
                committing = None
            if isinstance(done, ComputedShard):
                committing = committer.submit(commit_shard, store, done)
                continue
            settled(done)
            if done.status == "interrupted":
                return LocalRun(outcomes=tuple(outcomes), report=None, load_seconds=_loaded(engine, load_seconds))
        if committing is not None:
            settled(committing.result())
    report = finalize_and_notify(store, manifest, settings or get_settings())
    return LocalRun(outcomes=tuple(outcomes), report=report, load_seconds=_loaded(engine, load_seconds))


def _loaded(engine: Any, load_seconds: float) -> float:
    """The load seconds of this run: a LazyEngine's own (0.0 if it never loaded), else the caller's."""
    return engine.load_seconds if isinstance(engine, LazyEngine) else load_seconds
