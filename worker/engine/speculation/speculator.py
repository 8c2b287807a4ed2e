"""Speculator: the scheduler's side of speculative decoding. Which decoding rows propose what this
step, and each sequence's acceptance (K follows its acceptance average: full from 1/2 up, less below;
speculation pauses, with a doubling back-off, for a sequence whose acceptance stays low). The
proposers know no grammar: a constrained row's proposal is cut to the prefix its grammar accepts
(ConstraintState.validate: the state does not move; a refused token is never consumed)."""

from __future__ import annotations

import math

import numpy as np

from worker.engine.batch_state import PersistentBatch
from worker.engine.sequence import Sequence
from worker.engine.speculation.config import SpeculativeConfig
from worker.engine.speculation.controller import SpeculationController
from worker.engine.speculation.draft import DraftModel
from worker.engine.speculation.ngram import NgramIndex
from worker.engine.stats import EngineStats

LOW_ACCEPTANCE = 0.2  # below this average acceptance a sequence pauses speculation
PAUSE_FIRST, PAUSE_MAX = 8, 64  # decode steps of the first pause, and the longest


class SpecState:
    """One sequence's speculation state (Sequence.spec)."""

    __slots__ = ("k", "k_max", "rate", "verifies", "paused", "backoff", "index")

    def __init__(self, k: int) -> None:
        self.k = self.k_max = k
        self.rate = 0.5  # exponential average of accepted / proposed
        self.verifies = 0
        self.paused = 0  # decode steps left without speculation
        self.backoff = PAUSE_FIRST
        self.index = NgramIndex()


class Speculator:
    def __init__(self, config: SpeculativeConfig, batch: PersistentBatch, draft: DraftModel | None = None,
                 stats: EngineStats | None = None) -> None:  # fmt: skip
        self.config = config
        self.stats = stats or EngineStats()
        self.batch = batch
        self.draft = draft  # method "draft": the draft model proposes, else prompt lookup
        self.controller = SpeculationController(config.adaptive, separate=draft is not None)

    def plan(self, rows: np.ndarray, extra: int) -> list[tuple[int, list[int]]]:
        """(row, proposed tokens) for the decode rows (ascending) that speculate this step, within
        `extra` tokens of step budget beyond one per row."""
        if extra < 1 or not self.controller.should_propose(rows.size):
            return []
        most = min(self.config.num_tokens * rows.size, extra)  # every row proposing K, all accepted
        if not self.controller.decide(rows.size, most, most, back_off=True):  # could it pay at all here?
            return []
        wanted = self._candidates(rows, extra)  # (row, K) by the sequences' own acceptance
        if not wanted:
            return []
        # before any proposing work: would the sequences' acceptance pay for these rows?
        if not self._pays([(r, [0] * k) for r, k in wanted], rows.size):
            return []
        b = self.batch
        if self.draft is not None:  # the draft proposes for all of them at once
            seqs = [b.seqs[r] for r, _ in wanted]
            proposals = self.draft.propose(seqs, [k for _, k in wanted])
            out = []
            for (r, _), seq, p in zip(wanted, seqs, proposals, strict=True):
                p = self._grammar_cut(seq, p)
                if p:
                    out.append((r, p))
                elif seq.constraint_state is not None:  # its whole proposal refused
                    self.draft.rollback(seq, 0)
            return out
        out = []
        for r, k in wanted:
            seq = b.seqs[r]
            draft = self._grammar_cut(seq, seq.spec.index.propose(seq.token_ids, k))
            if draft:
                out.append((r, draft))
        return out if out and self._pays(out, rows.size) else []

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
        if self.draft is not None:
            self.draft.rollback(seq, accepted)
        st = seq.spec
        if not self.config.adaptive or not isinstance(st, SpecState):
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
