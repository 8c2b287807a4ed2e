"""Speculative decoding's parts without a model: prompt lookup's proposals, the block manager's
rollback, the controller's on/off rule and the pauses of sequences whose proposals do not pay."""

from __future__ import annotations

import pytest

from worker.engine import SamplingParams
from worker.engine.speculation.config import SpeculativeConfig


def test_ngram_index_proposes_the_latest_longest_match() -> None:
    from worker.engine.speculation.ngram import NgramIndex

    index = NgramIndex()
    tokens = [1, 2, 3, 4, 9, 2, 3, 5, 7, 2, 3]
    assert index.propose(tokens, 3) == [5, 7, 2]  # "2 3": the latest earlier match was followed by 5 7 2
    tokens += [4]  # "2 3 4" matches the first occurrence only: 9 2 3 follow
    assert index.propose(tokens, 3) == [9, 2, 3]
    assert index.propose([8, 6], 2) == []  # a fresh index: nothing occurred before
    # a match running into the newest tokens continues with its period
    assert NgramIndex().propose([5, 5, 5], 4) == [5, 5, 5, 5]
    assert NgramIndex().propose([1, 7, 8, 7, 8], 5) == [7, 8, 7, 8, 7]


def test_block_rollback_gives_back_trailing_blocks() -> None:
    from worker.engine.block_manager import BlockManager
    from worker.engine.sequence import Sequence

    bm = BlockManager(8, 4, True)
    seq = Sequence(0, 0, list(range(6)), SamplingParams(), 0)
    bm.allocate(seq, [], [])
    assert bm.append_slots(seq, 6 + 5) and len(seq.block_table) == 3
    bm.truncate(seq, 7)
    assert len(seq.block_table) == 2 and bm.num_free_blocks == 6
    bm.check_invariants([seq])
    assert bm.free_blocks[0] not in seq.block_table  # the block given back is taken again first


def test_controller_turns_speculation_off_where_it_costs_more() -> None:
    from worker.engine.speculation.controller import SpeculationController

    c = SpeculationController(adaptive=True)
    # measured: 1 row 1.0 ms, 5 rows 1.2 ms (small batch: verifying is almost free);
    # 64 rows 10 ms, 320 rows 60 ms (large batch: cost grows faster than the rows)
    for rows, ms in ((1, 1.0), (5, 1.2), (64, 10.0), (320, 60.0)):
        for _ in range(3):
            c.record(rows, ms / 1000)
    assert c.decide(1, 4, expected_accepted=2.0, back_off=True)
    assert not c.decide(1, 4, expected_accepted=0.1)  # this step's proposals are unlikely: refused...
    assert c.should_propose(1)  # ...for this step only
    assert not c.decide(64, 256, expected_accepted=128.0, back_off=True)
    assert not c.should_propose(64)  # refused before proposing: no proposing at 64 rows for a while
    assert SpeculationController(adaptive=False).decide(64, 256, 0.0)
    draft = SpeculationController(adaptive=True, separate=True)  # a draft's steps are measured apart
    for _ in range(3):
        draft.record(1, 0.001)
        draft.record(5, 0.004, speculated=True)
    assert draft.cost(1) == 0.001 and draft.cost(5, speculated=True) == 0.004 and draft.cost(5) is None
    assert not draft.decide(1, 4, expected_accepted=2.0)  # 4 ms for 3 tokens > 1 ms for 1


def test_refused_proposals_pause_the_sequences_below_break_even() -> None:
    """A step refused because its proposals' expected acceptance does not pay pauses the sequences
    below the step's break-even (their acceptance is re-measured only by verifying: after the pause
    they restart at 1/2 and full K); a sequence above it, or a refusal that was a plain probe, pauses
    no one; a whole proposal kept makes the next pause short again."""
    from types import SimpleNamespace

    from worker.engine.speculation.speculator import PAUSE_FIRST, SpecState, Speculator

    low, high = SpecState(4), SpecState(4)
    low.rate, high.rate = 0.05, 0.9
    batch = SimpleNamespace(seqs=[SimpleNamespace(spec=low), SimpleNamespace(spec=high)])
    sp = Speculator(SpeculativeConfig("ngram", 4), batch)  # type: ignore[arg-type]
    for _ in range(3):  # 1 row 1 ms, 5 rows 1.6 ms, 2 rows 1.1 ms, 10 rows 2.5 ms
        for rows, ms in ((1, 1.0), (5, 1.6), (2, 1.1), (10, 2.5)):
            sp.controller.record(rows, ms / 1000)
    assert sp.controller.breakeven(1, 4) == pytest.approx(0.6)
    sp._pause_below([(1, [7, 7, 7, 7])], 1, expected=0.9 * 4)  # pays: a probe step's refusal
    assert high.paused == 0 and high.rate == 0.9
    sp._pause_below([(0, [7, 7, 7, 7]), (1, [7, 7, 7, 7])], 2, expected=0.05 * 4 + 0.9 * 4)
    assert high.paused == 0  # 3.8 expected vs 2 x 2.5 / 1.1 - 2 = 2.5 needed: it paid
    sp._pause_below([(0, [7, 7, 7, 7])], 1, expected=0.05 * 4)
    assert (low.paused, low.backoff, low.rate, low.k) == (PAUSE_FIRST, 2 * PAUSE_FIRST, 0.5, 4)
    sp.observe(batch.seqs[0], 4, 4)  # after the pause: a whole proposal kept
    assert low.backoff == PAUSE_FIRST
