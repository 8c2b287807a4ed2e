"""History records in a store, comparison with the previous run, the regression rule, Markdown, chart."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from jobs.evals.bootstrap import bootstrap_ci
from jobs.evals.chart import score_chart
from jobs.evals.data import SuiteData
from jobs.evals.history import History, MetricResult, RunRecord, model_key
from jobs.evals.metrics import ExactMatch, MultipleChoice
from jobs.evals.report import compare, report_json, report_markdown
from jobs.evals.scoring import paired_noise, score_suite
from jobs.evals.suite import Sampling, Suite
from jobs.storage import LocalStore


def _record(
    run_id: str, score: float, rows: int = 200, model: str = "/models/tiny", sha: str = "abc"
) -> RunRecord:
    values = [1.0] * round(score * rows) + [0.0] * (rows - round(score * rows))
    ci = bootstrap_ci(values)
    return RunRecord(
        suite="qa",
        model=model,
        run_id=run_id,
        started_at=f"2026-11-{run_id[6:8]}T02:00:00+00:00",
        finished_at=f"2026-11-{run_id[6:8]}T02:05:00+00:00",
        output=f"/runs/{run_id}",
        dataset="/data/qa.parquet",
        dataset_sha256=sha,
        sampling=Sampling().model_dump(),
        rows=rows,
        rows_failed=0,
        cost_usd=0.001,
        metrics={"exact_match": MetricResult(score=ci.mean, low=ci.low, high=ci.high, confidence=0.95)},
    )


def test_history_keeps_one_record_per_run_and_finds_the_previous(tmp_path: Path) -> None:
    history = History(LocalStore(tmp_path / "history"))
    first, second, other = (
        _record("20261101T020000Z-aa", 0.7),
        _record("20261102T020000Z-bb", 0.72),
        _record("20261101T030000Z-cc", 0.5, model="/models/b"),
    )
    assert history.record(second) and history.record(first) and history.record(other)
    assert not history.record(second)  # a run is recorded once
    assert [r.run_id for r in history.runs("qa", "/models/tiny")] == [first.run_id, second.run_id]
    assert history.previous(second) == first
    assert history.previous(first) is None
    assert history.runs("qa", "/models/b") == [other]
    assert first.key == f"qa/{model_key('/models/tiny')}/{first.run_id}.json"
    assert model_key("/models/tiny").startswith("tiny-") and model_key("s3://b/m/") != model_key("s3://c/m/")


def test_regression_flag_only_when_the_drop_exceeds_the_noise() -> None:
    before = _record("20261101T020000Z-aa", 0.70)
    small = compare(_record("20261102T020000Z-bb", 0.66), before)  # 4 points on 200 rows: inside the noise
    big = compare(_record("20261102T020000Z-bb", 0.50), before)  # 20 points: beyond it
    up = compare(_record("20261102T020000Z-bb", 0.90), before)
    for entry in (small, big, up):
        (m,) = entry.metrics
        assert m.previous_score == pytest.approx(0.70) and m.previous_run_id == before.run_id
        prev = before.metrics["exact_match"]  # the sides that bear on a drop: prev's below, now's above
        assert m.noise == pytest.approx(((prev.score - prev.low) ** 2 + (m.high - m.score) ** 2) ** 0.5)
    assert small.metrics[0].delta == pytest.approx(-0.04) and not small.regressed
    assert big.metrics[0].delta == pytest.approx(-0.20) and big.regressed
    assert not up.regressed
    first = compare(before, None)
    assert first.metrics[0].delta is None and not first.regressed and not first.dataset_changed
    assert compare(_record("20261102T020000Z-bb", 0.7, sha="new"), before).dataset_changed


def test_markdown_and_json_report() -> None:
    before = _record("20261101T020000Z-aa", 0.70)
    entries = [
        compare(_record("20261102T020000Z-bb", 0.50), before),
        compare(_record("20261102T020000Z-bb", 0.6, model="/m/b"), None),
    ]
    text = report_markdown("20261102T020000Z-bb", entries)
    assert "2 suite run(s); 1 with a regression beyond the noise." in text
    assert (
        "| qa | /models/tiny | exact_match | 50.0 |" in text
        and "-20.0 (noise ±" in text
        and "**REGRESSION**" in text
    )
    assert "| qa | /m/b | exact_match | 60.0 |" in text and "first run" in text
    data = report_json("20261102T020000Z-bb", entries)
    assert data["regressions"] == 1 and data["entries"][0]["metrics"][0]["regression"] is True


def test_chart_is_a_png_once_there_are_two_runs() -> None:
    runs = [
        _record("20261101T020000Z-aa", 0.7),
        _record("20261102T020000Z-bb", 0.6),
        _record("20261103T020000Z-cc", 0.65),
    ]
    assert score_chart(runs[:1], "qa") is None
    png = score_chart(runs, "qa on tiny")
    assert png is not None and png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000


def _suite(metrics: tuple) -> Suite:
    return Suite(
        name="qa",
        dataset="/d",
        models=("m",),
        schedule=None,
        prompt_column="prompt",
        messages_column=None,
        reference_column="answer",
        id_column=None,
        sampling=Sampling(),
        shard_rows=None,
        metrics=metrics,
    )


def test_scoring_joins_results_by_id_and_scores_failed_inputs_as_wrong() -> None:
    data = SuiteData(
        pa.table(
            {
                "id": ["a", "b", "c"],
                "prompt": ["p"] * 3,
                "reference": ["Paris", "4", "blue"],
                "choices": [["Paris", "Rome"], ["4", "5"], []],
            }
        ),
        "sha",
    )
    generated = pa.table(
        {  # out of order, as shards may be
            "id": ["c", "a", "b"],
            "completion": ["blue", " Paris", None],
            "finish_reason": ["stop", "length", "error"],
            "error": [None, None, "prompt too long"],
        }
    )
    likelihoods = pa.table(
        {
            "id": ["a#0", "a#1", "b#0", "b#1"],
            "continuation_logprob": [-1.0, -3.0, -5.0, -2.0],
            "error": [None, None, None, None],
        }
    )
    scores = score_suite(_suite((ExactMatch(), MultipleChoice())), data, generated, likelihoods, resamples=50)
    rows = scores.rows.to_pydict()
    assert rows["id"] == ["a", "b", "c"] and rows["reference"] == ["Paris", "4", "blue"]
    # b: its generation failed -> 0 in the generation metric; c: no options -> 0 in multiple choice only
    assert rows["exact_match"] == [1.0, 0.0, 1.0]
    assert rows["multiple_choice"] == [1.0, 0.0, 0.0] and rows["multiple_choice_norm"] == [1.0, 0.0, 0.0]
    assert (
        rows["error"][0] is None
        and rows["error"][1] == "prompt too long"
        and "no options" in rows["error"][2]
    )
    assert scores.rows_failed == 2
    assert scores.intervals["exact_match"].mean == pytest.approx(2 / 3)
    assert scores.intervals["multiple_choice"].mean == pytest.approx(1 / 3)
    assert scores.methods == {name: "wilson" for name in ("exact_match", "multiple_choice", "multiple_choice_norm")}
    assert scores.intervals["exact_match"].low == pytest.approx(0.2077, abs=1e-4)  # Wilson, 2 of 3


def test_paired_noise_catches_a_consistent_drop_that_unpaired_intervals_miss() -> None:
    rng = np.random.default_rng(0)
    before = (rng.random(200) < 0.7).astype(float)
    now = before.copy()
    now[np.flatnonzero(before)[:10]] = 0.0  # 10 rows that were right are now wrong, nothing else moved
    ids = [f"r{i}" for i in range(200)]
    prev_table = pa.table({"id": ids[::-1], "exact_match": before[::-1]})  # another order: matched by id
    now_table = pa.table({"id": ids, "exact_match": now})
    noise = paired_noise(now_table, prev_table, ["exact_match"])
    assert 0 < noise["exact_match"] < 0.05

    def record(run_id: str, values: np.ndarray) -> RunRecord:
        ci = bootstrap_ci(values)
        return _record(run_id, 0.0).model_copy(
            update={
                "metrics": {
                    "exact_match": MetricResult(score=ci.mean, low=ci.low, high=ci.high, confidence=0.95)
                }
            }
        )

    old, new = record("20261101T020000Z-aa", before), record("20261102T020000Z-bb", now)
    unpaired, paired = compare(new, old), compare(new, old, noise)
    assert unpaired.metrics[0].delta == pytest.approx(-0.05) and not unpaired.regressed
    assert unpaired.metrics[0].noise_method == "unpaired"
    assert paired.regressed and paired.metrics[0].noise_method == "paired"
    assert "(noise ±" in report_markdown("x", [paired]) and ", paired) **REGRESSION**" in report_markdown(
        "x", [paired]
    )
    assert paired_noise(now_table, prev_table.slice(1), ["exact_match"]) == {}  # other rows: no pairing
