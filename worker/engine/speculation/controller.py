"""SpeculationController: whole steps speculate only where the engine measured it to pay.

Verifying K proposed tokens of a sequence adds K rows to a decode step. At a small batch the wider
step costs about the same (decode reads all the weights for a handful of rows) and yields the
accepted tokens on top; at a large batch the extra rows cost more than the accepted tokens save.
Where the crossover lies depends on the machine, the model and the workload's acceptance, so it is
measured as the engine runs, never a constant:

- step cost: the median seconds of the latest pure decode / verify steps (no prefill chunk)
  per number of rows (exact up to 8 rows, then buckets a quarter octave wide), host work included
  (CPU seconds of the process on the CPU, where a shared machine makes wall time noisy; wall time on
  a GPU); another count is interpolated by rows between the measured buckets around it (a bucket's
  cost stands for its lower edge), or extends the slope of the two widest measured ones when it is
  at most twice the widest (else it is explored);
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

import numpy as np

WINDOW = 9  # latest steps per rows bucket whose median is its cost
FIRST_SAMPLES = 2  # steps of a rows bucket measured before its cost is used (their minimum)
SKIP_FIRST, SKIP_MAX = 8, 512  # steps a refused width skips proposing: first, longest
PROBE_PLAIN = 64  # while speculation pays, every 64th step runs plain (its cost stays measured)
JUDGE_STEPS = 8  # planned steps at a width before their measured gain can turn proposing off there


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
        self._gain: dict[int, tuple[int, float]] = {}  # width -> (planned steps, their summed gain)

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
        if back_off and self.should_probe(width):
            return True
        if spec / (width + expected_accepted) < plain / width:
            if back_off:
                self.clear_back_off(width)
                return True
            return self.steps % PROBE_PLAIN != 0  # now and then a plain step keeps its cost current
        if back_off:
            self.back_off(width)
        return False

    def settle(self, width: int, gain: float) -> None:
        """A step of `width` decoding sequences that proposed (or tried to: the host work of matching
        and choosing is counted) gained `gain` plain steps' worth of time: what its accepted tokens
        saved (token_values) less what it cost beyond a plain step, over a plain step's cost;
        negative when proposing did not pay. After JUDGE_STEPS such steps a negative sum turns proposing off at that width
        (back_off): the per-step choice is judged by what it actually saved, host work included."""
        key = rows_bucket(width)
        n, total = self._gain.get(key, (0, 0.0))
        n, total = n + 1, total + gain
        if n < JUDGE_STEPS:
            self._gain[key] = (n, total)
            return
        self._gain.pop(key, None)
        if total < 0:
            self.back_off(width)
        else:
            self.clear_back_off(width)

    def should_probe(self, width: int) -> bool:
        """True once when a back-off at `width` ran out (one speculating step re-measures that side)."""
        key = rows_bucket(width)
        if not self.adaptive or key not in self._skip or self._skip[key][0] < 0:
            return False
        self._skip[key] = (-1, self._skip[key][1])
        return True

    def clear_back_off(self, width: int) -> None:
        """Speculation could pay at `width` again: the next back-off there starts short."""
        self._skip.pop(rows_bucket(width), None)

    def back_off(self, width: int) -> None:
        """Speculation cannot pay at `width`: no proposing there for a while (doubling while it repeats)."""
        key = rows_bucket(width)
        back = min(SKIP_MAX, 2 * self._skip.get(key, (0, SKIP_FIRST // 2))[1])
        self._skip[key] = (self.steps + back, back)

    def token_values(self, width: int, critical: list[bool], queued: bool) -> list[float] | None:
        """Seconds an accepted token saves, per candidate row of a step of `width` decoding sequences
        (None while the plain step is unmeasured). With requests waiting (or one row) every token is
        worth a plain step's cost per token: the row it frees takes new work, so the step's fixed
        cost is shared by more tokens. With none waiting the step count is set by the sequences with
        the most tokens left (`critical`): another row's accepted token only saves its row in a later
        step (the marginal cost per row), a critical row's also its share of the steps' fixed cost
        (speeding up rows that finish early anyway would only add rejected rows). Not adaptive: 0."""
        if not self.adaptive:
            return [0.0] * len(critical)
        plain = self.cost(width)
        if plain is None:
            return None
        if queued or width == 1:
            return [plain / width] * len(critical)
        narrow = self.cost(1)
        row = plain / width if narrow is None else max(0.0, (plain - narrow) / (width - 1))
        fixed = max(0.0, plain - width * row) / max(1, sum(critical))
        return [row + fixed if c else row for c in critical]

    def allocate(self, width: int, chances: list[tuple[float, int]], values: list[float] | None = None) -> list[int]:
        """K per candidate row of a step of `width` decoding sequences, from (p, cap) per candidate: p
        the chance that each of its proposed tokens is accepted given the ones before it were (so its
        j-th token is kept with chance p^j), cap its most tokens; `values` the seconds an accepted
        token of each saves (token_values; default: a plain step's cost per token). The candidates'
        tokens are taken by expected saving (chance x value), best first, and the prefix that saves
        the most time net of its extra rows' measured cost is kept; every K is 0 when none saves any.
        A width never measured with that many rows is explored (every cap). Not adaptive: every cap."""
        caps = [k for _, k in chances]
        if not self.adaptive:
            return caps
        plain = self.cost(width)
        if plain is None:
            return [0] * len(chances)  # the plain step is measured first
        k = np.asarray(caps, np.int64)
        row = np.repeat(np.arange(k.size), k)  # each candidate token's row, then its place j = 1..K
        j = np.arange(row.size) - np.repeat(np.cumsum(k) - k, k) + 1
        v = np.full(k.size, plain / width) if values is None else np.asarray(values, np.float64)
        gain = np.asarray([p for p, _ in chances], np.float64)[row] ** j * v[row]
        order = np.argsort(-gain, kind="stable")
        curve = self.costs(width + 1, width + row.size)
        if np.isnan(curve).any():
            return caps  # explore: measure these widths
        net = np.cumsum(gain[order]) - (curve - plain)  # time saved by the best n tokens, net of their rows
        take = int(net.argmax()) + 1 if net.size and net.max() > 0 else 0
        return np.bincount(row[order[:take]], minlength=k.size).tolist()

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
        c = float(self.costs(rows, rows, speculated)[0])
        return None if math.isnan(c) else c

    def costs(self, lo: int, hi: int, speculated: bool = False) -> np.ndarray:
        """Estimated seconds of steps of lo..hi rows (NaN: explore). A bucket's cost stands for its
        lower edge; between two measured buckets a count is interpolated by rows (a row more always
        costs more), below the narrowest it costs that one; past the widest it extends the slope of the
        two widest while its bucket is at most twice the widest's, else it is unknown."""
        side = speculated and self.separate
        table = sorted((k, v) for (s, k), v in self.seconds.items() if s == side)
        rows = np.arange(lo, hi + 1, dtype=np.float64)
        if not table:
            return np.full(rows.size, np.nan)
        keys, secs = np.array([k for k, _ in table], np.float64), np.array([v for _, v in table])
        out = np.interp(rows, keys, secs)
        past = rows > keys[-1]
        if past.any():
            edge = np.array([rows_bucket(int(r)) for r in rows[past]], np.float64)
            if keys.size >= 2:
                slope = max(0.0, (secs[-1] - secs[-2]) / (keys[-1] - keys[-2]))
                out[past] = np.where(keys[-1] >= edge / 2, secs[-1] + slope * (rows[past] - keys[-1]), np.nan)
            else:  # one bucket measured: only its own rows are known
                out[past] = np.where(edge == keys[-1], secs[-1], np.nan)
        return out

    def table(self, speculated: bool = False) -> dict[int, float]:
        """Measured seconds per step by rows bucket (logging, the bench)."""
        side = speculated and self.separate
        return dict(sorted((k, v) for (s, k), v in self.seconds.items() if s == side))

