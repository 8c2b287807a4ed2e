"""Jobs and eval histories planted in a store as freight writes them: a manifest, committed result
shards (real Parquet in the result schema), their cost records, waste records of lost attempts,
failure markers, a finalized job's cost.json and _SUCCESS; eval run records and reports. The
dashboard reads these with the project's own readers; nothing here fakes a reader."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from jobs import datasets
from jobs.cost import AttemptRecord, ShardRecord
from jobs.evals.collect import REPORT_JSON
from jobs.evals.history import History, MetricResult, RunRecord
from jobs.evals.intervals import wilson_interval
from jobs.evals.report import compare, report_json
from jobs.finalize import finalize
from jobs.manifest import (
    InputFile,
    InputPlan,
    Manifest,
    ShardPlan,
    shard_record_key,
    shard_result_key,
    waste_key,
)
from jobs.markers import write_failure
from jobs.spec import JobSpec
from jobs.storage import ObjectStore, open_store

SCHEMA = datasets.result_schema(False)
# the checkpoint of every eval run but the last, and the last's (retrained: its score drops)
CHECKPOINTS = ("sha256:" + "1f" * 32, "sha256:" + "e7" * 32)
CHAT = "/v1/chat/completions"


def plant_job(
    out: str,
    *,
    shards: int,
    rows_per_shard: int = 2,
    model: str = "models/tiny",
    created_at: float | None = None,
    market: str = "spot",
) -> tuple[ObjectStore, Manifest]:
    """OUT/manifest.json of a job of `shards` shards, nothing committed yet."""
    spec = JobSpec(input="/data/prompts.parquet", model=model, output=out, market=market)  # type: ignore[arg-type]
    rows = shards * rows_per_shard
    plan = InputPlan(format="parquet", files=(InputFile(url=spec.input, rows=rows, size=1),), rows=rows,
                     prompt_column="prompt", prompt_kind="text", id_column=None)  # fmt: skip
    plans = tuple(ShardPlan(index=i, rows=rows_per_shard, ranges=((i * rows_per_shard, (i + 1) * rows_per_shard),))
                  for i in range(shards))  # fmt: skip
    manifest = Manifest(job_id=spec.job_id, spec=spec, input=plan, shards=plans,
                        created_at=time.time() if created_at is None else created_at, price_per_hour=1.2,
                        on_demand_price_per_hour=3.6)  # fmt: skip
    store = open_store(out)
    store.put("manifest.json", manifest.to_json())
    return store, manifest


def result_bytes(first_row: int, rows: int, failed: int) -> bytes:
    """A shard's result Parquet: `rows` rows, the last `failed` of them failed with an error."""
    table = pa.Table.from_pylist([
        {"id": str(first_row + k), "completion": None if k >= rows - failed else f"answer {first_row + k}",
         "finish_reason": "error" if k >= rows - failed else "stop", "prompt_tokens": 0 if k >= rows - failed else 12,
         "cached_tokens": 0 if k >= rows - failed else 4, "completion_tokens": 0 if k >= rows - failed else 6,
         "error": f"row {first_row + k}: prompt has 9000 tokens, the model's context is 8192" if k >= rows - failed
         else None, "endpoint": CHAT}
        for k in range(rows)
    ], SCHEMA)  # fmt: skip
    return datasets.write_result(table)


def commit(
    store: ObjectStore, manifest: Manifest, indices: Iterable[int], *, failed_rows: int = 0, busy: float = 2.0,
    billed: float = 3.0, at: float | None = None, data: bytes | None = None,
) -> None:
    """Commit these shards: result object and cost record, as worker/shard_commit.py does (in a
    local store, as plain file writes: LocalStore's fsync per object makes thousands slow)."""
    at = time.time() if at is None else at
    for i in indices:
        plan = manifest.shards[i]
        ok = plan.rows - failed_rows
        _put(store, shard_result_key(i), data or result_bytes(plan.ranges[0][0], plan.rows, failed_rows))
        record = ShardRecord(
            job_id=manifest.job_id, shard=i, attempt=1, rows=plan.rows, rows_failed=failed_rows, prompt_tokens=12 * ok,
            cached_tokens=4 * ok, completion_tokens=6 * ok, busy_seconds=busy, prefill_seconds=busy / 4,
            decode_seconds=3 * busy / 4, spec_proposed_tokens=10 * ok, spec_accepted_tokens=7 * ok, load_seconds=0.0,
            reasoning_tokens=2 * ok, cache_hits=ok, cache_hit_seconds=0.5, deduplicated_rows=1,
            wall_seconds=billed, billed_seconds=billed, instance_type="g5.xlarge", market=manifest.spec.market,
            price_per_hour=1.2, on_demand_price_per_hour=3.6, cost_usd=billed * 1.2 / 3600,
            on_demand_cost_usd=billed * 3.6 / 3600, worker="worker-1", started_at=at - billed, finished_at=at,
        )  # fmt: skip
        _put(store, shard_record_key(i), record.model_dump_json().encode())


