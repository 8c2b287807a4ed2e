"""Speculator: the engine's one interface to speculative decoding, called in Engine.step's phases:
`plan` (which decoding rows propose what this step, and how many tokens each; the scheduler takes
blocks for them), `observe` (what the verify step kept) and `record` (what the step cost).

Both proposers go the same way. Each candidate row's tokens are weighed by the chance that they are
kept (AcceptanceTable, learned across the engine's sequences) times the seconds a kept token saves
(SpeculationController.token_values) against the measured cost of the rows they add
(SpeculationController.allocate). Prompt lookup knows its chance per row before proposing: the
length of the row's match. A draft model learns its chance token by token: each row gets K from the
draft's overall acceptance, and while drafting it stops a row whose next token no longer pays,
judged by the draft's own probability of the tokens so far (_go_on). Every step that proposed is
settled by what it actually saved (SpeculationController.settle).

The proposers know no grammar: a constrained row's proposal is cut to the prefix its grammar accepts
(ConstraintState.validate: the state does not move; a refused token is never consumed).
"""

from __future__ import annotations

import time

import numpy as np

from worker.engine.batch_state import PersistentBatch
from worker.engine.sequence import Sequence
from worker.engine.speculation.acceptance import CONFIDENCE_EDGES, MATCH_EDGES, AcceptanceTable
from worker.engine.speculation.chain_stop import ChainStop
from worker.engine.speculation.config import SpeculativeConfig
from worker.engine.speculation.controller import SpeculationController
from worker.engine.speculation.draft import DraftModel
from worker.engine.speculation.ngram import NgramIndex
from worker.engine.speculation.verifier import SpecRun
from worker.engine.stats import EngineStats

HOPE_STEPS = 16  # steps a width's "could it pay at all" verdict is kept
FADE_KEEP = 0.5  # the share of the acceptance counts each "it cannot pay" verdict keeps (AcceptanceTable.fade)


class SpecState:
    """One sequence's speculation state (Sequence.spec)."""

    __slots__ = ("index", "matched", "value", "signals")

    def __init__(self) -> None:
        self.index = NgramIndex()  # prompt lookup's
        self.matched = 0  # prompt lookup: the length of the match behind the latest proposal
        self.value = 0.0  # seconds each accepted token of the latest proposal saves (token_values)
        self.signals: list[float] = []  # a draft: its probability of each token of the latest proposal


