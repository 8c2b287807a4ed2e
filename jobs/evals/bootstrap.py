"""Percentile bootstrap confidence interval of a mean, seeded so reruns give the same interval."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_MAX_DRAWS_PER_BATCH = 4_000_000  # resamples * rows held in memory at once (int64 indices: 32 MB)
_MAX_LEVELS = 64  # up to this many distinct values, resample level counts instead of rows


@dataclass(frozen=True)
class Interval:
    """mean and its [low, high] interval at `confidence`."""

    mean: float
    low: float
    high: float
    confidence: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def bootstrap_ci(
    values: Sequence[float] | np.ndarray, confidence: float = 0.95, resamples: int = 1000, seed: int = 0
) -> Interval:
    """Resample the rows with replacement `resamples` times; the interval is the (1-c)/2 and
    (1+c)/2 percentiles of the resampled means. Empty input -> NaN everywhere."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    data = np.asarray(values, dtype=np.float64)
    if data.ndim != 1:
        raise ValueError("values must be one-dimensional")
    n = data.size
    if n == 0:
        return Interval(float("nan"), float("nan"), float("nan"), confidence)
    rng = np.random.default_rng(seed)
    levels, counts = np.unique(data, return_counts=True)
    if levels.size <= _MAX_LEVELS:
        # few distinct scores (0/1 metrics): how often each level is drawn in a resample of n rows
        # is multinomial(n, counts / n), the same distribution as resampling the rows themselves
        draws = rng.multinomial(n, counts / n, size=resamples)  # [resamples, levels]
        means = draws @ levels / n
    else:
        means = np.empty(resamples, dtype=np.float64)
        batch = max(1, _MAX_DRAWS_PER_BATCH // n)
        for start in range(0, resamples, batch):
            stop = min(resamples, start + batch)
            idx = rng.integers(0, n, size=(stop - start, n))  # [batch, n]
            means[start:stop] = data[idx].mean(axis=1)
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return Interval(float(data.mean()), float(low), float(high), confidence)
