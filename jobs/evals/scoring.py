"""Job results -> per-row scores of a suite on one model, and the score of each metric.

A row that failed (its generation or any of its options errored, or a metric could not read its
reference) keeps its error and scores 0 in every metric: failures never raise a score.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from jobs.datasets import read_result
from jobs.evals.bootstrap import Interval, bootstrap_ci
from jobs.evals.data import OPTION_SEPARATOR, SuiteData, reference_key
from jobs.evals.intervals import score_interval
from jobs.evals.metrics import GenerationMetric, MultipleChoice
from jobs.evals.suite import Suite
from jobs.storage import ObjectStore


def read_job_results(store: ObjectStore) -> pa.Table | None:
    """All committed result shards of a job (its OUT store) as one table; None when there is none."""
    keys = [k for k in store.list("shards/") if k.endswith(".parquet")]
    if not keys:
        return None
    return pa.concat_tables([read_result(store.get(k)) for k in keys], promote_options="default")


@dataclass(frozen=True)
class SuiteScores:
    """Per-row results (the eval results table) and each metric column's interval."""

    rows: pa.Table  # id, reference, completion, finish_reason, error, one float64 column per metric column
    intervals: dict[str, Interval]
    rows_failed: int
    methods: dict[str, str] = field(default_factory=dict)  # column -> how its interval was made


def _by_id(table: pa.Table | None, columns: list[str]) -> dict[str, dict[str, Any]]:
    if table is None:
        return {}
    return {row["id"]: row for row in table.select(["id", *columns]).to_pylist()}


def _option_logprobs(opts: dict[str, dict[str, Any]], qid: str, count: int) -> list[float]:
    logprobs = []
    for k in range(count):
        result = opts.get(f"{qid}{OPTION_SEPARATOR}{k}")
        if result is None or result["error"] is not None or result["continuation_logprob"] is None:
            why = "missing" if result is None else result["error"] or "no logprob"
            raise ValueError(f"option {k}: {why}")
        logprobs.append(float(result["continuation_logprob"]))
    return logprobs


def score_suite(
    suite: Suite,
    data: SuiteData,
    generated: pa.Table | None,
    likelihoods: pa.Table | None,
    *,
    confidence: float = 0.95,
    resamples: int = 1000,
) -> SuiteScores:
    """Score every row. `generated`: the generation job's results (when the suite has generation
    metrics); `likelihoods`: the scoring job's results (when it has a multiple-choice metric).
    A metric whose inputs failed on a row scores 0 there; the row counts as failed."""
    gen = _by_id(generated, ["completion", "finish_reason", "error"])
    opts = _by_id(likelihoods, ["continuation_logprob", "error"])
    columns = [c for m in suite.metrics for c in m.columns()]
    out: dict[str, list[Any]] = {
        name: [] for name in ["id", "completion", "finish_reason", "error", *columns]
    }
    references = {m.column: data.table.column(reference_key(m)).to_pylist() for m in suite.metrics}
    choices = data.table.column("choices").to_pylist() if "choices" in data.table.column_names else None
    failed = 0
    for i, qid in enumerate(data.table.column("id").to_pylist()):
        scores: dict[str, float] = {}
        errors: list[str] = []
        row = gen.get(qid)
        if suite.needs_generation and (row is None or row["error"] is not None):
            errors.append("no generation result for this row" if row is None else str(row["error"]))
        for metric in suite.metrics:
            try:
                if isinstance(metric, MultipleChoice):
                    options = [str(o) for o in (choices[i] if choices is not None else None) or []]
                    if not options:
                        raise ValueError("the row has no options")
                    logprobs = _option_logprobs(opts, qid, len(options))
                    acc, acc_norm = metric.score_options(logprobs, options, references[metric.column][i])
                    scores[metric.columns()[0]], scores[metric.columns()[1]] = acc, acc_norm
                elif isinstance(metric, GenerationMetric) and row is not None and row["error"] is None:
                    scores[metric.column] = metric.score(
                        row["completion"] or "", references[metric.column][i]
                    )
            except ValueError as exc:
                errors.append(f"{metric.column}: {exc}")
        failed += bool(errors)
        out["id"].append(qid)
        out["completion"].append(row["completion"] if row else None)
        out["finish_reason"].append(row["finish_reason"] if row else None)
        out["error"].append("; ".join(errors) if errors else None)
        for name in columns:
            out[name].append(scores.get(name, 0.0))
    fields = [
        pa.field("id", pa.string()),
        pa.field("completion", pa.string()),
        pa.field("finish_reason", pa.string()),
        pa.field("error", pa.string()),
        *[pa.field(name, pa.float64()) for name in columns],
    ]
    table = pa.Table.from_pydict(out, schema=pa.schema(fields))
    table = table.add_column(1, "reference", data.table.column("reference"))
    made = {
        name: score_interval(table.column(name).to_numpy(), confidence=confidence, resamples=resamples, seed=0)
        for name in columns
    }
    intervals = {name: ci for name, (ci, _) in made.items()}
    return SuiteScores(table, intervals, failed, {name: method for name, (_, method) in made.items()})


def paired_noise(
    current: pa.Table, previous: pa.Table, columns: list[str], confidence: float = 0.95
) -> dict[str, float]:
    """Per metric column: half-width of the bootstrap interval of (current - previous) row scores,
    rows matched by id. Empty when the two runs did not score the same ids."""
    ids = current.column("id").to_pylist()
    position = {row_id: i for i, row_id in enumerate(previous.column("id").to_pylist())}
    if len(position) != len(ids) or any(row_id not in position for row_id in ids):
        return {}
    order = [position[row_id] for row_id in ids]
    noise = {}
    for name in columns:
        if name in previous.column_names:
            now = current.column(name).to_numpy()
            before = previous.column(name).to_numpy()[order]
            noise[name] = bootstrap_ci(now - before, confidence=confidence, seed=0).half_width
    return noise
