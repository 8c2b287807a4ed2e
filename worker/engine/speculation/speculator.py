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
PAUSE_FIRST, PAUSE_MAX = 8, 256  # decode steps of the first pause, and the longest


class SpecState:
    """One sequence's speculation state (Sequence.spec)."""

    __slots__ = ("k", "rate", "verifies", "paused", "backoff", "index")

    def __init__(self, k: int) -> None:
        self.k = k
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
        self.rate = 0.5  # engine-wide exponential average of accepted / proposed

    def plan(self, rows: np.ndarray, extra: int) -> list[tuple[int, list[int]]]:
        """(row, proposed tokens) for the decode rows (ascending) that speculate this step, within
        `extra` tokens of step budget beyond one per row."""
        if extra < 1 or not self.controller.should_propose(rows.size):
            return []
        b, k_max = self.batch, self.config.num_tokens
        most = min(k_max * rows.size, extra)  # every row proposing K, at the engine-wide acceptance
        if not self.controller.decide(rows.size, most, self.rate * most, back_off=True):
            return []
        out = []
        expected = 0.0
        for r in rows.tolist():
            if b.cow[r] or b.num_pending[r]:  # a shared block to copy first / a token in flight
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
            if k < 1:
                continue
            if self.draft is not None:  # proposed together below, if the step speculates
                out.append((r, [0] * k))
                expected += st.rate * k
                extra -= k
                if extra < 1:
                    break
                continue
            draft = self._grammar_cut(seq, st.index.propose(seq.token_ids, k))
            if draft:
                out.append((r, draft))
                extra -= len(draft)
                expected += st.rate * len(draft)
                if extra < 1:
                    break
        if out and not self.controller.decide(rows.size, sum(len(d) for _, d in out), expected):
            return []
        if self.draft is not None and out:
            proposals = self.draft.propose([b.seqs[r] for r, _ in out], [len(d) for _, d in out])  # type: ignore[misc]
            kept = []
            for (r, _), p in zip(out, proposals, strict=True):
                p = self._grammar_cut(b.seqs[r], p)
                if p:
                    kept.append((r, p))
                elif b.seqs[r].constraint_state is not None:  # its whole proposal refused
                    self.draft.rollback(b.seqs[r], 0)
            out = kept
        return out

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
        self.rate = 0.9 * self.rate + 0.1 * accepted / proposed
        st = seq.spec
        if not self.config.adaptive or not isinstance(st, SpecState):
            return
        k_max = self.config.num_tokens
        st.verifies += 1
        st.rate = 0.7 * st.rate + 0.3 * (accepted / proposed)
        # K follows the acceptance average (full K from 1/2 up); the controller weighs the rows' cost
        st.k = max(1, min(k_max, math.ceil(2 * k_max * st.rate)))
        if st.verifies >= 3 and st.rate < LOW_ACCEPTANCE:
            st.paused, st.backoff = st.backoff, min(PAUSE_MAX, 2 * st.backoff)
            st.rate, st.verifies, st.k = 0.5, 0, k_max
