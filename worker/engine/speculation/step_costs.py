"""Step costs by rows: the buckets a step's rows are measured in, and the monotone fit of their
measured costs (SpeculationController's tables)."""

from __future__ import annotations

import math


def rows_bucket(rows: int) -> int:
    """Exact up to 8 rows, then the lower edge of a quarter-octave bucket."""
    if rows <= 8:
        return rows
    return int(2 ** (math.floor(4 * math.log2(rows)) / 4))


def monotone(costs: list[float], weights: list[float] | None = None) -> list[float]:
    """The non-decreasing sequence nearest `costs` in weighted least squares (pool adjacent
    violators; `weights`: each cost's samples): a step of more rows never costs less, but each
    bucket's median is measured apart, over other steps and contexts, so neighbours can read out of
    order (seen: 3 verify rows 1.69 ms between 2 rows at 1.06 and 4 rows at 1.12, a rarely used width
    with few samples), and an allocation that believed them would avoid the "dear" width for nothing.
    Violating neighbours are pooled to their weighted mean: a bucket seen often outweighs a rare one."""
    blocks: list[list[float]] = []  # [weighted sum, weight, count] per pooled run
    for c, w in zip(costs, weights or [1.0] * len(costs), strict=True):
        blocks.append([c * w, w, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, weight, n = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += weight
            blocks[-1][2] += n
    return [total / weight for total, weight, n in blocks for _ in range(int(n))]
