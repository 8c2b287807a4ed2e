"""Finishing an eval run: score the finished jobs, record history, compare, write the report.

Idempotent: collecting a run twice gives the same report (the history record of a run is written
once; a second collect reads it back instead of writing a new one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from jobs.datasets import read_result, write_result
from jobs.errors import FreightError, ObjectNotFoundError
from jobs.evals.chart import score_chart
from jobs.evals.data import SuiteData, of_adapter
from jobs.evals.history import History, MetricResult, RunRecord, entry_key
from jobs.evals.plan import PlannedModel, PlannedSuite, RunPlan, job_specs, read_plan
from jobs.evals.report import ReportEntry, compare, report_json, report_markdown, with_adapter_comparisons
from jobs.evals.scoring import paired_noise, read_job_results, score_suite
from jobs.evals.suite import Suite
from jobs.evals.suite_loader import parse_suite_text
from jobs.finalize import committed_shards, load_shard_record
from jobs.log import get_logger
from jobs.manifest import COST_KEY, SUCCESS_KEY
from jobs.markers import CANCEL_KEY, FAILURES_KEY
from jobs.spec import JobSpec
from jobs.storage import ObjectStore, open_store

log = get_logger(__name__)
REPORT_JSON = "report.json"
REPORT_MD = "report.md"


class EvalIncompleteError(FreightError):
    """Some jobs of the run have not finished yet."""


@dataclass(frozen=True)
class EvalReport:
    run_id: str
    entries: list[ReportEntry]
    markdown: str

    @property
    def regressions(self) -> int:
        return sum(e.regressed for e in self.entries)


def job_ended(store: ObjectStore) -> bool:
    """Complete (_SUCCESS), failed for good (failures.json) or cancelled: no more rows will come.
    Rows of shards that never committed are scored as failed rows."""
    return store.exists(SUCCESS_KEY) or store.exists(FAILURES_KEY) or store.exists(CANCEL_KEY)


def unfinished_jobs(plan: RunPlan) -> list[str]:
    """OUT of every job of the run that has not ended yet."""
    return [spec.output for spec in job_specs(plan) if not job_ended(open_store(spec.output))]


def _job_cost(spec: JobSpec | None, adapter: str | None = None) -> float:
    """cost.json's cost_usd; for a job that ended without finalize, its committed shards' costs. A
    job with adapters: the share of `adapter`'s rows (None: the model's own), as cost.json splits it."""
    if spec is None:
        return 0.0
    store = open_store(spec.output)
    if store.exists(COST_KEY):
        report = json.loads(store.get(COST_KEY))
        if spec.loras:
            split = report["base"] if adapter is None else report["adapters"].get(adapter, {})
            return float(split.get("cost_usd", 0.0))
        return float(report["cost_usd"])
    return sum(load_shard_record(store, i).cost_usd for i in committed_shards(store))


def _job_reuse(spec: JobSpec | None, adapter: str | None = None) -> tuple[int, int]:
    """(rows, rows whose answer was reused: result-cache hits and duplicates computed once) of a
    finished job's cost.json; (0, 0) without one. A job its model's adapters share counts once, on
    the model's own entry (cost.json does not split reuse by adapter)."""
    if spec is None or adapter is not None:
        return 0, 0
    store = open_store(spec.output)
    if not store.exists(COST_KEY):
        return 0, 0
    report = json.loads(store.get(COST_KEY))
    return int(report["rows"]), int(report.get("result_cache_hits", 0)) + int(report.get("deduplicated_rows", 0))


def _job_fingerprint(spec: JobSpec | None) -> str | None:
    """The checkpoint fingerprint a finished job's shard records carry (its cost.json's), if any."""
    if spec is None:
        return None
    store = open_store(spec.output)
    if not store.exists(COST_KEY):
        return None
    shards = json.loads(store.get(COST_KEY)).get("shards", [])
    return next((s["model_fingerprint"] for s in shards if s.get("model_fingerprint")), None)


def _paired_noise(
    rows: pa.Table, previous: RunRecord | None, record: RunRecord, base: str
) -> dict[str, float] | None:
    """Noise of the paired differences with the previous run when it scored the same data and its
    per-row scores are still in its OUT; None otherwise (the report falls back to unpaired)."""
    if previous is None or previous.dataset_sha256 != record.dataset_sha256:
        return None
    try:
        before = read_result(open_store(previous.output).get(f"{base}/scores.parquet"))
    except ObjectNotFoundError:
        log.warning("previous per-row scores gone; unpaired comparison", previous=previous.output)
        return None
    return paired_noise(rows, before, list(record.metrics)) or None


