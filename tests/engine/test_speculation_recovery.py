"""The on/off rule does not lock itself out: what turned speculation off is measured again.

Three traps the bench shows on the reference model at batch 1 (`bench/speculative.py --batches 1`):
an engine's first speculating steps run ~40% slower than later ones (a width priced by them was
refused and never measured again); a draft's first proposals of a prompt are often rejected (the
acceptance learned from them ruled every later probe out); and a draft's re-probe only drafted for
sequences it had kept up with, which at batch 1 after a pause is none."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from worker.engine.speculation.acceptance import CONFIDENCE_EDGES, MATCH_EDGES, AcceptanceTable
from worker.engine.speculation.config import SpeculativeConfig
from worker.engine.speculation.controller import WINDOW, SpeculationController


def test_a_cold_first_measurement_does_not_price_a_width() -> None:
    """Until a bucket has WINDOW samples its cost is the fastest seen (optimism while little is seen),
    then the median of the window (a neighbour's slow steps move it little)."""
    costs = SpeculationController(adaptive=True)
    for ms in (1.6, 1.4, 1.2, 1.1):  # a first probe's steps warming up
        costs.measure(5, ms / 1000, speculated=True)
    assert costs.cost(5, True) == 1.1 / 1000
    for ms in (1.1, 1.15, 1.05, 1.2, 3.0):
        costs.measure(5, ms / 1000, speculated=True)
    assert costs.cost(5, True) == sorted((1.6, 1.4, 1.2, 1.1, 1.1, 1.15, 1.05, 1.2, 3.0))[WINDOW // 2] / 1000


def test_fading_keeps_each_chance_and_lets_the_hope_recover() -> None:
    """fade keeps a share of every bucket's counts: the chances stay, but evidence that falls under
    TRUSTED trials no longer rules speculation out."""
    for edges, by_signal in ((MATCH_EDGES, True), (CONFIDENCE_EDGES, False)):
        table = AcceptanceTable(edges)
        for _ in range(60):
            table.observe([0.5, 0.5], 0)  # every proposal rejected at its first token
        before = table.chances()
        assert table.hope(by_signal) < 0.1
        fades = 0
        while table.hope(by_signal) < 1.0:
            table.fade(0.5)
            fades += 1
            assert np.allclose(table.chances(), before)
        assert fades <= 8


def test_a_proposer_refused_after_a_bad_start_is_measured_again() -> None:
    """Measured costs where verifying pays well (1 ms a plain step, 2 ms with 4 proposed tokens),
    acceptance learned at ~0 from a bad start: "cannot pay" at first, and each fresh verdict fades the
    evidence, so within a few back-offs the speculator tries again."""
    from worker.engine.speculation.speculator import Speculator

    spec = Speculator(SpeculativeConfig("ngram", 4), batch=None)  # type: ignore[arg-type]
    c = spec.controller
    for _ in range(3):
        c.record(1, 1e-3)
        c.record(5, 2e-3, speculated=True)
    for m in list(range(1, 20)) * 10:
        spec.acceptance.observe([m, m + 1], 0)  # every match length's proposals rejected
    verdicts = []
    for _ in range(12):
        while not c.should_propose(1):
            c.record(1, 1e-3)  # plain steps while backing off
        verdicts.append(spec._hopeless([(0, 4)], [1e-3], 1))
        if not verdicts[-1]:
            break
        c.record(1, 1e-3)
    assert verdicts[0] and not verdicts[-1] and len(verdicts) <= 6, verdicts


def test_a_draft_reprobe_at_batch_1_drafts_for_a_sequence_it_has_not_kept_up_with() -> None:
    """A re-probe drafts only for the rows the draft kept up with where there are some; with none (a
    new sequence after a pause, the only one at batch 1) it drafts for them, paying the catch-up."""
    from worker.engine.speculation.speculator import Speculator

    class Draft:
        def __init__(self, kept: set[int]) -> None:
            self.kept, self.asked = kept, []

        def in_step(self, seq) -> bool:  # noqa: ANN001
            return seq.seq_id in self.kept

        def propose(self, seqs, ks, go_on, with_probs):  # noqa: ANN001, ANN201
            self.asked.append([(s.seq_id, k) for s, k in zip(seqs, ks, strict=True)])
            return [[7] * k for k in ks], [[0.9] * k for k in ks]

    def reprobe(rows: int, kept: set[int]) -> list[tuple[int, int]]:
        seqs = [SimpleNamespace(seq_id=i, spec=None, constraint_state=None) for i in range(rows)]
        draft = Draft(kept)
        spec = Speculator(SpeculativeConfig("draft", 4, "unused"), SimpleNamespace(seqs=seqs), draft)  # type: ignore[arg-type]
        for _ in range(3):
            spec.controller.record(rows, 1e-3)
        spec.controller._probing[rows] = 3  # a probe run under way
        from worker.engine.speculation.speculator import SpecState

        for s in seqs:
            s.spec = SpecState()
        spec._drafts([(r, 4) for r in range(rows)], [1e-3] * rows, rows)
        assert spec.controller.reprobing
        return draft.asked[0]

    assert reprobe(1, set()) == [(0, 4)]  # batch 1, a sequence the draft has not kept up with
    assert reprobe(3, {1}) == [(1, 4)]  # others in step: only they draft
