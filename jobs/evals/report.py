"""The eval report: per suite and model, each metric's score and interval, compared with the
previous run, as JSON (for machines) and Markdown (for people).

Regression rule: a metric regressed when its score dropped by more than the noise of the two runs.
- paired (the same rows scored both times, the usual nightly case): noise = half-width of the 95%
  bootstrap interval of the per-row score differences, so only changes that many rows agree on count;
- unpaired (the data changed, or the previous per-row scores are gone): noise = sqrt(d_prev^2 +
  u_now^2), d_prev the previous interval's reach below its score, u_now the current interval's reach
  above its score (errors combined as independent). Wilson intervals are asymmetric near 0 and 1, so
  the sides that bear on a drop are the ones used; for a symmetric interval both are its half-width.
A drop inside the noise is reported, not flagged.

A suite with LoRA adapters: every adapter's entry is also compared with its model's entry of the
same run, metric by metric on the same rows (paired, as above): "better" or "worse" when the
difference is beyond the noise, else "within noise".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict

from jobs.evals.history import RunRecord
from jobs.evals.scoring import paired_noise


class MetricComparison(BaseModel):
    """One metric of one run against the previous run (None fields when there is none)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    metric: str
    score: float
    low: float
    high: float
    previous_score: float | None = None
    previous_run_id: str | None = None
    delta: float | None = None  # score - previous score
    noise: float | None = None
    noise_method: Literal["paired", "unpaired"] | None = None
    regression: bool = False


class AdapterComparison(BaseModel):
    """One metric of a LoRA adapter's entry against its model's, in the same run on the same rows."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    metric: str
    score: float
    model_score: float
    delta: float  # score - model_score
    noise: float | None  # half-width of the 95% bootstrap interval of the per-row differences
    verdict: Literal["better", "worse", "within noise"]


class ReportEntry(BaseModel):
    """One suite on one model (or one LoRA adapter of it) in one run."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    suite: str
    model: str
    run_id: str
    rows: int
    rows_failed: int
    cost_usd: float
    dataset_changed: bool  # the previous run scored different data
    metrics: list[MetricComparison]
    chart: str | None = None  # the PNG of the score over time, relative to the report
    job_rows: int = 0  # rows of the suite's jobs, and those whose answers were reused (RunRecord)
    job_rows_reused: int = 0
    adapter: str | None = None  # the LoRA adapter that ran the suite; None: the model itself
    against_model: list[AdapterComparison] = []  # an adapter's entry: each metric against its model's

    @property
    def regressed(self) -> bool:
        return any(m.regression for m in self.metrics)


def _reach(a: float, b: float) -> float:
    """|a - b|, or 0 when either is not finite (a run with no rows)."""
    return abs(a - b) if math.isfinite(a) and math.isfinite(b) else 0.0


def compare(
    record: RunRecord, previous: RunRecord | None, paired_noise: dict[str, float] | None = None
) -> ReportEntry:
    """The report entry of `record`, compared metric by metric with `previous`; `paired_noise`:
    metric column -> noise of the paired per-row differences, where they could be computed."""
    metrics = []
    for name, now in record.metrics.items():
        before = previous.metrics.get(name) if previous is not None else None
        if before is None or previous is None:
            metrics.append(MetricComparison(metric=name, score=now.score, low=now.low, high=now.high))
            continue
        delta = now.score - before.score
        paired = (paired_noise or {}).get(name)
        if paired is not None:
            noise = paired
        else:
            noise = math.hypot(_reach(before.score, before.low), _reach(now.high, now.score))
        metrics.append(
            MetricComparison(
                metric=name,
                score=now.score,
                low=now.low,
                high=now.high,
                previous_score=before.score,
                previous_run_id=previous.run_id,
                delta=delta,
                noise=noise,
                noise_method="unpaired" if paired is None else "paired",
                regression=-delta > noise,
            )
        )
    return ReportEntry(
        suite=record.suite,
        model=record.model,
        run_id=record.run_id,
        rows=record.rows,
        rows_failed=record.rows_failed,
        cost_usd=record.cost_usd,
        dataset_changed=previous is not None and previous.dataset_sha256 != record.dataset_sha256,
        metrics=metrics,
        job_rows=record.job_rows,
        job_rows_reused=record.job_rows_reused,
        adapter=record.adapter,
    )