class Speculator:
    def __init__(self, config: SpeculativeConfig, batch: PersistentBatch, draft: DraftModel | None = None,
                 stats: EngineStats | None = None) -> None:  # fmt: skip
        self.config = config
        self.stats = stats or EngineStats()
        self.batch = batch
        self.draft = draft  # method "draft": the draft model proposes, else prompt lookup
        self.controller = SpeculationController(config.adaptive)
        # by the proposer's signal: prompt lookup's match length, or the draft's top-1 probability
        self.acceptance = AcceptanceTable(MATCH_EDGES if draft is None else CONFIDENCE_EDGES)
        self.plan_seconds = (0.0, 0.0)  # the latest plan's host time: CPU, wall
        self._planned = 0  # the width of this step's proposing (0: none)
        self._saved = 0.0  # seconds saved by tokens accepted since the latest settled step
        self._hope: dict[int, tuple[int, bool]] = {}  # width -> (until step, could it pay at all)

    def plan(self, rows: np.ndarray, extra: int, queued: bool = False) -> list[tuple[int, list[int]]]:
        """(row, proposed tokens) for the decode rows (ascending) that speculate this step, within
        `extra` tokens of step budget beyond one per row; `queued`: requests wait for a row. Its host
        time is kept (plan_seconds: CPU and wall) so that a step it proposed nothing for is costed as
        a plain step would be: the controller compares speculating with not speculating at all."""
        c0, t0 = time.process_time(), time.perf_counter()
        self._planned, self._saved = 0, 0.0  # (a step with a prompt chunk is not settled)
        try:
            return self._plan(rows, extra, queued)
        finally:
            self.plan_seconds = (time.process_time() - c0, time.perf_counter() - t0)

    def _plan(self, rows: np.ndarray, extra: int, queued: bool) -> list[tuple[int, list[int]]]:
        if extra < 1 or not self.controller.should_propose(rows.size):
            return []
        wanted = self._candidates(rows, extra)  # (row, most tokens)
        found = None
        if self.draft is None and wanted:  # prompt lookup: rows without a match drop out before pricing
            found = self._matches(wanted)
            if not found:  # the lookups' host time is this step's loss (settle)
                self._planned = rows.size
                return []
            wanted = [(r, cap) for r, _, _, _, cap in found]
        values = self._values(rows, wanted, queued) if wanted else None
        # could it pay at all here, the most valuable row proposing as well as the best ones do?
        if values is None or self._hopeless(wanted, values, rows.size):
            return []
        self._planned = rows.size
        if found is not None:
            return self._lookup(found, values, rows.size)
        return self._drafts(wanted, values, rows.size)

    def _candidates(self, rows: np.ndarray, extra: int) -> list[tuple[int, int]]:
        """(row, most tokens) of the rows that may speculate this step (no shared block to copy first,
        no token in flight, masked if constrained): K within the row's length limit and `extra` tokens
        of step budget."""
        b, k_max = self.batch, self.config.num_tokens
        out = []
        for r in rows.tolist():
            if b.cow[r] or b.num_pending[r]:
                continue
            seq = b.seqs[r]
            if seq.params.masked and seq.constraint_state is None:  # not masked yet
                continue
            if seq.spec is None:
                seq.spec = SpecState()
            k = min(k_max, int(b.limit[r] - b.num_tokens[r]) - 1, extra)
            if k >= 1:
                out.append((r, k))
                extra -= k
                if extra < 1:
                    break
        return out

    def _values(self, rows: np.ndarray, wanted: list[tuple[int, int]], queued: bool) -> list[float] | None:
        """Seconds an accepted token of each candidate saves (SpeculationController.token_values): the
        row with the most tokens left leads by how many more it has than the next."""
        b = self.batch
        lead = [0.0] * len(wanted)
        if rows.size > 1:
            left = b.limit[rows] - b.num_tokens[rows]
            first, second = np.partition(left, -2)[-2:][::-1]
            for i, (r, cap) in enumerate(wanted):
                if b.limit[r] - b.num_tokens[r] == first > second:
                    lead[i] = min(1.0, float(first - second) / cap)
        return self.controller.token_values(rows.size, lead, queued)

    def _hopeless(self, wanted: list[tuple[int, int]], values: list[float], width: int) -> bool:
        """Speculation cannot pay at this width even for the most valuable candidate proposing K tokens
        as well as the best proposals may (AcceptanceTable.hope): then no proposing for a while (a
        back-off that doubles while it repeats: the host work of a large batch's proposing is saved).
        Each fresh such verdict fades the acceptance evidence (FADE_KEEP): judged only on what it saw
        before proposing stopped, a proposer refused after a bad start (the reference draft's first
        proposals of a prompt) would never be measured again."""
        value, k = max(values), self.config.num_tokens  # a row's full K: not one near its length limit
        steps, hope = self._hope.get(width, (-1, True))
        fresh = steps < self.controller.steps  # the verdict holds for HOPE_STEPS steps (costs move slowly)
        if fresh:
            hope = self.controller.could_pay(width, self.acceptance.hope(self.draft is None), k, value)
            self._hope[width] = (self.controller.steps + HOPE_STEPS, hope)
        if hope:
            return False
        if fresh:  # the evidence behind a fresh "cannot pay" ages (FADE_KEEP)
            self.acceptance.fade(FADE_KEEP)
        self.controller.back_off(width)
        return True

    def _matches(self, wanted: list[tuple[int, int]]) -> list[tuple[int, Sequence, int, int, int]]:
        """(row, sequence, match end, match length, most tokens) of the candidates whose newest tokens
        occurred before (NgramIndex.match)."""
        b, found = self.batch, []
        for r, cap in wanted:
            seq = b.seqs[r]
            e, length = seq.spec.index.match(seq.token_ids)
            if e >= 0:
                found.append((r, seq, e, length, cap))
        return found

    def _lookup(self, found: list[tuple[int, Sequence, int, int, int]], values: list[float],
                width: int) -> list[tuple[int, list[int]]]:  # fmt: skip
        """Prompt lookup's proposals: each matched candidate's K from its match's acceptance chance and
        the rows' measured cost (SpeculationController.allocate)."""
        chance = self.acceptance.chance  # each kept token lengthens the match: token j is judged at m + j - 1
        ks = self.controller.allocate(width, [(tuple(chance(m + j) for j in range(cap)), cap) for *_, m, cap in found],
                                      values, self.acceptance.hope(True))  # fmt: skip
        out = []
        for (r, seq, e, length, _), value, k in zip(found, values, ks, strict=True):
            draft = self._grammar_cut(seq, NgramIndex.continuation(seq.token_ids, e, k)) if k else []
            if draft:
                seq.spec.matched, seq.spec.value = length, value
                out.append((r, draft))
        return out

    def _drafts(self, wanted: list[tuple[int, int]], values: list[float], width: int) -> list[tuple[int, list[int]]]:
        """The draft's proposals: each candidate's K from the draft's overall acceptance and the rows'
        measured cost (allocate), drafted for all of them at once with the early stop (_go_on)."""
        b = self.batch
        ks = self.controller.allocate(width, [(self.acceptance.overall(), cap) for _, cap in wanted], values,
                                      self.acceptance.hope(False))  # fmt: skip
        if self.controller.reprobing:  # a re-probe drafts only for rows the draft kept up with where
            # there are some: a sequence it has not drafted for lately first needs a prompt-sized
            # catch-up (where none is, as at batch 1 after a pause, the probe pays one)
            kept = [self.draft.in_step(b.seqs[r]) for r, _ in wanted]  # type: ignore[union-attr]
            if any(kept):
                ks = [k if ok else 0 for k, ok in zip(ks, kept, strict=True)]
        chosen = [(r, k, v) for (r, _), k, v in zip(wanted, ks, values, strict=True) if k]
        if not chosen:
            return []
        seqs = [b.seqs[r] for r, _, _ in chosen]
        go_on = self._go_on(width, [v for *_, v in chosen], sum(ks))
        # the draft's probabilities feed its acceptance table (adaptive) and its early stop
        proposals, probs = self.draft.propose(seqs, [k for _, k, _ in chosen], go_on,  # type: ignore[union-attr]
                                              self.config.adaptive)  # fmt: skip
        out = []
        for (r, _, value), seq, p, q in zip(chosen, seqs, proposals, probs, strict=True):
            p = self._grammar_cut(seq, p)
            if p:
                seq.spec.signals, seq.spec.value = q[: len(p)], value
                out.append((r, p))
            elif seq.constraint_state is not None:  # its whole proposal refused
                self.draft.rollback(seq, 0)  # type: ignore[union-attr]
        return out

    def _go_on(self, width: int, values: list[float], tokens: int) -> ChainStop | None:
        """The draft's early stop: a row drafts another token while its expected saving (the chance that
        all its tokens so far are kept, by the draft's probability of each: AcceptanceTable, times the
        draft's overall chance for the next; times the row's token value) beats what a drafted token
        costs (the slope of the measured speculating steps: a draft step and a verify row). None (every
        token up to K) when not adaptive or the slope is unmeasured. A ChainStop: callable as
        go_on(row, probabilities so far), and evaluated the same way in C by the draft's DraftChain."""
        if not self.config.adaptive or tokens < 2:
            return None
        lo, hi = self.controller.cost(width + 1, True), self.controller.cost(width + tokens, True)
        if lo is None or hi is None:
            return None
        per_token = max(0.0, (hi - lo) / (tokens - 1))
        table = self.acceptance
        return ChainStop(edges=tuple(table.edges), chances=table.chances(), overall=table.overall(), per_token=per_token,
                         values=tuple(values))

    def _grammar_cut(self, seq: Sequence, draft: list[int]) -> list[int]:
        """A constrained row's proposal up to the first token its grammar refuses."""
        state = seq.constraint_state
        if state is None or not draft:
            return draft
        keep = state.validate(draft)
        self.stats.spec_grammar_cut_tokens += len(draft) - keep
        return draft[:keep]

    def observe(self, runs: list[SpecRun]) -> None:
        """A verify step's runs, before their tokens are applied: each kept `accepted` of its `proposed`
        tokens; the draft forgets the rest, the acceptance table learns from the proposal's signals,
        the step's saving counts them."""
        for run in runs:
            seq, proposed, accepted = run.seq, run.proposed, run.accepted
            if self.draft is not None:
                self.draft.rollback(seq, accepted)
            st = seq.spec
            if not isinstance(st, SpecState):
                continue
            self._saved += accepted * st.value
            # prompt lookup: token j of the proposal was judged with a match of matched + j - 1 (the
            # tokens before it kept, the match had grown by them)
            signals = st.signals if self.draft is not None else [st.matched + j for j in range(proposed)]
            self.acceptance.observe(signals, accepted)

    def record(self, rows: int, seconds: float, speculated: bool, cpu: bool) -> None:
        """A pure decode / verify step of `rows` rows took `seconds` (CPU seconds on the CPU, else wall).
        A step without speculation is costed without its proposing (so the controller compares with
        not speculating at all), a step whose draft caught up on many tokens (a new sequence's prompt,
        or the tokens of a pause) not at all; a step that proposed is settled by what it saved, host
        work and catch-ups included (SpeculationController.settle)."""
        plan = self.plan_seconds[0 if cpu else 1]
        width, self._planned = self._planned, 0
        saved, self._saved = self._saved, 0.0
        if self.draft is not None and self.draft.prefilled:  # not a step's cost: a catch-up's
            self.draft.prefilled = False
        else:
            self.controller.record(rows, seconds if speculated else seconds - plan, speculated)
        plain = self.controller.cost(width) if width else None  # but proposing pays for its catch-ups
        if plain:
            self.controller.settle(width, (saved - (seconds - plain)) / plain)
