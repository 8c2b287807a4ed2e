"""Score intervals right at the edges: Wilson for 0/1 metrics (0 of 40 is not 0.0-0.0), the bootstrap
for fractional scores with a Wilson fallback, and the regression rule over asymmetric intervals."""

from __future__ import annotations

import pytest

from jobs.evals.history import MetricResult, RunRecord
from jobs.evals.intervals import score_interval, wilson_interval
from jobs.evals.report import compare, report_markdown
from jobs.evals.suite import Sampling


def test_wilson_interval_known_values() -> None:
    none = wilson_interval(0, 40)
    assert (none.mean, none.low) == (0.0, 0.0) and none.high == pytest.approx(0.0876, abs=1e-4)
    every = wilson_interval(40, 40)
    assert every.high == 1.0 and every.low == pytest.approx(0.9124, abs=1e-4)
    half = wilson_interval(20, 40)
    assert (half.low, half.high) == (pytest.approx(0.3520, abs=1e-4), pytest.approx(0.6480, abs=1e-4))
    assert wilson_interval(1, 10, confidence=0.99).high > wilson_interval(1, 10).high
    with pytest.raises(ValueError, match="confidence"):
        wilson_interval(1, 10, confidence=1.0)


def test_score_interval_picks_the_method() -> None:
    ci, method = score_interval([0.0] * 40)
    assert method == "wilson" and ci.low == 0.0 and ci.high > 0.08
    ci, method = score_interval([1.0] * 39 + [0.0])
    assert method == "wilson" and ci.low < 0.975 < ci.high < 1.0
    ci, method = score_interval([0.25, 0.5, 0.75, 1.0] * 10)
    assert method == "bootstrap" and ci.low < ci.mean < ci.high
    ci, method = score_interval([0.5] * 30)  # fractional, every row alike: the bootstrap collapses
    assert method == "wilson-fallback" and ci.low < 0.5 < ci.high


def _record(run_id: str, right: int, rows: int = 40) -> RunRecord:
    ci, method = score_interval([1.0] * right + [0.0] * (rows - right))
    return RunRecord(
        suite="qa", model="/models/m", run_id=run_id, started_at="2026-11-01T02:00:00+00:00",
        finished_at="2026-11-01T02:05:00+00:00", output="/runs/x", dataset="/data/qa.parquet",
        dataset_sha256="abc", sampling=Sampling().model_dump(), rows=rows, rows_failed=0, cost_usd=0.0,
        metrics={"exact_match": MetricResult(score=ci.mean, low=ci.low, high=ci.high, confidence=0.95,
                                             method=method)},
    )  # fmt: skip


def test_the_report_shows_an_interval_at_zero_and_judges_drops_with_it() -> None:
    zero = compare(_record("20261102T020000Z-bb", 0), None)
    assert "0.0–8.8" in report_markdown("r", [zero])  # a Wilson interval, never 0.0–0.0
    # from 40/40 (Wilson low 91.2%) to 39/40: inside the noise; to 30/40: a regression
    before = _record("20261101T020000Z-aa", 40)
    assert not compare(_record("20261102T020000Z-bb", 39), before).regressed
    assert compare(_record("20261102T020000Z-bb", 30), before).regressed
    # from 0/40 a rise is never a regression, and 0 -> 0 is no change
    assert not compare(_record("20261102T020000Z-bb", 0), _record("20261101T020000Z-aa", 0)).regressed


def test_records_written_before_the_method_existed_still_load() -> None:
    old = MetricResult.model_validate({"score": 0.5, "low": 0.4, "high": 0.6, "confidence": 0.95})
    assert old.method == "bootstrap"
