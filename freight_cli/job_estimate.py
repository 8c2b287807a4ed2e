"""A planned job's estimate (tokens, engine hours, dollars), and `--max-cost`, the cap it checks.

`freight estimate` prints the estimate; `run` and `submit` refuse a job above --max-cost before
writing anything. The estimate reads the dataset as `run` would (worker.estimate_tokens, imported
lazily: it needs the model's tokenizer) and prices it with the model's throughput profile
(jobs.profile_store).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from jobs.errors import FreightError
from jobs.finalize import committed_shards, report_now
from jobs.log import get_logger
from jobs.manifest import MANIFEST_KEY, Manifest
from jobs.result_cache.options import CacheOptions
from jobs.settings import Settings
from jobs.storage import ObjectStore

log = get_logger(__name__)

MaxCostOpt = Annotated[
    float | None,
    typer.Option(
        metavar="USD", min=0.0,
        help="refuse the job, writing nothing, when `freight estimate` predicts it costs more than USD",
    ),
]  # fmt: skip


def estimate_manifest(manifest: Manifest, settings: Settings, prices: Path | None = None,
                      caches: CacheOptions | None = None) -> Any:  # fmt: skip
    """The jobs.estimate.Estimate of a planned job (tokenizes every row: seconds per million); with
    `caches`, the rows the result cache holds are expected hits."""
    from jobs.cost import PriceTable
    from jobs.estimate import estimate
    from jobs.model_cache import resolve_model
    from jobs.profile_store import DEFAULT_PROFILE, ProfileStore, profile_key
    from worker.engine.tokenizer import Tokenizer
    from worker.estimate_tokens import count_tokens

    spec = manifest.spec
    model_dir = resolve_model(spec.model, settings)
    config = json.loads((Path(model_dir) / "config.json").read_text())
    key = profile_key(spec.model, spec.instance_type, spec.quantization_label)
    profile = ProfileStore.for_settings(settings).get(key) or DEFAULT_PROFILE
    counts = count_tokens(manifest, Tokenizer(Path(model_dir)), settings, config.get("max_position_embeddings"),
                          stop_hazard=profile.stop_hazard, cache_hits=_expected_hits(manifest, settings, caches))  # fmt: skip
    table = PriceTable.load(prices) if prices else PriceTable.load()
    return estimate(counts, profile, table, spec.instance_type, spec.market, spec.price_per_hour)


def _expected_hits(manifest: Manifest, settings: Settings, caches: CacheOptions | None) -> Any:
    """The rows of a shard's requests the result cache's index holds for the engine the job will
    have (on the CPU for the cpu-local instance type, else a GPU, each with its default dtype); None
    without a cache. A cache that does not exist yet holds nothing; one that cannot be used is an
    error (FreightError), as it is for `run`."""
    if caches is None or caches.url is None:
        return None
    from jobs.result_cache.store import ResultCache
    from jobs.storage import LocalStore, open_store
    from worker.engine import EngineConfig
    from worker.engine.numerics import engine_numerics
    from worker.result_cache import job_cache

    store = open_store(caches.url, settings)
    if isinstance(store, LocalStore) and not store.root.exists():
        return None
    cache = ResultCache.open(caches.url, settings, create=False)
    device = "cpu" if manifest.spec.instance_type == "cpu-local" else "cuda"
    return job_cache(cache, manifest, engine_numerics(EngineConfig(device=device)), settings).indexed


def max_cost_check(max_cost: float | None, settings: Settings, prices: Path | None) -> Any:
    """prepare_job's `check` for --max-cost: refuses a job whose estimate is above it (None: no check).
    On a rerun of a job already in OUT the cap holds for the work left: only the shards not yet
    committed are estimated (a shard partly run before an interruption counts whole, so the estimate
    errs high), and the refusal says what the job has already cost (its committed shards and any
    interrupted attempts, as `freight cost` bills them)."""
    if max_cost is None:
        return None

    def check(manifest: Manifest, store: ObjectStore) -> None:
        resumed = store.exists(MANIFEST_KEY)
        done = sorted(committed_shards(store) & {s.index for s in manifest.shards}) if resumed else []
        remaining = tuple(s for s in manifest.shards if s.index not in done)
        spent = report_now(store, manifest, done) if resumed else {"cost_usd": 0.0, "uncommitted_attempts": 0}
        est = estimate_manifest(manifest.model_copy(update={"shards": remaining}), settings, prices) if remaining else None
        log.info("max_cost_checked", max_cost=max_cost, remaining_usd=est.cost_usd if est else 0.0,
                 shards_left=len(remaining), spent_usd=spent["cost_usd"])  # fmt: skip
        if est is None or est.cost_usd <= max_cost:
            return
        basis = f"{est.confidence} profile; {est.rows:,} rows, {est.hours:.3f} h on {est.instance_type}"
        if not resumed:
            raise FreightError(f"--max-cost {max_cost:g}: the job is estimated at ${est.cost_usd:.6f} ({basis}): "
                               "raise the limit, or shrink the job")  # fmt: skip
        lost = spent["uncommitted_attempts"]
        raise FreightError(
            f"--max-cost {max_cost:g}: the remaining work ({len(remaining)} of {len(manifest.shards)} shards, "
            f"{est.rows:,} rows) is estimated at ${est.cost_usd:.6f} ({basis}); already spent "
            f"${spent['cost_usd']:.6f} on {len(done)} committed shard{'' if len(done) == 1 else 's'}"
            + (f" and {lost} interrupted attempt{'' if lost == 1 else 's'}" if lost else "")
            + ": raise the limit (it caps the work left), or shrink the job"
        )

    return check