def _score_entry(
    plan: RunPlan,
    suite: Suite,
    planned: PlannedSuite,
    entry: PlannedModel,
    out: ObjectStore,
    history: History,
) -> ReportEntry:
    data = SuiteData(read_result(out.get(f"{suite.name}/rows.parquet")), planned.dataset_sha256)
    generated = of_adapter(read_job_results(open_store(entry.generate.output)) if entry.generate else None,
                           entry.adapter)  # fmt: skip
    likelihoods = of_adapter(read_job_results(open_store(entry.likelihood.output)) if entry.likelihood else None,
                             entry.adapter)  # fmt: skip
    scores = score_suite(suite, data, generated, likelihoods)
    base = f"{suite.name}/{entry_key(entry.model, entry.adapter)}"
    out.put(f"{base}/scores.parquet", write_result(scores.rows))
    record = RunRecord(
        suite=suite.name,
        model=entry.model,
        run_id=plan.run_id,
        started_at=plan.started_at,
        finished_at=datetime.now(UTC).isoformat(),
        output=plan.output,
        dataset=suite.dataset,
        dataset_sha256=planned.dataset_sha256,
        sampling=suite.sampling.model_dump(mode="json"),
        rows=scores.rows.num_rows,
        rows_failed=scores.rows_failed,
        cost_usd=_job_cost(entry.generate, entry.adapter) + _job_cost(entry.likelihood, entry.adapter),
        job_rows=_job_reuse(entry.generate, entry.adapter)[0] + _job_reuse(entry.likelihood, entry.adapter)[0],
        job_rows_reused=_job_reuse(entry.generate, entry.adapter)[1] + _job_reuse(entry.likelihood, entry.adapter)[1],
        model_fingerprint=_job_fingerprint(entry.generate) or _job_fingerprint(entry.likelihood),
        metrics={
            name: MetricResult(
                score=ci.mean,
                low=ci.low,
                high=ci.high,
                confidence=ci.confidence,
                method=scores.methods.get(name, "bootstrap"),
            )
            for name, ci in scores.intervals.items()
        },
        adapter=entry.adapter,
    )
    if not history.record(record):  # collected before: keep the stored record
        record = RunRecord.model_validate_json(history.store.get(record.key))
    runs = [r for r in history.runs(suite.name, entry.model, entry.adapter) if r.run_id <= plan.run_id]
    previous = history.previous(record, runs)
    reported = compare(record, previous, _paired_noise(scores.rows, previous, record, base))
    png = score_chart(runs, f"{suite.name} on {entry_key(entry.model, entry.adapter)}")
    if png is not None:
        out.put(f"{base}/chart.png", png)
        reported = reported.model_copy(update={"chart": f"{base}/chart.png"})
    log.info(
        "eval scored",
        suite=suite.name,
        model=entry.model,
        adapter=entry.adapter,
        rows=record.rows,
        failed=record.rows_failed,
        scores={k: round(v.score, 4) for k, v in record.metrics.items()},
        regression=reported.regressed,
    )
    return reported


def collect(output: str) -> EvalReport:
    """Score the run in `output` and write its report. EvalIncompleteError while jobs still run."""
    plan = read_plan(output)
    pending = unfinished_jobs(plan)
    if pending:
        raise EvalIncompleteError(
            f"eval run {plan.run_id}: {len(pending)} job(s) not finished yet (first: {pending[0]}); "
            "wait for them (`freight wait OUT`) and run `freight eval report` again"
        )
    suite_file = parse_suite_text(plan.suite_text, Path(plan.suite_file), read_columns=None)
    out = open_store(plan.output)
    history = History(open_store(plan.history))
    entries = [
        _score_entry(plan, suite_file.suite(planned.name), planned, entry, out, history)
        for planned in plan.suites
        for entry in planned.models
    ]
    entries = with_adapter_comparisons(entries, lambda e: read_scores(plan.output, e.suite, e.model, e.adapter))
    markdown = report_markdown(plan.run_id, entries)
    out.put(REPORT_JSON, json.dumps(report_json(plan.run_id, entries), indent=2).encode())
    out.put(REPORT_MD, markdown.encode())
    return EvalReport(plan.run_id, entries, markdown)


def read_scores(output: str, suite: str, model: str, adapter: str | None = None) -> pa.Table:
    """The per-row results of `suite` on `model` (or its LoRA `adapter`) in a collected run."""
    return read_result(open_store(output).get(f"{suite}/{entry_key(model, adapter)}/scores.parquet"))
