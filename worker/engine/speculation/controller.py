"""SpeculationController: whole steps speculate only where the engine measured it to pay.

Verifying K proposed tokens of a sequence adds K rows to a decode step. At a small batch the wider
step costs about the same (decode reads all the weights for a handful of rows) and yields the
accepted tokens on top; at a large batch the extra rows cost more than the accepted tokens save.
Where the crossover lies depends on the machine, the model and the workload's acceptance, so it is
measured as the engine runs, never a constant:

- step cost: the median seconds of the latest pure decode / verify steps (no prefill chunk)
  per number of rows (exact up to 8 rows, then buckets a quarter octave wide), host work included
  (CPU seconds of the process on the CPU, where a shared machine makes wall time noisy; wall time on
  a GPU); a count never measured is interpolated between measured neighbours, or extends the slope
  of the two widest measured counts when it is at most twice the widest (else it is explored);
- yield: each speculating sequence's expected accepted tokens (its acceptance average times its K).

A draft model's forwards make a speculating step cost more than its rows: with `separate` the
speculating steps get their own table (the draft's time included), plain steps the other.

A step speculates iff cost(B + sum K) / (B + expected accepted) < cost(B) / B for its B decoding
sequences; an unmeasured side is explored (run once so it gets measured). The rule is asked twice:
before proposing, with every row proposing K and every proposal accepted, i.e. whether speculation
could pay at all at this width (a refusal skips even the proposing, host work, for a back-off that
doubles while refusals repeat: a large batch); then with the step's own proposals and the sequences'
own acceptance (a refusal is for this step, and pauses the sequences below the step's break-even
acceptance: Speculator._pause_below, so that a sequence's acceptance, measured only by verifying,
gets re-measured after its pause instead of keeping it refused). When a back-off runs
out one speculating step re-measures that side. While speculation pays, every PROBE_PLAIN-th step
runs plain for the same reason.
"""

from __future__ import annotations

import math
from collections import deque

WINDOW = 9  # latest steps per rows bucket whose median is its cost
FIRST_SAMPLES = 2  # steps of a rows bucket measured before its cost is used (their minimum)
SKIP_FIRST, SKIP_MAX = 8, 512  # steps a refused width skips proposing: first, longest
PROBE_PLAIN = 64  # while speculation pays, every 64th step runs plain (its cost stays measured)


def rows_bucket(rows: int) -> int:
    """Exact up to 8 rows, then the lower edge of a quarter-octave bucket."""
    if rows <= 8:
        return rows
    return int(2 ** (math.floor(4 * math.log2(rows)) / 4))


class SpeculationController:
    def __init__(self, adaptive: bool, separate: bool = False) -> None:
        self.adaptive = adaptive
        # separate: speculating steps cost more than their rows (a draft model's forwards), so they are
        # measured apart from plain steps (keys (True, bucket)); prompt lookup shares one table
        self.separate = separate
        self.seconds: dict[tuple[bool, int], float] = {}  # (speculating, rows bucket) -> average step seconds
        self.steps = 0
        self._window: dict[tuple[bool, int], deque[float]] = {}  # its latest samples
        self._skip: dict[int, tuple[int, int]] = {}  # width -> (skip proposing until step, back-off)

    def should_propose(self, width: int) -> bool:
        """False while `width` is backing off after speculation was refused there (no host work)."""
        return not self.adaptive or self.steps >= abs(self._skip.get(rows_bucket(width), (0, 0))[0])

    def decide(self, width: int, extra_rows: int, expected_accepted: float, back_off: bool = False) -> bool:
        """Whether a step of `width` decoding sequences, `extra_rows` more with speculation, should
        speculate when it expects `expected_accepted` accepted tokens. back_off: the question asked
        before proposing (could it pay at all: a refusal then skips proposing at this width for a
        while); else the step's own proposals are judged (a refusal is for this step)."""
        if not self.adaptive:
            return True
        spec, plain = self.cost(width + extra_rows, True), self.cost(width)
        if spec is None:
            return True  # explore: measure speculation
        if plain is None:
            return False
        key = rows_bucket(width)
        if back_off and key in self._skip and self._skip[key][0] >= 0:  # a back-off ran out: probe once
            self._skip[key] = (-1, self._skip[key][1])
            return True
        if spec / (width + expected_accepted) < plain / width:
            if back_off:
                self._skip.pop(key, None)
                return True
            return self.steps % PROBE_PLAIN != 0  # now and then a plain step keeps its cost current
        if back_off:
            back = min(SKIP_MAX, 2 * self._skip.get(key, (0, SKIP_FIRST // 2))[1])
            self._skip[key] = (self.steps + back, back)
        return False

    def breakeven(self, width: int, extra_rows: int) -> float | None:
        """The accepted tokens a step of `width` decoding sequences needs from `extra_rows` more
        verify rows to pay (its cost per token no higher than a plain step's); None when a side is
        unmeasured."""
        spec, plain = self.cost(width + extra_rows, True), self.cost(width)
        if spec is None or plain is None:
            return None
        return spec * width / plain - width

    def record(self, rows: int, seconds: float, speculated: bool = False) -> None:
        """A pure decode / verify step of `rows` rows took `seconds` (host work included). A bucket's
        cost is the median of its last WINDOW steps (a step slowed by a neighbour on a shared machine
        moves it little), the minimum while it has fewer than 3 (a first step pays one-time work:
        indexing a prompt, warming caches); it is used from FIRST_SAMPLES steps on."""
        self.steps += 1
        key = (speculated and self.separate, rows_bucket(rows))
        window = self._window.setdefault(key, deque(maxlen=WINDOW))
        window.append(seconds)
        if len(window) >= FIRST_SAMPLES:
            self.seconds[key] = min(window) if len(window) < 3 else sorted(window)[len(window) // 2]

    def cost(self, rows: int, speculated: bool = False) -> float | None:
        """Estimated seconds of a step of `rows` rows: measured, interpolated, or None."""
        side = speculated and self.separate
        seconds = {k: v for (s, k), v in self.seconds.items() if s == side}
        key = rows_bucket(rows)
        if key in seconds:
            return seconds[key]
        below = sorted(k for k in seconds if k < key)
        upper = min((k for k in seconds if k > key), default=None)
        if upper is None:  # wider than any measured step: extend the last measured slope (>= 0)
            if len(below) < 2 or below[-1] < key / 2:
                return None  # too little to go on: explore
            a, b = below[-2], below[-1]
            slope = max(0.0, (seconds[b] - seconds[a]) / (b - a))
            return seconds[b] + slope * (key - b)
        if not below:
            return seconds[upper]  # a narrower step costs at most as much
        lower = below[-1]
        f = (key - lower) / (upper - lower)
        return (1 - f) * seconds[lower] + f * seconds[upper]

    def table(self, speculated: bool = False) -> dict[int, float]:
        """Measured seconds per step by rows bucket (logging, the bench)."""
        side = speculated and self.separate
        return dict(sorted((k, v) for (s, k), v in self.seconds.items() if s == side))
