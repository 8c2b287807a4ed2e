"""Speculator: the scheduler's side of speculative decoding. Which decoding rows propose what this
step. Prompt lookup: each row's K is chosen per step from how long its match is (AcceptanceTable:
the chance a token from such a match is kept, learned across sequences) against the measured cost of
the rows (SpeculationController.allocate). A draft model: each sequence's acceptance average sets its
K (full from 1/2 up, less below), and speculation pauses, with a doubling back-off, for a sequence
whose acceptance stays low. The proposers know no grammar: a constrained row's proposal is cut to the
prefix its grammar accepts (ConstraintState.validate: the state does not move; a refused token is
never consumed)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from worker.engine.batch_state import PersistentBatch
from worker.engine.sequence import Sequence
from worker.engine.speculation.acceptance import CONFIDENCE_EDGES, MATCH_EDGES, AcceptanceTable
from worker.engine.speculation.config import SpeculativeConfig
from worker.engine.speculation.controller import SpeculationController
from worker.engine.speculation.draft import DraftModel
from worker.engine.speculation.ngram import NgramIndex
from worker.engine.stats import EngineStats

LOW_ACCEPTANCE = 0.2  # below this average acceptance a sequence pauses drafting
PAUSE_FIRST, PAUSE_MAX = 8, 64  # decode steps of the first pause, and the longest


class SpecState:
    """One sequence's speculation state (Sequence.spec)."""

    __slots__ = ("k", "k_max", "rate", "verifies", "paused", "backoff", "index", "matched", "value", "signals")

    def __init__(self, k: int) -> None:
        self.k = self.k_max = k
        self.rate = 0.5  # exponential average of accepted / proposed
        self.verifies = 0
        self.paused = 0  # decode steps left without speculation
        self.backoff = PAUSE_FIRST
        self.index = NgramIndex()
        self.matched = 0  # prompt lookup: the length of the match behind the latest proposal
        self.value = 0.0  # prompt lookup: seconds each of its accepted tokens saves (token_values)
        self.signals: list[float] = []  # a draft: its probability of each token of the latest proposal


