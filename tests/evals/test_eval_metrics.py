"""Each metric on hand-made rows, plus the normalisation options and the bootstrap interval."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from jobs.evals.bootstrap import bootstrap_ci
from jobs.evals.metrics import Contains, Custom, ExactMatch, MultipleChoice, Numeric, Regex, parse_number
from jobs.evals.normalize import Normalization


def test_normalization_options_in_order() -> None:
    assert Normalization().apply("  Paris \n\t is  ") == "Paris is"
    assert (
        Normalization(lowercase=True, ignore_punctuation=True).apply("The Answer: PARIS!")
        == "the answer paris"
    )
    assert (
        Normalization(lowercase=True, ignore_articles=True).apply("The Eiffel tower, an icon")
        == "eiffel tower, icon"
    )
    assert Normalization(first_line=True).apply("\n Paris\nand more text") == "Paris"
    assert Normalization(strip=False, collapse_whitespace=False).apply(" a  b ") == " a  b "


@pytest.mark.parametrize(
    ("metric", "completion", "reference", "expected"),
    [
        (ExactMatch(), " Paris ", "Paris", 1.0),
        (ExactMatch(), "paris", "Paris", 0.0),
        (ExactMatch(lowercase=True), "paris", "Paris", 1.0),
        (ExactMatch(lowercase=True, ignore_punctuation=True), "Paris.", "paris", 1.0),
        (ExactMatch(first_line=True), "Paris\nQ: next question", "Paris", 1.0),
        (ExactMatch(), "Paris\nQ: next question", "Paris", 0.0),
        (ExactMatch(), "Lyon", ["Paris", "Lyon"], 1.0),  # any of several acceptable answers
        (ExactMatch(), "4", 4, 1.0),  # a numeric reference compares as text
        (Contains(), "I think it is Paris, France", "Paris", 1.0),
        (Contains(), "I think it is Rome", "Paris", 0.0),
        (Contains(lowercase=True), "PARIS!", "paris", 1.0),
        (Regex(), "the answer is 42.", r"\b42\b", 1.0),  # the reference is the pattern
        (Regex(), "the answer is 420.", r"\b42\b", 0.0),
        (Regex(pattern=r"answer: (\w+)", group=1, lowercase=True), "so the answer: Paris.", "paris", 1.0),
        (Regex(pattern=r"answer: (\w+)", group=1), "no marker here", "Paris", 0.0),
        (Regex(pattern=r"ANSWER: (\w+)", group=1, ignore_case=True), "answer: Paris", "Paris", 1.0),
        (Numeric(), "She has 3 apples, then 5.", "5", 1.0),  # the last number by default
        (Numeric(extract="first"), "She has 3 apples, then 5.", 5, 0.0),
        (Numeric(), "The total is $1,234.50", 1234.5, 1.0),
        (Numeric(abs_tol=0.001), "pi is 3.14159", "3.14", 0.0),
        (Numeric(abs_tol=0.001), "pi is 3.141", "3.14", 1.0),
        (Numeric(rel_tol=0.01), "about 1005", 1000, 1.0),
        (Numeric(rel_tol=0.01), "about 1011", 1000, 0.0),
        (Numeric(pattern=r"#### (.*)"), "3 + 4 = 7 so... #### 7", 7, 1.0),
        (Numeric(pattern=r"#### (.*)"), "3 + 4 = 7", 7, 0.0),  # marker required
        (Numeric(), "no number at all", 7, 0.0),
        (Numeric(), "-2.5e1 degrees", -25, 1.0),
    ],
)
def test_generation_metrics_on_hand_made_rows(metric, completion: str, reference, expected: float) -> None:
    assert metric.score(completion, reference) == expected


def test_bad_references_are_row_errors() -> None:
    with pytest.raises(ValueError, match="not a number"):
        Numeric().score("7", "seven")
    with pytest.raises(ValueError, match="null"):
        ExactMatch().score("7", None)
    with pytest.raises(ValueError, match="empty"):
        Contains().score("7", [])


def test_metric_configuration_is_checked() -> None:
    with pytest.raises(ValidationError, match="needs a group"):
        Numeric(pattern="#### .*")
    with pytest.raises(ValidationError, match="group 2 does not exist"):
        Regex(pattern="(a)", group=2)
    with pytest.raises(ValidationError, match="Extra inputs"):
        ExactMatch(lower=True)
    with pytest.raises(ValidationError):
        Numeric(abs_tol=-1)


def test_parse_number() -> None:
    assert parse_number("1,000,000 and 2") == 2.0
    assert parse_number("1,000,000 and 2", "first") == 1_000_000.0
    assert parse_number(".5") == 0.5
    assert parse_number("version 2.") == 2.0
    assert parse_number("none") is None


def test_multiple_choice_picks_the_highest_summed_logprob_and_its_length_normalised_twin() -> None:
    mc = MultipleChoice()
    options = ["cat", "elephant"]
    # "cat" = 3 characters, "elephant" = 8: -4.0 beats -6.3 summed, but per character
    # -6.3 / 8 = -0.79 beats -4.0 / 3 = -1.33
    assert mc.score_options([-4.0, -6.3], options, 0) == (1.0, 0.0)
    assert mc.score_options([-4.0, -6.3], options, "elephant") == (0.0, 1.0)
    assert mc.score_options([-1.0, -1.0], options, 0) == (1.0, 0.0)  # a tie goes to the first option
    assert mc.score_options([-9.0, -1.0], options, "1") == (1.0, 1.0)
    with pytest.raises(ValueError, match="neither an option index"):
        mc.score_options([-1.0, -2.0], options, "dog")
    with pytest.raises(ValueError, match="neither an option index"):
        mc.score_options([-1.0, -2.0], options, 2)
    assert MultipleChoice(target_delimiter="").continuation("cat") == "cat"


def test_custom_metric_checks_its_range(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "def half(c, r):\n    return 0.5\n\ndef big(c, r):\n    return 3\n\ndef boom(c, r):\n    return {}[r]\n"
    )
    half = Custom(function="m.py:half")
    with pytest.raises(RuntimeError, match="before bind"):
        half.score("x", "y")
    half.bind(tmp_path)
    assert half.score("x", "y") == 0.5
    big = Custom(function="m.py:big")
    big.bind(tmp_path)
    with pytest.raises(ValueError, match="outside"):
        big.score("x", "y")
    boom = Custom(function="m.py:boom")
    boom.bind(tmp_path)
    with pytest.raises(ValueError, match="raised KeyError"):  # a bug in user code is a row error
        boom.score("x", "y")
    with pytest.raises(ValueError, match="does not exist"):
        Custom(function="missing.py:f").bind(tmp_path)


def test_bootstrap_interval_is_seeded_and_sane() -> None:
    rng = np.random.default_rng(1)
    values = (rng.random(400) < 0.7).astype(float)
    a, b = bootstrap_ci(values, seed=0), bootstrap_ci(values, seed=0)
    assert a == b  # reruns give the same interval
    assert a.low < a.mean < a.high and a.mean == values.mean()
    # the half-width is close to the normal approximation 1.96 * sqrt(p (1 - p) / n)
    normal = 1.96 * math.sqrt(a.mean * (1 - a.mean) / values.size)
    assert abs(a.half_width - normal) < 0.25 * normal
    assert bootstrap_ci(values[:100]).half_width > a.half_width  # fewer rows, wider
    constant = bootstrap_ci([1.0] * 10)
    assert (constant.low, constant.mean, constant.high) == (1.0, 1.0, 1.0)
    assert math.isnan(bootstrap_ci([]).mean)
    many = bootstrap_ci(np.ones(50_000), resamples=200)  # several batches of resamples
    assert many.low == many.high == 1.0
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci(values, confidence=1.5)


def test_bootstrap_level_counts_agree_with_row_resampling() -> None:
    """0/1 scores take the multinomial shortcut; the same data made all-distinct by a tiny jitter
    takes the row-resampling path: the two intervals agree within Monte Carlo error."""
    values = (np.random.default_rng(3).random(300) < 0.4).astype(float)
    jittered = values + np.arange(300) * 1e-12
    fast, slow = bootstrap_ci(values, resamples=4000), bootstrap_ci(jittered, resamples=4000)
    assert abs(fast.low - slow.low) < 0.01 and abs(fast.high - slow.high) < 0.01


def test_regex_reference_that_is_not_a_pattern_is_a_row_error() -> None:
    """A ValueError (the row's error, the report goes on), not a re.error traceback."""
    with pytest.raises(ValueError, match="not a valid regular expression"):
        Regex().score("f(x) = 1", "f(x")
