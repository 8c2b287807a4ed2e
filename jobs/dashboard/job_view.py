"""A job's page: its shards by state, where its money went, its tokens, engine extras, failed rows.

Everything here is read from the job's OUT (and, for fleet jobs, Redis: which shards run now and
on which worker) through the JobBoard's reader, so a page of a 10,000-shard job costs the records
that committed since the last look, not 10,000 reads.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc
import redis

from jobs import datasets
from jobs.cost import AttemptRecord
from jobs.dashboard.board import JobBoard, JobSummary
from jobs.dashboard.formatting import usd
from jobs.dashboard.job_reader import JobReader, JobTotals
from jobs.live_state import LiveState
from jobs.log import get_logger
from jobs.manifest import shard_result_key

log = get_logger(__name__)

# one character per shard in the grid's state string
COMMITTED, RUNNING, RETRIED, POISON, PENDING = "c", "r", "t", "p", "q"
STATE_NAMES = {COMMITTED: "committed", RUNNING: "running", RETRIED: "retried", POISON: "poison", PENDING: "pending"}
FAILED_ROWS_SHOWN = 20
TIMELINE_POINTS = 400  # the cost-over-time line keeps at most this many points


@dataclass(frozen=True)
class ShardLive:
    """What Redis says of a fleet job's shards: which run, on which worker, and attempts so far."""

    running: dict[int, str]  # shard -> worker id ("" when no heartbeat names it yet)
    attempts: dict[int, int]


def shard_live(live: LiveState | None, job_id: str) -> ShardLive:
    if live is None:
        return ShardLive({}, {})
    try:
        states = live.shard_states(job_id)
        attempts = live.attempts(job_id)
        beats = live.workers()
    except redis.RedisError as exc:
        log.warning("dashboard_redis_unavailable", error=str(exc))
        return ShardLive({}, {})
    on = {b.shard: b.worker_id for b in beats if b.job_id == job_id and b.shard is not None}
    return ShardLive({i: on.get(i, "") for i, s in states.items() if s == "running"}, attempts)


def grid(total: int, committed: set[int], failed: set[int], live: ShardLive, wasted: Counter[int]) -> str:
    """The state string: committed > poison (failed for good) > running > retried (an attempt ended
    without a commit) > pending."""
    cells = []
    for i in range(total):
        if i in committed:
            cells.append(COMMITTED)
        elif i in failed:
            cells.append(POISON)
        elif i in live.running:
            cells.append(RUNNING)
        elif wasted[i] or live.attempts.get(i, 0) > 1:
            cells.append(RETRIED)
        else:
            cells.append(PENDING)
    return "".join(cells)


def attempt_counts(wasted: Counter[int], live: ShardLive, committed: set[int]) -> dict[int, int]:
    """Attempts of each shard that had any: Redis counts every start of a fleet job's shard; storage
    has a waste record per attempt that ended without a commit (plus the committing one)."""
    out = dict(live.attempts)
    for shard, n in wasted.items():
        out[shard] = max(out.get(shard, 0), n + (shard in committed or shard in live.running))
    return out


def cost_breakdown(totals: JobTotals, attempts: list[AttemptRecord], report: dict[str, Any]) -> dict[str, Any]:
    """Where the money went. busy: the engine's share of each committed shard's billed time; idle:
    the rest of it (model load, reading, writing, commit) plus the saved part of interrupted attempts;
    waste: attempts' work that was thrown away. Spot and on-demand: what was paid on each market, and
    what all of it would have cost on demand."""
    paid = totals.cost_usd + sum(a.cost_usd for a in attempts)
    waste = sum(a.wasted_usd for a in attempts)
    market = Counter(totals.market_cost_usd)
    for a in attempts:
        market[a.market] += a.cost_usd
    return {
        "total": paid,
        "busy": totals.busy_cost_usd,
        "idle": max(paid - totals.busy_cost_usd - waste, 0.0),
        "waste": waste,
        "spot": market["spot"],
        "on_demand": market["on-demand"],
        "on_demand_equivalent": totals.on_demand_cost_usd + sum(a.on_demand_cost_usd for a in attempts),
        "input_cost": report.get("input_cost_usd"),
        "output_cost": report.get("output_cost_usd"),
        "usd_per_million_input": report.get("usd_per_million_input_tokens"),
        "usd_per_million_output": report.get("usd_per_million_output_tokens"),
        "timeline": _timeline(totals.billed, attempts),
    }


def _timeline(billed: list[tuple[float, float]], attempts: list[AttemptRecord]) -> list[list[float]]:
    """[[unix seconds, cumulative USD], ...]: the cost as each shard and attempt was billed."""
    events = sorted([*billed, *((a.recorded_at, a.cost_usd) for a in attempts)])
    points, total = [], 0.0
    for at, cost in events:
        total += cost
        points.append([at, total])
    if len(points) > TIMELINE_POINTS:  # keep the last point: the line ends at the total
        step = len(points) / TIMELINE_POINTS
        points = [points[int(k * step)] for k in range(TIMELINE_POINTS - 1)] + [points[-1]]
    return points


