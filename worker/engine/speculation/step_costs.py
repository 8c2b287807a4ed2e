"""StepCosts: measured step seconds by rows (SpeculationController's tables): the buckets a step's
rows are measured in, each bucket's median, the monotone fit of a side's costs, and the estimate for
any row count (interpolated between measured buckets, or the widest slope extended)."""

from __future__ import annotations

import bisect
import math
from collections import deque

import numpy as np

WINDOW = 9  # latest steps per rows bucket whose median is its cost
FIRST_SAMPLES = 2  # steps of a rows bucket measured before its cost is used (their minimum)


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


class StepCosts:
    def __init__(self) -> None:
        self.seconds: dict[tuple[bool, int], float] = {}  # (speculating, rows bucket) -> its cost
        self._window: dict[tuple[bool, int], deque[float]] = {}  # its latest samples
        self._curves: dict[bool, tuple] = {}  # side -> its measured buckets, sorted (_curve)

    def measure(self, rows: int, seconds: float, speculated: bool = False) -> bool:
        """A pure decode / verify step of `rows` rows took `seconds` (host work included); True when
        its bucket's cost moved. A bucket's cost is the median of its last WINDOW steps (a step slowed
        by a neighbour on a shared machine moves it little), the minimum until it has WINDOW (a first
        step pays one-time work: indexing a prompt, warming caches; an engine's first speculating
        steps ran ~40% slower than its later ones, and a width priced by them may be refused and never
        measured again: optimism while little is seen); it is used from FIRST_SAMPLES steps on."""
        key = (speculated, rows_bucket(rows))
        window = self._window.setdefault(key, deque(maxlen=WINDOW))
        window.append(seconds)
        if len(window) >= FIRST_SAMPLES:
            cost = min(window) if len(window) < WINDOW else sorted(window)[WINDOW // 2]
            old = self.seconds.get(key)
            # a move under 1% (far below a step's noise) keeps the old cost: the prices stay cached
            if old is None or abs(cost - old) > 0.01 * old:
                self.seconds[key] = cost
                self._curves.pop(speculated, None)
                return True
        return False

    def cost(self, rows: int, speculated: bool = False) -> float | None:
        """Estimated seconds of a step of `rows` rows: measured, interpolated, or None (see costs)."""
        keys, secs, _ = self._curve(speculated)
        if not keys:
            return None
        at = bisect.bisect_right(keys, rows)  # keys[:at] <= rows < keys[at:]
        if at == len(keys):  # at or past the widest bucket
            if rows == keys[-1]:
                return secs[-1]
            edge = rows_bucket(rows)
            if len(keys) < 2:
                return secs[-1] if edge == keys[-1] else None
            slope = max(0.0, (secs[-1] - secs[-2]) / (keys[-1] - keys[-2]))
            return secs[-1] + slope * (rows - keys[-1]) if keys[-1] >= edge / 2 else None
        if at == 0:
            return secs[0]
        f = (rows - keys[at - 1]) / (keys[at] - keys[at - 1])
        return (1 - f) * secs[at - 1] + f * secs[at]

    def costs(self, lo: int, hi: int, speculated: bool = False) -> np.ndarray:
        """Estimated seconds of steps of lo..hi rows (NaN: explore). A bucket's cost stands for its
        lower edge; between two measured buckets a count is interpolated by rows (a row more always
        costs more), below the narrowest it costs that one; past the widest it extends the slope of the
        two widest while its bucket is at most twice the widest's, else it is unknown."""
        keys, secs, arrays = self._curve(speculated)
        rows = np.arange(lo, hi + 1, dtype=np.float64)
        if not keys:
            return np.full(rows.size, np.nan)
        k, v = arrays
        out = np.interp(rows, k, v)
        past = rows > keys[-1]
        if past.any():
            edge = np.array([rows_bucket(int(r)) for r in rows[past]], np.float64)
            if len(keys) >= 2:
                slope = max(0.0, (secs[-1] - secs[-2]) / (keys[-1] - keys[-2]))
                out[past] = np.where(keys[-1] >= edge / 2, secs[-1] + slope * (rows[past] - keys[-1]), np.nan)
            else:  # one bucket measured: only its own rows are known
                out[past] = np.where(edge == keys[-1], secs[-1], np.nan)
        return out

    def _curve(self, speculated: bool) -> tuple[list[int], list[float], tuple[np.ndarray, np.ndarray]]:
        """The measured buckets of a side, sorted, their costs made non-decreasing in rows (`monotone`;
        cached until a measured cost changes)."""
        if speculated not in self._curves:
            table = sorted((k, v) for (s, k), v in self.seconds.items() if s == speculated)
            keys = [k for k, _ in table]
            secs = monotone([v for _, v in table], [len(self._window.get((speculated, k), ())) or 1 for k in keys])
            self._curves[speculated] = (keys, secs, (np.asarray(keys, np.float64), np.asarray(secs, np.float64)))
        return self._curves[speculated]

    def table(self, speculated: bool = False) -> dict[int, float]:
        """Measured seconds per step by rows bucket (logging, the bench)."""
        return dict(sorted((k, v) for (s, k), v in self.seconds.items() if s == speculated))

