"""SpeculationController: speculation only where the engine measured it to pay.

Verifying K proposed tokens of a sequence adds K rows to a decode step. At a small batch the wider
step costs about the same (decode reads all the weights for a handful of rows) and yields the
accepted tokens on top; at a large batch the extra rows cost more than the accepted tokens save.
Where the crossover lies depends on the machine, the model and the workload's acceptance, so it is
measured as the engine runs, never a constant:

- step cost: the median seconds of the latest pure decode / verify steps (no prefill chunk; a move
  under 1% is ignored)
  per number of rows (exact up to 8 rows, then buckets a quarter octave wide), host work included
  (CPU seconds of the process on the CPU, where a shared machine makes wall time noisy; wall time on
  a GPU), made non-decreasing in rows (`monotone`: medians measured apart can read out of order);
  another count is interpolated by rows between the measured buckets around it (a bucket's
  cost stands for its lower edge), or extends the slope of the two widest measured ones when it is
  at most twice the widest (else it is explored). A speculating step costs more than its rows (a
  draft model's forwards, the verify runs' host work), so speculating steps get a table of their
  own, plain steps the other, and a speculating step is never priced below a plain step of as many
  rows. One narrower than every measured speculating step is interpolated from the plain step (no
  token proposed) to the narrowest measured one (a probe measures full proposals only, and a draft's
  cost grows with the tokens it drafts).
- saving: each proposed token's chance of being kept (the proposer's AcceptanceTable) times the
  seconds a kept token saves (token_values: with requests waiting a plain step's cost per token,
  with none only what the step count can lose).

`allocate` gives each candidate row its K: the candidates' tokens taken best saving first, as many as
save the most time net of the rows they add. Before any proposing, `could_pay` asks whether the most
valuable row proposing at the proposer's hope (AcceptanceTable.hope) could save anything at this
width; if not, no proposing there for a back-off that doubles while it repeats (a large batch's host
work saved). Every step that proposed is settled by what it saved, host work included (`settle`),
and a width whose proposing lost time over JUDGE_STEPS steps backs off too. Measurements are kept
fresh: a width never measured, or refused for a while (32 steps, doubling), speculates for PROBE_RUN
steps in a row (one speculating step among plain ones would measure a draft model cold); while
speculation pays, every PROBE_PLAIN-th step runs plain unless a plain step of its width ran lately.
"""

from __future__ import annotations

import bisect
import math
from collections import deque

import numpy as np

Chance = float | tuple[float, ...]  # a row's chance per proposed token (allocate)

WINDOW = 9  # latest steps per rows bucket whose median is its cost
FIRST_SAMPLES = 2  # steps of a rows bucket measured before its cost is used (their minimum)

SKIP_FIRST, SKIP_MAX = 8, 512  # steps a refused width skips proposing: first, longest
PROBE_PLAIN = 64  # while speculation pays, every 64th step runs plain (its cost stays measured), unless
# a plain step of that width ran in the last 64 (steps without a proposal measure it for free)
SCALAR_COSTS = 32  # allocate: up to this many tokens one cost() each, past it one vectorized costs()
STALE_FIRST, STALE_MAX = 32, 1024  # a width refused this long (doubling while probes confirm it) is re-measured
PROBE_RUN = WINDOW  # ... by this many speculating steps in a row
JUDGE_STEPS = 32  # planned steps at a width before their measured gain can turn proposing off there


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