class Speculator:
    def __init__(self, config: SpeculativeConfig, batch: PersistentBatch, draft: DraftModel | None = None,
                 stats: EngineStats | None = None) -> None:  # fmt: skip
        self.config = config
        self.stats = stats or EngineStats()
        self.batch = batch
        self.draft = draft  # method "draft": the draft model proposes, else prompt lookup
        self.controller = SpeculationController(config.adaptive, separate=draft is not None)
        # by the proposer's signal: prompt lookup's match length, or the draft's top-1 probability
        self.acceptance = AcceptanceTable(MATCH_EDGES if draft is None else CONFIDENCE_EDGES)
        self.plan_seconds = (0.0, 0.0)  # the latest plan's host time: CPU, wall
        self._planned = 0  # prompt lookup: the width of this step's lookups (0: none)
        self._saved = 0.0  # seconds saved by tokens accepted since the latest settled step

    def plan(self, rows: np.ndarray, extra: int, queued: bool = False) -> list[tuple[int, list[int]]]:
        """(row, proposed tokens) for the decode rows (ascending) that speculate this step, within
        `extra` tokens of step budget beyond one per row; `queued`: requests wait for a row. Its host time is kept (plan_seconds: CPU and
        wall) so that a step it proposed nothing for is costed as a plain step would be: the
        controller compares speculating with not speculating at all."""
        c0, t0 = time.process_time(), time.perf_counter()
        self._planned, self._saved = 0, 0.0  # (a step with a prompt chunk is not settled)
        try:
            return self._plan(rows, extra, queued)
        finally:
            self.plan_seconds = (time.process_time() - c0, time.perf_counter() - t0)

    def _plan(self, rows: np.ndarray, extra: int, queued: bool) -> list[tuple[int, list[int]]]:
        if extra < 1 or not self.controller.should_propose(rows.size):
            return []
        if self.draft is None:
            wanted = self._candidates(rows, extra)  # (row, most tokens)
            values = self._values(rows, wanted, queued)
            # could it pay at all here, every row matching as well as the best matches do?
            if not wanted or values is None or self._hopeless(wanted, values, rows.size):
                return []
            return self._lookup(wanted, values, rows.size)
        most = min(self.config.num_tokens * rows.size, extra)  # every row proposing K, all accepted
        if not self.controller.decide(rows.size, most, most, back_off=True):  # could it pay at all here?
            return []
        wanted = self._candidates(rows, extra)  # (row, K) by the sequences' own acceptance
        if not wanted:
            return []
        # before any drafting work: would the sequences' acceptance pay for these rows?
        if not self._pays([(r, [0] * k) for r, k in wanted], rows.size):
            return []
        b = self.batch
        seqs = [b.seqs[r] for r, _ in wanted]  # the draft proposes for all of them at once
        proposals, probs = self.draft.propose(seqs, [k for _, k in wanted], self._go_on(rows, wanted, queued))
        out = []
        for (r, _), seq, p, q in zip(wanted, seqs, proposals, probs, strict=True):
            p = self._grammar_cut(seq, p)
            if p:
                seq.spec.signals = q[: len(p)]
                out.append((r, p))
            elif seq.constraint_state is not None:  # its whole proposal refused
                self.draft.rollback(seq, 0)
        return out

    def _go_on(self, rows: np.ndarray, wanted: list[tuple[int, int]], queued: bool
               ) -> Callable[[int, list[float]], bool] | None:  # fmt: skip
        """The draft's early stop: candidate i drafts another token while its expected saving (the
        chance that all its tokens so far and the next are kept, the next judged like the latest, by
        the draft's confidence: AcceptanceTable; times token_values) beats what a drafted token costs
        (the slope of the measured speculating steps: a draft step and a verify row). None (every
        token up to K) when not adaptive or a side is unmeasured."""
        values = self._values(rows, wanted, queued) if self.config.adaptive else None
        most = rows.size + sum(k for _, k in wanted)
        ends = self.controller.costs(rows.size + 1, most, speculated=True)[[0, -1]]
        if values is None or most - rows.size < 2 or np.isnan(ends).any():
            return None
        per_token = max(0.0, float(ends[1] - ends[0]) / (most - rows.size - 1))
        chance = self.acceptance.chance

        def go_on(i: int, probs: list[float]) -> bool:
            return math.prod(chance(q) for q in probs) * chance(probs[-1]) * values[i] > per_token

        return go_on

    def _values(self, rows: np.ndarray, wanted: list[tuple[int, int]], queued: bool) -> list[float] | None:
        """Seconds an accepted token of each candidate saves (SpeculationController.token_values): the
        row with the most tokens left leads by how many more it has than the next."""
        b = self.batch
        left = b.limit[rows] - b.num_tokens[rows]
        lead = [0.0] * len(wanted)
        if left.size > 1:
            first, second = np.partition(left, -2)[-2:][::-1]
            for i, (r, cap) in enumerate(wanted):
                if b.limit[r] - b.num_tokens[r] == first > second:
                    lead[i] = min(1.0, float(first - second) / cap)
        return self.controller.token_values(rows.size, lead, queued)

    def _hopeless(self, wanted: list[tuple[int, int]], values: list[float], width: int) -> bool:
        """Prompt lookup cannot pay at this width even for its most valuable candidate matching as
        well as the best matches have (the best bucket's chance): then no matching for a while (a
        back-off that doubles while it repeats: the host work of a large batch's lookups is saved)."""
        if self.controller.should_probe(width):
            return False
        i = max(range(len(wanted)), key=values.__getitem__)
        if any(self.controller.allocate(width, [(self.acceptance.best(), wanted[i][1])], [values[i]])):
            return False
        self.controller.back_off(width)
        return True

    def record(self, rows: int, seconds: float, speculated: bool, cpu: bool) -> None:
        """A pure decode / verify step of `rows` rows took `seconds` (CPU seconds on the CPU, else wall).
        A step without speculation is costed without its proposing (so the controller compares with
        not speculating at all), a step whose draft caught up on a new sequence's prompt not at all
        (one-time work); a step whose lookups ran is settled by what it gained, host work included
        (SpeculationController.settle)."""
        plan = self.plan_seconds[0 if cpu else 1]
        if self.draft is not None and self.draft.prefilled:  # one-time work: a new sequence's prompt
            return
        self.controller.record(rows, seconds if speculated else seconds - plan, speculated)
        width, self._planned = self._planned, 0
        saved, self._saved = self._saved, 0.0
        plain = self.controller.cost(width) if width else None
        if plain:
            self.controller.settle(width, (saved - (seconds - plain)) / plain)

    def _lookup(self, wanted: list[tuple[int, int]], values: list[float], width: int) -> list[tuple[int, list[int]]]:
        """Prompt lookup's proposals: each candidate's match, its K from the match's acceptance chance
        and the rows' measured cost (SpeculationController.allocate)."""
        self._planned = width
        b, found = self.batch, []
        for (r, cap), value in zip(wanted, values, strict=True):
            seq = b.seqs[r]
            e, length = seq.spec.index.match(seq.token_ids)
            if e >= 0:
                found.append((r, seq, e, length, cap, value))
        ks = self.controller.allocate(width, [(self.acceptance.chance(m), cap) for _, _, _, m, cap, _ in found],
                                      [v for *_, v in found])  # fmt: skip
        out, expected = [], 0.0
        for (r, seq, e, length, _, value), k in zip(found, ks, strict=True):
            draft = self._grammar_cut(seq, NgramIndex.continuation(seq.token_ids, e, k)) if k else []
            if draft:
                seq.spec.matched, seq.spec.value = length, value
                expected += self.acceptance.expected(length, len(draft))
                out.append((r, draft))
        # the controller's last word: it runs a plain step now and then to keep that cost measured
        return out if out and self.controller.decide(width, sum(len(d) for _, d in out), expected) else []

    def _candidates(self, rows: np.ndarray, extra: int) -> list[tuple[int, int]]:
        """(row, K) of the rows that may speculate this step (no shared block to copy first, no token
        in flight, masked if constrained, not paused: a pause counts down here), their K within the
        row's length limit and `extra` tokens of step budget."""
        b, k_max = self.batch, self.config.num_tokens
        out = []
        for r in rows.tolist():
            if b.cow[r] or b.num_pending[r]:
                continue
            seq = b.seqs[r]
            if seq.params.constraint is not None and seq.constraint_state is None:  # not masked yet
                continue
            st = seq.spec
            if st is None:
                st = seq.spec = SpecState(k_max)
                s = self.stats  # a new sequence starts from the engine's acceptance so far
                st.rate = s.spec_accepted_tokens / s.spec_proposed_tokens if s.spec_proposed_tokens >= 64 else 0.5
            if st.paused:
                st.paused -= 1
                continue
            k = min(st.k, int(b.limit[r] - b.num_tokens[r]) - 1, extra)
            if k >= 1:
                out.append((r, k))
                extra -= k
                if extra < 1:
                    break
        return out

    def _pays(self, out: list[tuple[int, list[int]]], width: int) -> bool:
        """The controller's verdict on verifying these proposals at the sequences' own acceptance; a
        refusal pauses the sequences below the step's break-even (_pause_below)."""
        b = self.batch
        expected = sum(b.seqs[r].spec.rate * len(d) for r, d in out)
        if self.controller.decide(width, sum(len(d) for _, d in out), expected):
            return True
        self._pause_below(out, width, expected)
        return False

    def _pause_below(self, out: list[tuple[int, list[int]]], width: int, expected: float) -> None:
        """The step's proposals were refused: when it was because their expected acceptance does not
        pay for their rows (not a plain probe step), the sequences whose acceptance is below the
        step's break-even pause, as low acceptance pauses them (their acceptance is only re-measured
        by verifying: without a pause and the optimistic restart after it, a refused sequence would
        stay refused)."""
        proposed = sum(len(d) for _, d in out)
        need = self.controller.breakeven(width, proposed)
        if need is None or expected >= need:
            return
        for r, _ in out:
            st = self.batch.seqs[r].spec
            if isinstance(st, SpecState) and st.rate * proposed < need:
                _pause(st)

    def _grammar_cut(self, seq: Sequence, draft: list[int]) -> list[int]:
        """A constrained row's proposal up to the first token its grammar refuses."""
        state = seq.constraint_state
        if state is None or not draft:
            return draft
        keep = state.validate(draft)
        self.stats.spec_grammar_cut_tokens += len(draft) - keep
        return draft[:keep]

    def observe(self, seq: Sequence, proposed: int, accepted: int) -> None:
        """A verify step of seq kept `accepted` of `proposed` tokens: adapt its K (adaptive only)."""
        st = seq.spec
        if self.draft is None:
            self._saved += accepted * st.value if isinstance(st, SpecState) else 0.0
            if isinstance(st, SpecState):
                self.acceptance.observe([st.matched] * proposed, accepted)
            return
        self.draft.rollback(seq, accepted)
        if not isinstance(st, SpecState):
            return
        self.acceptance.observe(st.signals, accepted)
        if not self.config.adaptive:
            return
        k_max = self.config.num_tokens
        st.verifies += 1
        st.rate = 0.7 * st.rate + 0.3 * (accepted / proposed)
        # K follows the acceptance average (full K from 1/2 up); the controller weighs the rows' cost
        st.k = max(1, min(k_max, math.ceil(2 * k_max * st.rate)))
        if accepted == proposed:  # a whole proposal kept: acceptance comes in bursts (copied spans)
            st.backoff = PAUSE_FIRST  # so the next pause starts short again
        if st.verifies >= 3 and st.rate < LOW_ACCEPTANCE:
            _pause(st)


def _pause(st: SpecState) -> None:
    """No speculation for st.backoff decode steps (doubling per pause, up to PAUSE_MAX; a whole
    proposal kept resets it), then an optimistic restart: acceptance 1/2, full K."""
    st.paused, st.backoff = st.backoff, min(PAUSE_MAX, 2 * st.backoff)
    st.rate, st.verifies, st.k = 0.5, 0, st.k_max