def _put(store: ObjectStore, key: str, data: bytes) -> None:
    path = store.local_path(key)
    if path is None:
        store.put(key, data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def lose_attempt(store: ObjectStore, manifest: Manifest, shard: int, attempt: int = 1, wasted: float = 0.001) -> None:
    """A waste record: an attempt of `shard` interrupted before its commit."""
    record = AttemptRecord(job_id=manifest.job_id, shard=shard, attempt=attempt, reason="interrupted",
                           rows_attempted=2, rows_saved=0, billed_seconds=3.0, instance_type="g5.xlarge",
                           market=manifest.spec.market, price_per_hour=1.2, cost_usd=wasted,
                           on_demand_cost_usd=3 * wasted, wasted_usd=wasted, worker="worker-2",
                           recorded_at=time.time())  # fmt: skip
    store.put(waste_key(shard, attempt, "t0k3n"), record.model_dump_json().encode())


def poison(store: ObjectStore, manifest: Manifest, shard: int) -> None:
    write_failure(store, {"job_id": manifest.job_id, "shard": shard, "rows": manifest.shards[shard].rows,
                          "attempts": 3, "reason": "worker crashed 3 times on this shard", "at": time.time()})  # fmt: skip


def finish(store: ObjectStore, manifest: Manifest) -> dict[str, Any]:
    """Commit what is left and finalize: cost.json, then _SUCCESS."""
    done = {int(k[len("shards/") : -len(".parquet")]) for k in store.list("shards/") if k.endswith(".parquet")}
    commit(store, manifest, [s.index for s in manifest.shards if s.index not in done])
    return finalize(store, manifest)


def plant_eval_history(history: ObjectStore, suite: str, model: str, scores: list[int], rows: int = 200,
                       runs_root: ObjectStore | None = None) -> list[RunRecord]:
    """One run record per score (right answers of `rows`), a day apart, Wilson intervals as collect
    computes them, the last on a new checkpoint; with `runs_root`, each run's report.json too (as
    `freight eval report` writes it)."""
    start = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)
    records: list[RunRecord] = []
    for day, right in enumerate(scores):
        at = start + timedelta(days=day)
        run_id = at.strftime("%Y%m%dT%H%M%S.%fZ") + f"-{day:08x}"
        ci = wilson_interval(right, rows)
        out = runs_root.url_of(f"runs/{run_id}") if runs_root is not None else f"/elsewhere/runs/{run_id}"
        record = RunRecord(suite=suite, model=model, run_id=run_id, started_at=at.isoformat(),
                           finished_at=(at + timedelta(minutes=20)).isoformat(), output=out,
                           dataset="data/arith.parquet", dataset_sha256="ab" * 32, sampling={"max_tokens": 32},
                           rows=rows, rows_failed=0, cost_usd=0.01 * (day + 1),
                           model_fingerprint=CHECKPOINTS[day == len(scores) - 1],
                           metrics={"exact_match": MetricResult(score=ci.mean, low=ci.low, high=ci.high,
                                                                confidence=0.95, method="wilson")})  # fmt: skip
        History(history).record(record)
        if runs_root is not None:
            entry = compare(record, records[-1] if records else None)
            runs_root.put(f"runs/{run_id}/{REPORT_JSON}", json.dumps(report_json(run_id, [entry])).encode())
        records.append(record)
    return records
