"""The interval of a suite score: Wilson for 0/1 metrics, the bootstrap otherwise.

A percentile bootstrap of 0 right out of 40 is 0.0-0.0: every resample of all-zero rows is zero, so
the interval claims a certainty the 40 rows cannot give. The Wilson score interval is the usual
remedy: exact-coverage-like at the edges (0 of 40 -> 0.0-8.8% at 95%), asymmetric near them, close to
the normal interval in the middle. Metrics with fractional per-row scores use the bootstrap; when it
collapses to a point (every row scored the same), the Wilson interval of that mean over the rows
stands in: for scores in [0, 1] with mean p the variance is at most p(1 - p), the Bernoulli case.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

from jobs.evals.bootstrap import Interval, bootstrap_ci

WILSON = "wilson"
BOOTSTRAP = "bootstrap"
WILSON_FALLBACK = "wilson-fallback"  # bootstrap collapsed to a point


def wilson_interval(successes: float, n: int, confidence: float = 0.95) -> Interval:
    """Wilson score interval of a proportion successes / n (successes may be fractional: a mean of
    scores in [0, 1] times n). n = 0 -> NaN everywhere."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n <= 0:
        return Interval(math.nan, math.nan, math.nan, confidence)
    p = successes / n
    z = NormalDist().inv_cdf((1.0 + confidence) / 2)
    z2n = z * z / n
    center = (p + z2n / 2) / (1 + z2n)
    half = z * math.sqrt(p * (1 - p) / n + z2n / (4 * n)) / (1 + z2n)
    # at the edges the bound is exactly the edge (the formula leaves float noise there)
    low = 0.0 if p <= 0.0 else max(0.0, center - half)
    high = 1.0 if p >= 1.0 else min(1.0, center + half)
    return Interval(p, low, high, confidence)


def score_interval(
    values: Sequence[float] | np.ndarray, confidence: float = 0.95, resamples: int = 1000, seed: int = 0
) -> tuple[Interval, str]:
    """(interval of the mean score, method): "wilson" for 0/1 scores, "bootstrap" otherwise, or
    "wilson-fallback" where the bootstrap collapsed to one value."""
    data = np.asarray(values, dtype=np.float64)
    if data.size and np.isin(data, (0.0, 1.0)).all():
        return wilson_interval(float(data.sum()), int(data.size), confidence), WILSON
    ci = bootstrap_ci(data, confidence=confidence, resamples=resamples, seed=seed)
    if data.size and ci.low == ci.high and 0.0 <= ci.mean <= 1.0:
        wilson = wilson_interval(ci.mean * data.size, int(data.size), confidence)
        return Interval(ci.mean, wilson.low, wilson.high, confidence), WILSON_FALLBACK
    return ci, BOOTSTRAP
