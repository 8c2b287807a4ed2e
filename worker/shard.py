"""run_shard: one shard from input rows to a committed result + cost record. Used embedded and by Celery.

`compute_shard` runs the rows (or saves an interrupted attempt's partial rows); `commit_shard`
(worker/shard_commit.py) commits the result. The embedded runner overlaps one shard's commit with
the next shard's compute; Celery commits before it acks. A committed shard is never recomputed.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobs import datasets
from jobs.cost import BASE_USAGE, AdapterUsage, ShardPricing, ShardRecord, row_seconds
from jobs.endpoints import default_endpoint
from jobs.manifest import Manifest, partial_key, partial_prefix, shard_result_key, waste_key
from jobs.settings import Settings, get_settings
from jobs.storage import ObjectStore
from worker.adapters import use_adapters
from worker.embed_rows import collect_embeddings, split_embeddings
from worker.engine.stats import EngineStats
from worker.lazy_engine import ready_engine
from worker.result_cache import JobCache
from worker.row_dedup import find_duplicates
from worker.row_engine import RowSink, collect_rows
from worker.row_requests import RowRequest, build_requests
from worker.shard_commit import ComputedShard, ShardOutcome, attempt_record, commit_shard
from worker.shard_rows import RowResult, error_row, result_row, rows_table


@dataclass(frozen=True)
class RowProgress:
    """Sent to `on_row` as each row finishes (tokens of that row)."""

    shard: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    failed: bool
    # speculative decoding: the engine's proposed / accepted tokens since the previous report (summed
    # over a run's reports: the engine's totals; a live acceptance rate for the progress line)
    spec_proposed_tokens: int = 0
    spec_accepted_tokens: int = 0


def default_pricing(manifest: Manifest) -> ShardPricing:
    spec = manifest.spec
    return ShardPricing(
        instance_type=spec.instance_type,
        market=spec.market,
        price_per_hour=manifest.price_per_hour,
        on_demand_price_per_hour=manifest.on_demand_price_per_hour,
    )


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def run_shard(
    engine: Any,
    store: ObjectStore,
    manifest: Manifest,
    shard_index: int,
    **kwargs: Any,
) -> ShardOutcome:
    """Run shard `shard_index` of `manifest` with a loaded `engine` and commit it into `store` (OUT).
    Keyword arguments: those of `compute_shard`."""
    done = compute_shard(engine, store, manifest, shard_index, **kwargs)
    return done if isinstance(done, ShardOutcome) else commit_shard(store, done)


def compute_shard(
    engine: Any,
    store: ObjectStore,
    manifest: Manifest,
    shard_index: int,
    *,
    attempt: int = 0,
    should_stop: Callable[[], bool] | None = None,
    pricing: ShardPricing | None = None,
    load_seconds: float = 0.0,
    reader: datasets.InputReader | None = None,
    on_row: Callable[[RowProgress], None] | None = None,
    settings: Settings | None = None,
    partial_keys: list[str] | None = None,
    result_cache: JobCache | None = None,
) -> ComputedShard | ShardOutcome:
    """Run shard `shard_index` of `manifest` with `engine` (loaded, or a LazyEngine, loaded here only
    when rows are left to compute after the result cache and the dedup): a ComputedShard to commit,
    or the outcome when there is nothing to commit ("already_committed", "interrupted").

    attempt: this attempt's number (partial rows are saved as partial/<n>/<attempt>.parquet).
    should_stop: checked before every engine step; when it turns True the finished rows are saved
      as partial rows, the attempt's cost is recorded under waste/, and "interrupted" is returned.
    pricing: where this runs (default: the manifest's instance type and price).
    load_seconds: model load time to charge to this shard (the first shard after a load); a
      LazyEngine's load, when this shard runs it, is added.
    reader: an InputReader to reuse across shards of one job (default: a fresh one).
    partial_keys: this shard's partial-row files when the caller listed them already (default: list).
    result_cache: the job's result cache (worker/result_cache.py): deterministic rows it holds are
      served from it, and the rows this attempt computes are written to it after the commit.
    """
    started = time.time()
    t0 = time.perf_counter()
    shard = manifest.shards[shard_index]
    pricing = pricing or default_pricing(manifest)
    if store.exists(shard_result_key(shard_index)):
        return ShardOutcome(shard=shard_index, status="already_committed", rows=shard.rows, rows_failed=0)

    rows = shard.row_indices()
    keys = store.list(partial_prefix(shard_index)) if partial_keys is None else sorted(partial_keys)
    done = _read_partial(store, keys, default_endpoint(manifest.input))
    reader = reader or datasets.InputReader(manifest.input, settings)
    table = reader.read(shard.ranges)
    results: dict[int, RowResult] = {r: done[r] for r in rows if r in done}
    todo = [i for i, r in enumerate(rows) if r not in results]  # positions in `table`
    if len(todo) < len(rows):  # rows from partial files are neither tokenized nor rendered again
        table = table.take(todo)
    max_n = (settings or get_settings()).max_n
    requests = build_requests(
        table, [rows[i] for i in todo], manifest.spec, manifest.input, engine.tokenizer, max_n
    )
    report = _RowReporter(on_row, shard_index)
    pending: list[RowRequest] = []
    for req in requests:
        if req.error is not None:
            results[req.row] = error_row(req)
            report(results[req.row])
        else:
            pending.append(req)

    dups = find_duplicates(pending)

    def finished(res: RowResult) -> None:
        report(res)
        dups.fill(res, results, report)

    hits, hit_seconds = result_cache.lookup(dups.unique) if result_cache is not None else ({}, {})
    for res in hits.values():
        results[res.row] = res
        finished(res)
    to_run = [req for req in dups.unique if req.row not in hits]
    semantic = None
    if result_cache is not None and result_cache.semantic is not None and to_run:
        semantic = result_cache.semantic.lookup(to_run)  # rows close enough to a cached prompt
        for res in semantic.hits.values():
            results[res.row] = res
            finished(res)
        hit_seconds.update(semantic.seconds)
        to_run = [req for req in to_run if req.row not in semantic.hits]
    for original, copies in dups.copies.items():  # a copy of a cached row saved what its original did
        for req in copies:
            if original in hit_seconds:
                hit_seconds[req.row] = hit_seconds[original]

    # the model loads only now, when rows are left to compute (a LazyEngine): its load is billed to
    # this shard, and the time it took is not the shard's wall time
    loading = time.perf_counter()
    engine, loaded = ready_engine(engine) if to_run else (engine, 0.0)
    load_seconds += loaded
    load_wait = time.perf_counter() - loading
    if to_run:
        use_adapters(engine, manifest.spec, settings)
    stats = engine.stats if to_run else EngineStats()  # nothing to run: no engine work, none loaded
    report.watch(stats)
    before = stats.snapshot()
    embed, generate = split_embeddings(to_run)
    sink = RowSink(results, should_stop, finished)
    stopped = collect_embeddings(engine, embed, sink) or collect_rows(engine, generate, sink, manifest.spec.cache_salt)
    engine_time = stats.snapshot() - before  # busy, prefill and decode seconds of this attempt
    busy = engine_time.busy_seconds
    likelihood = manifest.spec.continuation_column is not None
    worker = worker_name()

    if stopped:
        saved = [results[r] for r in rows if r in results]
        new = [res for res in saved if res.row not in done]  # earlier attempts' files hold the rest
        if new:
            store.put(
                partial_key(shard_index, attempt),
                datasets.write_result(
                    rows_table(new, likelihood, with_row=True, id_type=manifest.input.id_type)
                ),
            )
        attempted = len(to_run)
        finished_now = sum(1 for req in to_run if req.row in results)
        billed = time.perf_counter() - t0 - load_wait + load_seconds
        rec = attempt_record(
            manifest, shard_index, attempt, "interrupted", pricing, billed, attempted, finished_now, worker
        )
        store.put(waste_key(shard_index, attempt, uuid.uuid4().hex[:8]), rec.model_dump_json().encode())
        return ShardOutcome(
            shard=shard_index,
            status="interrupted",
            rows=len(saved),
            rows_failed=sum(1 for r in saved if r.error),
            attempt_record=rec,
        )

    ordered = [results[r] for r in rows]
    # a refused row (too long, bad input) cost no engine work; a duplicate took another row's answer,
    # a cached one an earlier job's
    ran = [r for r in ordered if r.error is None and not r.duplicate and r.cached is None]
    copies = [r for r in ordered if r.duplicate and r.error is None and r.cached is None]
    cached = [r for r in ordered if r.cached is not None]
    computed = [r for r in ran if r.row not in done]  # this attempt's engine work
    prompt_total = sum(r.prompt_tokens - r.cached_tokens for r in computed)
    completion_total = sum(r.completion_tokens for r in computed)

    def seconds(r: RowResult) -> float:
        return row_seconds(r.prompt_tokens - r.cached_tokens, r.completion_tokens, engine_time.prefill_seconds,
                           engine_time.decode_seconds, prompt_total, completion_total)  # fmt: skip

    entries = [] if result_cache is None else result_cache.entries(
        [(req, results[req.row], seconds(results[req.row])) for req in to_run],
        semantic.vectors if semantic is not None else None,
    )
    wall = time.perf_counter() - t0 - load_wait
    billed = wall + load_seconds
    record = ShardRecord(
        job_id=manifest.job_id,
        shard=shard_index,
        attempt=attempt,
        rows=len(ordered),
        rows_failed=sum(1 for r in ordered if r.error is not None),
        rows_from_partial=sum(1 for r in rows if r in done),
        prompt_tokens=sum(r.prompt_tokens for r in ran),
        cached_tokens=sum(r.cached_tokens for r in ran),
        completion_tokens=sum(r.completion_tokens for r in ran),
        reasoning_tokens=sum(r.reasoning_tokens or 0 for r in ran),
        busy_seconds=busy,
        prefill_seconds=engine_time.prefill_seconds,
        decode_seconds=engine_time.decode_seconds,
        constrained_rows=sum(1 for r in ordered if r.constrained),
        mask_seconds=engine_time.mask_seconds,
        spec_proposed_tokens=engine_time.spec_proposed_tokens,
        spec_accepted_tokens=engine_time.spec_accepted_tokens,
        spec_grammar_cut_tokens=engine_time.spec_grammar_cut_tokens,
        deduplicated_rows=len(copies),
        deduplicated_prompt_tokens=sum(r.prompt_tokens for r in copies),
        deduplicated_completion_tokens=sum(r.completion_tokens for r in copies),
        deduplicated_seconds=sum(seconds(r) for r in copies),
        cache_hits=len(cached),
        cache_semantic_hits=sum(1 for r in cached if r.cached == "semantic"),
        cache_hit_prompt_tokens=sum(r.prompt_tokens for r in cached),
        cache_hit_completion_tokens=sum(r.completion_tokens for r in cached),
        cache_hit_seconds=sum(hit_seconds.get(r.row, 0.0) for r in cached),
        cache_entries=len(entries),
        cache_space=result_cache.space.space if result_cache is not None else None,
        adapters=_adapter_usage(manifest.spec.adapters, ordered, ran, {r.row for r in computed}, seconds),
        model_fingerprint=result_cache.space.describe.get("fingerprint") if result_cache is not None else None,
        load_seconds=load_seconds,
        wall_seconds=wall,
        billed_seconds=billed,
        on_demand_price_per_hour=pricing.on_demand_price_per_hour,
        **pricing.charge(billed),
        worker=worker,
        started_at=started,
        finished_at=time.time(),
    )
    return ComputedShard(
        manifest=manifest, rows=ordered, record=record, pricing=pricing, rows_attempted=len(to_run),
        cache_write=(result_cache, entries) if result_cache is not None and entries else None,
    )


def _adapter_usage(adapters: dict[str, str], ordered: list[RowResult], ran: list[RowResult], computed: set[int],
                   seconds: Callable[[RowResult], float]) -> dict[str, AdapterUsage]:  # fmt: skip
    """ShardRecord.adapters of a job with LoRA adapters ({} without): every row counted under its
    adapter (BASE_USAGE: the model's own), tokens as the record counts them (rows that ran), engine
    seconds of the rows this attempt computed."""
    if not adapters:
        return {}
    usage: dict[str, dict[str, Any]] = {name: {} for name in [BASE_USAGE, *adapters]}
    took = {r.row for r in ran}
    for r in ordered:
        u = usage[r.adapter or BASE_USAGE]
        u["rows"] = u.get("rows", 0) + 1
        u["rows_failed"] = u.get("rows_failed", 0) + (r.error is not None)
        if r.row in took:
            for key in ("prompt_tokens", "cached_tokens", "completion_tokens"):
                u[key] = u.get(key, 0) + getattr(r, key)
        if r.row in computed:
            u["busy_seconds"] = u.get("busy_seconds", 0.0) + seconds(r)
    return {name: AdapterUsage(**u) for name, u in usage.items()}


class _RowReporter:
    """Calls on_row with a RowProgress per finished row; the engine's speculation counters since the
    previous call ride along (the engine counts per step, not per row) once `watch` named its stats
    (rows reported before, refused or cached ones, carry none)."""

    def __init__(self, on_row: Callable[[RowProgress], None] | None, shard: int) -> None:
        self.on_row, self.shard = on_row, shard
        self.watch(EngineStats())

    def watch(self, stats: Any) -> None:
        """Report the speculation counters of `stats` (an engine's EngineStats) from now on."""
        self.stats = stats
        self.proposed, self.accepted = stats.spec_proposed_tokens, stats.spec_accepted_tokens

    def __call__(self, res: RowResult) -> None:
        if self.on_row is None:
            return
        proposed, accepted = self.stats.spec_proposed_tokens, self.stats.spec_accepted_tokens
        self.on_row(
            RowProgress(
                shard=self.shard,
                prompt_tokens=res.prompt_tokens,
                cached_tokens=res.cached_tokens,
                completion_tokens=res.completion_tokens,
                failed=res.error is not None,
                spec_proposed_tokens=proposed - self.proposed,
                spec_accepted_tokens=accepted - self.accepted,
            )
        )
        self.proposed, self.accepted = proposed, accepted


def _read_partial(store: ObjectStore, keys: list[str], endpoint: str) -> dict[int, RowResult]:
    """Rows finished by earlier interrupted attempts, from the shard's partial files `keys` (later
    attempts win; all agree, seeds are per row). `endpoint`: for rows of files older than that column."""
    done: dict[int, RowResult] = {}
    for key in keys:
        if not key.endswith(".parquet"):
            continue
        table = datasets.read_result(store.get(key))
        for row in table.to_pylist():
            res = result_row(row, endpoint)
            done[res.row] = res
    return done


__all__ = ["ComputedShard", "RowProgress", "ShardOutcome", "compute_shard", "default_pricing", "run_shard"]