def tokens(report: dict[str, Any]) -> dict[str, int]:
    """Prompt tokens split into cached (served from the prefix cache) and computed, completion tokens,
    and of those the reasoning tokens of rows that think (when there are any)."""
    prompt, cached = int(report.get("prompt_tokens") or 0), int(report.get("cached_tokens") or 0)
    out = {"prompt": prompt, "cached": cached, "computed_prompt": max(prompt - cached, 0),
           "completion": int(report.get("completion_tokens") or 0)}  # fmt: skip
    if int(report.get("reasoning_tokens") or 0):
        out["reasoning"] = int(report["reasoning_tokens"])
    return out


def extras(report: dict[str, Any]) -> list[dict[str, str]]:
    """The engine's extras that this job used: speculative acceptance, structured-output rows,
    prefix-cache and result-cache hits, duplicate rows computed once. Each only where it is not zero."""
    out = []
    proposed = int(report.get("spec_proposed_tokens") or 0)
    if proposed:
        accepted = int(report.get("spec_accepted_tokens") or 0)
        out.append({"name": "speculative acceptance",
                    "value": f"{accepted / proposed:.1%} ({accepted:,} of {proposed:,} proposed tokens)"})  # fmt: skip
    if int(report.get("constrained_rows") or 0):
        out.append({"name": "structured-output rows", "value": f"{int(report['constrained_rows']):,}"})
    prompt = int(report.get("prompt_tokens") or 0)
    if int(report.get("cached_tokens") or 0) and prompt:
        out.append({"name": "prefix-cache hits",
                    "value": f"{int(report['cached_tokens']) / prompt:.1%} of prompt tokens"})  # fmt: skip
    hits = int(report.get("result_cache_hits") or 0)
    if hits:
        semantic = int(report.get("result_cache_semantic_hits") or 0)
        saved = float(report.get("result_cache_usd_saved") or 0.0)
        out.append({"name": "result-cache hits",
                    "value": f"{hits:,} rows ({semantic:,} semantic), {usd(saved)} saved"})  # fmt: skip
    if int(report.get("deduplicated_rows") or 0):
        out.append({"name": "duplicate rows computed once", "value": f"{int(report['deduplicated_rows']):,}"})
    return out


def failed_rows(reader: JobReader, shards: list[int], limit: int = FAILED_ROWS_SHOWN) -> list[dict[str, Any]]:
    """Up to `limit` failed rows (shard, id, finish_reason, error), from the first of `shards` (those
    with a failed row); each shard's failed rows are read once (a committed result never changes)."""
    out: list[dict[str, Any]] = []
    for shard in shards:
        if len(out) >= limit:
            break
        key = shard_result_key(shard)
        rows = reader.cache.get(reader.store.url_of(key) + "#failed", lambda key=key: _failed_in(reader, key, limit))
        out += [{"shard": shard, **row} for row in rows[: limit - len(out)]]
    return out


def _failed_in(reader: JobReader, key: str, limit: int) -> list[dict[str, Any]]:
    table = datasets.read_result(reader.store.get(key)).select(["id", "finish_reason", "error"])
    failed = table.filter(pc.is_valid(table.column("error"))).slice(0, limit)
    return [{"id": str(r["id"]), "finish_reason": r["finish_reason"], "error": r["error"]} for r in failed.to_pylist()]


def job_detail(board: JobBoard, job: JobSummary) -> dict[str, Any]:
    """The job page's data (JSON-ready); a batch not yet planned has its summary only."""
    detail: dict[str, Any] = {"job": job.as_dict()}
    out = board.snapshot().listing.outs.get(job.out)
    if job.job_id is None or out is None:
        return detail
    reader = board.reader(out)
    manifest = reader.manifest()
    totals, attempts = reader.totals(), reader.attempt_records()
    report = reader.report()
    live = shard_live(board.live, job.job_id) if not job.done else ShardLive({}, {})
    wasted = Counter(a.shard for a in attempts)
    failures = reader.failures()
    states = grid(len(manifest.shards), out.committed, out.failed, live, wasted)
    detail.update(
        grid=states,
        counts={STATE_NAMES[k]: v for k, v in sorted(Counter(states).items())},
        workers={str(i): w for i, w in sorted(live.running.items())},
        attempts={str(i): n for i, n in sorted(attempt_counts(wasted, live, out.committed).items()) if n > 1},
        poison=[{"shard": int(f["shard"]), "reason": str(f.get("reason", "")), "attempts": f.get("attempts")}
                for f in failures],  # fmt: skip
        cost=cost_breakdown(totals, attempts, report),
        tokens=tokens(report),
        extras=extras(report),
        failed_rows=failed_rows(reader, totals.with_failed_rows),
        finalized=out.finalized,
    )
    return detail