def with_adapter_comparisons(entries: list[ReportEntry], rows: Callable[[ReportEntry], pa.Table]) -> list[ReportEntry]:
    """`entries` with each adapter's entry compared to its model's entry of the same suite (`rows`:
    an entry's per-row scores, matched by id for the paired noise)."""
    models = {(e.suite, e.model): e for e in entries if e.adapter is None}
    out = []
    for entry in entries:
        model = models.get((entry.suite, entry.model))
        if entry.adapter is None or model is None:
            out.append(entry)
            continue
        mine, theirs = {m.metric: m for m in entry.metrics}, {m.metric: m for m in model.metrics}
        noise = paired_noise(rows(entry), rows(model), list(mine))
        compared = []
        for name, m in mine.items():
            if name not in theirs:
                continue
            delta = m.score - theirs[name].score
            beyond = name in noise and math.isfinite(delta) and abs(delta) > noise[name]
            verdict: Literal["better", "worse", "within noise"] = (
                ("better" if delta > 0 else "worse") if beyond else "within noise"
            )
            compared.append(AdapterComparison(metric=name, score=m.score, model_score=theirs[name].score, delta=delta,
                                              noise=noise.get(name), verdict=verdict))  # fmt: skip
        out.append(entry.model_copy(update={"against_model": compared}))
    return out


def _who(e: ReportEntry) -> str:
    return e.model if e.adapter is None else f"{e.model} + {e.adapter}"


def report_json(run_id: str, entries: list[ReportEntry]) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "regressions": sum(e.regressed for e in entries),
        "entries": [e.model_dump(mode="json") for e in entries],
    }


def _pct(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.1f}"


def report_markdown(run_id: str, entries: list[ReportEntry]) -> str:
    """A summary a person reads at a glance: one table row per suite, model and metric."""
    flagged = sum(e.regressed for e in entries)
    lines = [
        f"# Evaluation report {run_id}",
        "",
        f"{len(entries)} suite run(s); {flagged} with a regression beyond the noise."
        if flagged
        else f"{len(entries)} suite run(s); no regression.",
        "",
        "| suite | model | metric | score % | 95% CI | vs previous | rows | failed | cost USD |",
        "|---|---|---|---:|---|---|---:|---:|---:|",
    ]
    for e in entries:
        for i, m in enumerate(e.metrics):
            if m.delta is None:
                change = "first run"
            else:
                paired = ", paired" if m.noise_method == "paired" else ""
                change = f"{100 * m.delta:+.1f} (noise ±{100 * (m.noise or 0):.1f}{paired})"
                change += " **REGRESSION**" if m.regression else ""
            # rows, failures and cost belong to the suite run: shown on its first metric's line
            run = f"| {e.rows} | {e.rows_failed} | {e.cost_usd:.6f} |" if i == 0 else "| | | |"
            lines.append(
                f"| {e.suite} | {_who(e)} | {m.metric} | {_pct(m.score)} | {_pct(m.low)}–{_pct(m.high)} | {change} {run}"
            )
    compared = [(e, c) for e in entries for c in e.against_model]
    if compared:
        lines += ["", "LoRA adapters against their model (same run, same rows; noise: paired):", "",
                  "| suite | model | adapter | metric | adapter % | model % | difference | verdict |",
                  "|---|---|---|---|---:|---:|---|---|"]  # fmt: skip
        for e, c in compared:
            noise = f" (noise ±{100 * c.noise:.1f})" if c.noise is not None else ""
            lines.append(f"| {e.suite} | {e.model} | {e.adapter} | {c.metric} | {_pct(c.score)} | "
                         f"{_pct(c.model_score)} | {100 * c.delta:+.1f}{noise} | {c.verdict} |")  # fmt: skip
    notes = [
        f"- {e.suite} on {_who(e)}: the dataset changed since the previous run"
        for e in entries
        if e.dataset_changed
    ]
    charts = [f"![{e.suite} on {_who(e)}]({e.chart})" for e in entries if e.chart]
    rows, reused = sum(e.job_rows for e in entries), sum(e.job_rows_reused for e in entries)
    if rows:
        lines += ["", f"Reused: {reused:,} of {rows:,} job rows took an answer already computed (result cache, or "
                      "an equal row), at no engine cost."]  # fmt: skip
    if notes:
        lines += ["", "Notes:", *notes]
    if charts:
        lines += ["", *charts]
    return "\n".join(lines) + "\n"