class SpeculationController:
    def __init__(self, adaptive: bool) -> None:
        self.seconds: dict[tuple[bool, int], float] = {}  # (speculating, rows bucket) -> its cost
        self._window: dict[tuple[bool, int], deque[float]] = {}  # its latest samples
        self._curves: dict[bool, tuple] = {}  # side -> its measured buckets, sorted (_curve)
        self.adaptive = adaptive
        self.steps = 0
        self._skip: dict[int, tuple[int, int]] = {}  # width -> (skip proposing until step, back-off)
        self._gain: dict[int, tuple[int, float]] = {}  # width -> (planned steps, their summed gain)
        self._prices: dict[tuple[int, int], list[float | None]] = {}  # (width, n) -> _best's step prices
        self._plain_at: dict[int, int] = {}  # rows bucket -> the step its latest plain step was recorded at
        self._probing: dict[int, int] = {}  # width bucket -> speculating steps left of a probe run
        self._refused: dict[int, tuple[int | None, int]] = {}  # width bucket -> (refused since, wait)
        self.reprobing = False  # the latest allocate is a probe step but not a width's first measurement

    def should_propose(self, width: int) -> bool:
        """False while `width` is backing off after speculation was refused there (no host work)."""
        return not self.adaptive or self.steps >= self._skip.get(rows_bucket(width), (0, 0))[0]

    def settle(self, width: int, gain: float) -> None:
        """A step of `width` decoding sequences that proposed (or tried to: the host work of matching
        and choosing is counted) gained `gain` plain steps' worth of time: what its accepted tokens
        saved (token_values) less what it cost beyond a plain step, over a plain step's cost;
        negative when proposing did not pay. After JUDGE_STEPS such steps a negative sum turns
        proposing off at that width (back_off): the per-step choice is judged by what it actually
        saved, host work included."""
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

    def clear_back_off(self, width: int) -> None:
        """Speculation could pay at `width` again: the next back-off there starts short."""
        self._skip.pop(rows_bucket(width), None)

    def back_off(self, width: int) -> None:
        """Speculation cannot pay at `width`: no proposing there for a while (doubling while it repeats)."""
        key = rows_bucket(width)
        back = min(SKIP_MAX, 2 * self._skip.get(key, (0, SKIP_FIRST // 2))[1])
        self._skip[key] = (self.steps + back, back)

    def token_values(self, width: int, lead: list[float], queued: bool) -> list[float] | None:
        """Seconds an accepted token saves, per candidate row of a step of `width` decoding sequences
        (None while the plain step is unmeasured). With requests waiting (or one row) every token is
        worth a plain step's cost per token: the row it frees takes new work, so the step's fixed
        cost is shared by more tokens. With none waiting the step count is set by the sequence with
        the most tokens left: a token of any other row only saves its row in a later step (the
        marginal cost per row; speeding up rows that finish early anyway would add rejected rows and
        save nothing). The leading row's tokens also save a step's fixed cost each, but only as many
        as it leads the next row by: `lead` is that part of its proposal (0..1; 0 for every other
        row, and for rows tied for the most: the step count falls only if all of them advance).
        Not adaptive: 0."""
        if not self.adaptive:
            return [0.0] * len(lead)
        plain = self.cost(width)
        if plain is None:
            return None
        if queued or width == 1:
            return [plain / width] * len(lead)
        narrow = self.cost(1)
        row = plain / width if narrow is None else max(0.0, (plain - narrow) / (width - 1))
        fixed = max(0.0, plain - width * row)
        return [row + fixed * share for share in lead]

    def allocate(self, width: int, chances: list[tuple[Chance, int]], values: list[float] | None = None,
                 hope: float | None = None) -> list[int]:  # fmt: skip
        """K per candidate row of a step of `width` decoding sequences, from (p, cap) per candidate: p
        the chance that each of its proposed tokens is kept given the ones before it were (so its j-th
        token is kept with chance p^j), or one such chance per token (p[j - 1] for the j-th: prompt
        lookup's match grows with each kept token), cap its most tokens; `values` the seconds a kept token of each
        saves (token_values; default: a plain step's cost per token). The candidates' tokens are taken
        by expected saving (chance x value), best first, and the prefix that saves the most time net of
        its extra rows' measured cost is kept; every K is 0 when none saves any, and on every
        PROBE_PLAIN-th step that no plain step of its width preceded within PROBE_PLAIN. A probe run of PROBE_RUN steps measures a width: every cap where a cost
        is unmeasured; where nothing would be taken and the width last speculated long ago (its costs
        and acceptance may have moved: 32 steps, doubling up to 1024 while the probes end refused,
        short again once it speculates), what every candidate would take at chance `hope` (the best
        the proposer may get; no probe when even that takes nothing). Not adaptive: every cap."""
        caps = [k for _, k in chances]
        self.reprobing = False
        if not self.adaptive or not caps:
            return caps
        key = rows_bucket(width)
        if self.cost(width) is None:
            return [0] * len(caps)  # the plain step is measured first
        if self._probing.get(key, 0) > 0:
            self._probing[key] -= 1
            self.reprobing = True
            return self._probe(width, caps, values, hope)
        take = self._best(width, chances, values)
        if take is None:
            self._probing[key] = PROBE_RUN - 1
            return caps
        if any(take):
            self._refused.pop(key, None)
            due = not self.steps % PROBE_PLAIN and self.steps - self._plain_at.get(key, -PROBE_PLAIN) >= PROBE_PLAIN
            return [0] * len(caps) if due else take
        last, wait = self._refused.get(key, (None, STALE_FIRST))
        if last is None:  # refused after speculating (or a probe): wait, then probe
            self._refused[key] = (self.steps, wait)
        elif self.steps - last > wait:
            self._refused[key] = (None, min(STALE_MAX, 2 * wait))
            probe = self._probe(width, caps, values, hope)
            if any(probe):
                self._probing[key] = PROBE_RUN - 1  # measure it: PROBE_RUN speculating steps in a row
                self.reprobing = True
                return probe
        return take

    def _probe(self, width: int, caps: list[int], values: list[float] | None, hope: float | None) -> list[int]:
        """A probe step's K per candidate: what each would take at chance `hope` (every cap without one,
        or where a cost is unmeasured)."""
        take = None if hope is None else self._best(width, [(hope, k) for k in caps], values)
        return caps if take is None else take

    def could_pay(self, width: int, chance: float, cap: int, value: float) -> bool:
        """Whether one row proposing `cap` tokens at `chance`, each kept token saving `value`, saves
        time at this width (allocate's question for the best case, without its probes)."""
        take = self._best(width, [(chance, cap)], [value]) if self.adaptive else [cap]
        return take is None or any(take)

    def _best(self, width: int, chances: list[tuple[Chance, int]], values: list[float] | None) -> list[int] | None:
        """allocate's choice from the measured costs alone; None where a cost is unmeasured."""
        plain = self.cost(width)
        if plain is None:
            return None
        v = values or [plain / width] * len(chances)
        gains = []
        for i, (p, k) in enumerate(chances):
            kept = 1.0  # the chance that the row's first j tokens are all kept
            for j in range(k):
                kept *= p if isinstance(p, float) else p[j]
                gains.append((kept * v[i], i))
        gains.sort(reverse=True)
        curve = self._prices.get((width, len(gains)))
        if curve is None:  # (kept until a measured cost changes: record)
            curve = self._prices[(width, len(gains))] = self._price(width, plain, len(gains))
        best, take, saved = 0.0, 0, 0.0
        for n, ((gain, _), spec) in enumerate(zip(gains, curve, strict=True), 1):
            if spec is None:
                return None
            saved += gain
            if saved - (spec - plain) > best:
                best, take = saved - (spec - plain), n
        out = [0] * len(chances)
        for _, i in gains[:take]:
            out[i] += 1
        return out

    def _price(self, width: int, plain: float, n: int) -> list[float | None]:
        """[i]: the price of a speculating step of width + i + 1 rows (None: unmeasured)."""
        if n <= SCALAR_COSTS:
            spec = [self.cost(width + i, True) for i in range(1, n + 1)]
            floor = [self.cost(width + i) for i in range(1, n + 1)]
        else:
            spec = [None if math.isnan(c) else c for c in self.costs(width + 1, width + n, True).tolist()]
            floor = [None if math.isnan(c) else c for c in self.costs(width + 1, width + n).tolist()]
        spec = self._from_plain(width, plain, spec)
        # an estimated speculating step costs at least a plain step of as many rows (where that is
        # known): the speculating side's table may hold only far-apart widths, and its interpolation
        # must not price a verify step below the plain step it extends. A measured one stands as
        # measured: verify rows of one sequence share its host work, and cost less than as many
        # sequences' rows (`bench/speculative.py --batches 1,8` prints both tables: at batch 1, 5 verify
        # rows cost less than a 5-sequence plain step)
        keys = set(self._curve(True)[0])
        return [c if c is None or f is None or width + i in keys else max(c, f)
                for i, (c, f) in enumerate(zip(spec, floor, strict=True), 1)]  # fmt: skip

    def _from_plain(self, width: int, plain: float, spec: list[float | None]) -> list[float | None]:
        """spec[n - 1]: a speculating step of width + n rows. Narrower than every measured speculating
        step it is interpolated from the plain step of `width` (nothing proposed) to the narrowest
        measured one, not priced as that one: a draft's drafting grows with its tokens, and a probe
        that measured only full proposals (K + 1 rows) must not make one token cost as much as K."""
        keys, secs, _ = self._curve(True)
        if not keys or keys[0] <= width + 1:
            return spec
        narrow, at = secs[0], keys[0] - width
        return [plain + (narrow - plain) * n / at if n < at else c for n, c in enumerate(spec, 1)]

    def record(self, rows: int, seconds: float, speculated: bool = False) -> None:
        """A pure decode / verify step of `rows` rows took `seconds` (host work included): `measure`;
        the cached prices follow a cost that moved."""
        self.steps += 1
        if not speculated:
            self._plain_at[rows_bucket(rows)] = self.steps
        if self.measure(rows, seconds, speculated):
            self._prices.clear()

    # ---- measured step costs: seconds by rows, per side (plain, speculating) --------------
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

