"""Speculative decoding's parts without a model: prompt lookup's proposals and match lengths, its
acceptance by match length, the block manager's rollback, the controller's on/off rule and K
allocation, and the pauses of drafting sequences whose proposals do not pay."""

from __future__ import annotations

import pytest

from worker.engine import SamplingParams
from worker.engine.speculation.config import SpeculativeConfig


def _propose(index, tokens: list[int], k: int) -> list[int]:  # noqa: ANN001
    """What the Speculator proposes from prompt lookup: the match's continuation, [] without one."""
    e, _ = index.match(tokens)
    return [] if e < 0 else index.continuation(tokens, e, k)


def test_ngram_index_proposes_the_latest_longest_match() -> None:
    from worker.engine.speculation.ngram import NgramIndex

    index = NgramIndex()
    tokens = [1, 2, 3, 4, 9, 2, 3, 5, 7, 2, 3]
    assert _propose(index, tokens, 3) == [5, 7, 2]  # "2 3": the latest earlier match was followed by 5 7 2
    tokens += [4]  # "2 3 4" matches the first occurrence only: 9 2 3 follow
    assert _propose(index, tokens, 3) == [9, 2, 3]
    assert _propose(index, [8, 6], 2) == []  # a fresh index: nothing occurred before
    # a match running into the newest tokens continues with its period
    assert _propose(NgramIndex(), [5, 5, 5], 4) == [5, 5, 5, 5]
    assert _propose(NgramIndex(), [1, 7, 8, 7, 8], 5) == [7, 8, 7, 8, 7]


def test_ngram_match_length_spans_the_copied_text() -> None:
    """A match's length counts back past the looked-up suffix while the text agrees (a copied span),
    up to MATCH_CAP; continuation() is what propose() offers from it."""
    from worker.engine.speculation.ngram import MATCH_CAP, NgramIndex

    span = [11, 12, 13, 14, 15, 16, 17, 18]
    tokens = [1, 2] + span + [9, 3] + span[:6]  # the span's first 6 tokens copied again
    e, length = NgramIndex().match(tokens)
    assert (e, length) == (8, 6) and NgramIndex.continuation(tokens, e, 3) == [17, 18, 9]
    assert NgramIndex().match([5, 6, 7, 6]) == (2, 1)  # only the last token recurs
    assert NgramIndex().match([5, 6, 7]) == (-1, 0)
    long = list(range(100, 140))
    assert NgramIndex().match(long + [0] + long) == (40, MATCH_CAP)
    assert NgramIndex().match([4] * 10) == (9, 9)  # periodic: the run agrees with itself shifted by one


def test_acceptance_table_learns_per_signal_bucket() -> None:
    """Each bucket starts at p = 1/2; each kept token is a hit in its bucket, the first rejected one a
    miss, later tokens are not judged; counts fade past HORIZON trials so p follows a changing
    workload."""
    from worker.engine.speculation.acceptance import (
        CONFIDENCE_EDGES,
        HORIZON,
        MATCH_EDGES,
        PRIOR_HITS,
        PRIOR_TRIALS,
        AcceptanceTable,
    )

    acc = AcceptanceTable(MATCH_EDGES)
    assert [acc.bucket(n) for n in (0, 1, 3, 4, 7, 8, 15, 16, 99)] == [0, 1, 3, 4, 4, 5, 5, 6, 6]
    assert acc.chance(1) == acc.chance(12) == 0.5
    assert (acc.hits[acc.bucket(12)], acc.trials[acc.bucket(12)]) == (PRIOR_HITS, PRIOR_TRIALS)
    acc.observe([12] * 4, 4)  # a copied span: all kept, no miss
    acc.observe([1] * 4, 0)  # a one-token guess: a miss at once
    assert acc.chance(12) == pytest.approx(5 / 6) and acc.chance(9) == acc.chance(12)
    assert acc.chance(1) == pytest.approx(1 / 3) and acc.chance(2) == 0.5
    assert AcceptanceTable(MATCH_EDGES).best() == 1.0  # nothing seen yet: anything may happen
    assert acc.best() == 1.0  # buckets seen less than TRUSTED times may still be perfect
    only = AcceptanceTable((5, 20))  # two buckets seen often (one never: no proposal came from it)
    for _ in range(10):
        only.observe([1, 1], 1)
        only.observe([9, 9], 2)
    assert only.best() == only.chance(9) == pytest.approx(21 / 22)
    for _ in range(1000):
        acc.observe([1] * 4, 1)  # keeps 1 of 4: p -> 1/2 whatever came before
    assert acc.trials[acc.bucket(1)] <= HORIZON and acc.chance(1) == pytest.approx(0.5, abs=0.01)
    assert acc.hope(True) == acc.best()  # prompt lookup knows its signal before proposing
    draft = AcceptanceTable(CONFIDENCE_EDGES)  # a draft's tokens, each with its own confidence
    assert draft.hope(False) == 1.0  # nothing seen: anything may happen
    draft.observe([0.99, 0.6, 0.1, 0.9], 2)  # kept 0.99 and 0.6, rejected 0.1, 0.9 never judged
    assert draft.chance(0.97) == draft.chance(0.6) == pytest.approx(2 / 3)
    assert draft.chance(0.1) == pytest.approx(1 / 3) and draft.chance(0.9) == 0.5
    for _ in range(3):
        draft.observe([0.6, 0.6], 1)
    assert draft.hope(False) == draft.overall() < 1.0  # 9 trials seen: the overall chance


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
    """Before any proposing: could the most valuable row, proposing as well as the best ones do, save
    time at this width? At batch 1 verifying is almost free; at 64 rows it costs more than it saves,
    and a refusal there backs proposing off for a while, twice as long when it repeats. Speculating
    steps are measured apart from plain ones (a draft's forwards included)."""
    from worker.engine.speculation.controller import SKIP_FIRST, SpeculationController

    c = SpeculationController(adaptive=True)
    # measured: 1 row 1.0 ms, 5 rows 1.2 ms (small batch); 64 rows 10 ms, 320 rows 60 ms (large batch);
    # the 5 and 320 rows were verify steps
    for rows, ms in ((1, 1.0), (5, 1.2), (64, 10.0), (320, 60.0)):
        for _ in range(3):
            c.record(rows, ms / 1000, speculated=rows in (5, 320))
    assert c.could_pay(1, 0.9, 4, 1e-3)
    assert not c.could_pay(64, 0.9, 4, 10e-3 / 64)  # a row costs 0.195 ms, a token saves 0.9 x 0.156
    c.back_off(64)
    assert not c.should_propose(64) and c.should_propose(1)
    for _ in range(SKIP_FIRST):
        c.record(64, 0.01)
    assert c.should_propose(64)
    c.back_off(64)  # refused again: twice as long
    for _ in range(SKIP_FIRST):
        c.record(64, 0.01)
    assert not c.should_propose(64)
    for _ in range(SKIP_FIRST):
        c.record(64, 0.01)
    assert c.should_propose(64)
    assert SpeculationController(adaptive=False).could_pay(64, 0.0, 4, 0.0)
    draft = SpeculationController(adaptive=True)
    for _ in range(3):
        draft.record(1, 0.001)
        draft.record(5, 0.004, speculated=True)
    assert draft.cost(1) == 0.001 and draft.cost(5, speculated=True) == 0.004 and draft.cost(5) is None
    assert not draft.could_pay(1, 0.5, 4, 1e-3)  # 3 ms more for at most 0.94 ms saved


def test_steps_that_proposed_are_judged_by_what_they_saved() -> None:
    """settle: JUDGE_STEPS proposing steps at a width that lost time in sum (their host work included)
    back proposing off there; a width that saved clears its back-off."""
    from worker.engine.speculation.controller import JUDGE_STEPS, SpeculationController

    c = SpeculationController(adaptive=True)
    for _ in range(JUDGE_STEPS - 1):
        c.settle(8, -0.05)  # e.g. lookups that found nothing worth verifying: their host time lost
    assert c.should_propose(8)
    c.settle(8, 0.5)  # one good step does not make up for 31 bad ones
    assert not c.should_propose(8) and c.should_propose(1)
    c.steps += 100
    for _ in range(JUDGE_STEPS):
        c.settle(8, 0.2)
    assert c.should_propose(8) and 8 not in c._skip


def test_controller_keeps_its_costs_measured() -> None:
    """A width refused for STALE_FIRST steps speculates PROBE_RUN steps in a row to re-measure its cost
    (one speculating step among plain ones would run a draft model cold); a probe that ends refused
    doubles the wait; while speculation pays, every PROBE_PLAIN-th step runs plain unless a plain step
    of its width ran within PROBE_PLAIN steps."""
    from worker.engine.speculation.controller import (
        PROBE_PLAIN,
        PROBE_RUN,
        STALE_FIRST,
        SpeculationController,
    )

    c = SpeculationController(adaptive=True)
    for _ in range(3):
        c.record(1, 1e-3)
        c.record(5, 3e-3, speculated=True)
    assert c.allocate(1, [(0.5, 4)]) == [0]  # +0.5 ms a row for 0.5, 0.25, ... ms: refused
    for _ in range(STALE_FIRST + 1):
        c.record(1, 1e-3)  # plain steps only: the 5-row cost grows old
    got = []
    for _ in range(PROBE_RUN):
        got.append(c.allocate(1, [(0.5, 4)]))
        c.record(5, 1.2e-3, speculated=True)  # it costs less now
    assert got == [[4]] * PROBE_RUN
    assert c.allocate(1, [(0.5, 4)]) == [4]  # measured afresh: it pays
    slow = SpeculationController(adaptive=True)  # a probe that confirms the refusal doubles the wait
    for _ in range(3):
        slow.record(1, 1e-3)
        slow.record(5, 3e-3, speculated=True)
    waits, last = [], slow.steps
    for _ in range(300):
        if slow.allocate(1, [(0.5, 4)]) == [4]:
            waits.append(slow.steps - last)
            for _ in range(PROBE_RUN - 1):
                assert slow.allocate(1, [(0.5, 4)]) == [4]
                slow.record(5, 3e-3, speculated=True)
            slow.record(5, 3e-3, speculated=True)
            last = slow.steps
        else:
            slow.record(1, 1e-3)
    assert waits[:3] == [STALE_FIRST + 1, 2 * STALE_FIRST + 1, 4 * STALE_FIRST + 1]  # plain steps between probes
    wide = SpeculationController(adaptive=True)  # a probe proposes what the best chance (`hope`) would
    for _ in range(3):
        wide.record(64, 10e-3)
        wide.record(320, 60e-3, speculated=True)
    for _ in range(STALE_FIRST + 2):
        assert wide.allocate(64, [(0.5, 4)] * 64, None, hope=0.9) == [0] * 64  # 0.9 cannot pay here either
        wide.record(64, 10e-3)
    while c.steps % PROBE_PLAIN:
        c.record(1, 1e-3)  # plain steps (steps whose rows found nothing to propose) keep it measured
    assert c.allocate(1, [(0.5, 4)]) == [4]
    for _ in range(PROBE_PLAIN):
        c.record(5, 1.2e-3, speculated=True)
    assert c.allocate(1, [(0.5, 4)]) == [0]  # none for PROBE_PLAIN steps: a plain step now and then


def test_controller_allocates_k_where_the_rows_pay() -> None:
    """K per row from its acceptance chance and the value of its tokens against the measured cost of the
    rows: at a small batch a likely proposal gets its whole cap and an unlikely one nothing; where rows
    cost more than they save, nobody proposes; an unmeasured width is explored; not adaptive, every
    row gets its cap. With no request waiting only the rows with the most tokens left are worth more
    than the row they take."""
    from worker.engine.speculation.controller import SpeculationController

    c = SpeculationController(adaptive=True)
    assert c.allocate(1, [(0.9, 4)]) == [0]  # the plain step is measured first
    # 1 row 1.0 ms, +0.1 ms per row up to 8 rows; 64 rows 10 ms, 128 rows 30 ms; plain and verify alike
    for rows, ms in [(r, 1.0 + 0.1 * (r - 1)) for r in range(1, 9)] + [(64, 10.0), (128, 30.0)]:
        for _ in range(3):
            c.record(rows, ms / 1000)
            c.record(rows, ms / 1000, speculated=True)
    assert c.allocate(1, [(0.95, 7)]) == [7]
    assert c.allocate(1, [(0.05, 7)]) == [0]  # 5% for 0.1 ms of a 1 ms step
    assert c.allocate(2, [(0.95, 4), (0.05, 4)]) == [4, 0]
    assert c.allocate(1, [(0.4, 7)]) == [2]  # saves 0.56 - 0.2 ms; 1 token: 0.4 - 0.1, 3: 0.624 - 0.3
    assert c.allocate(64, [(0.9, 1)] * 64) == [0] * 64  # 30 ms for 121.6 tokens vs 10 ms for 64
    assert c.token_values(4, [1.0, 0.0], queued=True) == pytest.approx([1.3e-3 / 4] * 2)
    # none waiting: a row's token saves its row in a later step (0.1 ms); the leading row's also a
    # step's fixed cost (1.3 - 4 x 0.1 ms), for the part of its proposal within its lead
    assert c.token_values(4, [1.0, 0.0, 0.5], queued=False) == pytest.approx([1.0e-3, 0.1e-3, 0.55e-3])
    tail = c.token_values(8, [1.0] + [0.0] * 7, queued=False)
    assert c.allocate(8, [(0.9, 4)] * 8, tail) == [4] + [0] * 7
    fresh = SpeculationController(adaptive=True)
    for _ in range(3):
        fresh.record(1, 0.001)
        fresh.record(2, 0.0011)
    assert fresh.allocate(1, [(0.1, 4)]) == [4]  # 5 rows: more than twice the widest measured, explored
    assert SpeculationController(adaptive=False).allocate(64, [(0.0, 3), (0.1, 2)]) == [3, 2]
    for ctrl in (c, fresh):  # one estimate, scalar or vectorized: measured, between, below, past the widest
        for side in (False, True):
            want = [ctrl.cost(r, side) for r in range(1, 300)]
            got = ctrl.costs(1, 299, side).tolist()
            assert [None if g != g else pytest.approx(g) for g in got] == want


def test_a_probe_of_full_proposals_does_not_price_one_token_as_k() -> None:
    """Only full proposals measured (a probe: K = 8, 9 rows, a draft's eight forwards included):
    narrower speculating steps are interpolated from the plain step, so a short proposal that pays
    is taken (and then measured) instead of every K being priced as the widest and refused."""
    from worker.engine.speculation.controller import SpeculationController

    c = SpeculationController(adaptive=True)
    for _ in range(3):
        c.record(1, 2.7e-3)
        c.record(9, 9.0e-3, speculated=True)
    assert c.allocate(1, [(0.65, 8)]) == [2]  # 1.76 + 1.14 ms saved for 2 x 0.79 ms; a third: +0.74 for 0.79
    assert not any(c.allocate(1, [(0.1, 8)]))  # 0.27 ms saved for 0.79 ms
    for _ in range(3):
        c.record(3, 6.5e-3, speculated=True)  # measured dear: the estimate gives way to it
    assert c.allocate(1, [(0.65, 8)]) == [0]  # 2 rows now 4.6 ms (halfway to 3 rows' 6.5): 1.76 saved


def test_a_draft_stops_where_its_next_token_no_longer_pays() -> None:
    """The draft's early stop: a row drafts another token while the chance that all its tokens so far
    are kept (by the draft's probability of each) times the draft's overall chance for the next, times
    what a token saves, beats a drafted token's cost (the slope of the measured speculating steps)."""
    from types import SimpleNamespace

    from worker.engine.speculation.speculator import Speculator

    draft = SimpleNamespace(rollback=lambda seq, kept: None)
    sp = Speculator(SpeculativeConfig("draft", 4, "draft"), SimpleNamespace(), draft)  # type: ignore[arg-type]
    assert sp._go_on(1, [1e-3], 4) is None  # nothing measured: every token up to K
    for _ in range(3):  # plain 1 ms; speculating steps 1.6 ms + 0.3 ms per row past 2 rows
        sp.controller.record(1, 0.001)
        for rows in range(2, 6):
            sp.controller.record(rows, 0.0016 + 0.0003 * (rows - 2), speculated=True)
    sp.acceptance.observe([0.99] * 9, 9)  # confident tokens: kept (p = 10 / 11)
    sp.acceptance.observe([0.1], 0)  # an unsure one: rejected (p = 1 / 3)
    overall = sp.acceptance.overall()
    assert overall == pytest.approx(15 / 22)  # the priors' 6 hits in 12 trials, 9 in 10 more
    go_on = sp._go_on(1, [1e-3], 4)
    assert go_on is not None
    assert go_on(0, [0.99]) and go_on(0, [0.99, 0.98])  # (10/11)^2 x 0.68 x 1 ms > 0.3 ms
    assert not go_on(0, [0.99, 0.1])  # 10/11 x 1/3 x 0.68 x 1 ms < 0.3 ms
    always = Speculator(SpeculativeConfig("draft", 4, "draft", adaptive=False), SimpleNamespace(), draft)  # type: ignore[arg-type]
    always.controller.seconds = sp.controller.seconds
    assert always._go_on(1, [1e-3], 4) is None  # not adaptive: every token up to K


def test_measured_costs_out_of_order_are_made_monotone() -> None:
    """Each rows bucket's median is measured apart (other steps, other contexts): neighbours can read
    out of order, a rare width dear between two common cheap ones. A step of more rows never costs
    less, so the controller prices the pooled, non-decreasing fit (weighted by samples), and the
    prices it caches follow a measured cost that changes."""
    from worker.engine.speculation.controller import WINDOW, SpeculationController, monotone

    assert monotone([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]
    assert monotone([1.0, 3.0, 2.0]) == [1.0, 2.5, 2.5]
    assert monotone([1.0, 1.7, 1.1, 1.2], [9, 1, 9, 9]) == pytest.approx([1.0, 1.16, 1.16, 1.2])
    assert monotone([]) == []
    c = SpeculationController(adaptive=True)
    for _ in range(WINDOW):
        c.record(1, 1.0e-3)
        c.record(2, 1.05e-3, speculated=True)
        c.record(5, 1.12e-3, speculated=True)
    for _ in range(2):
        c.record(3, 1.7e-3, speculated=True)  # a rare width, two slow samples
    assert c.table(True)[3] == pytest.approx(1.7e-3)  # the measured table stays as measured
    assert c.cost(3, True) == c.cost(5, True) == pytest.approx((2 * 1.7 + 9 * 1.12) / 11 * 1e-3)  # pooled
    # a row 2 tokens from its limit takes both: 0.6 + 0.36 ms saved for 0.23 ms (the raw 3-row
    # reading, 0.7 ms, would have cut it to one)
    assert c.allocate(1, [(0.6, 2)]) == [2]
    assert c.allocate(1, [(0.9, 4)]) == [4]
    for _ in range(WINDOW):
        c.record(5, 4.0e-3, speculated=True)  # the verify step got dear: the cached prices follow
    assert c.allocate(1, [(0.9, 4)]) == [2]  # 1.71 - 0.7 ms; three tokens: 2.44 - 1.85, four: 3.10 - 3.0


def test_measured_verify_rows_are_not_priced_as_other_sequences_rows() -> None:
    """Verify rows of one sequence share its host work: 5 of them cost less than a plain step of 5
    sequences (tails of larger batches measure those). A measured speculating width stands as
    measured; only an estimated one is floored by the plain step of as many rows."""
    from worker.engine.speculation.controller import WINDOW, SpeculationController

    c = SpeculationController(adaptive=True)
    for _ in range(WINDOW):
        c.record(1, 0.90e-3)
        c.record(4, 1.20e-3)
        c.record(5, 1.33e-3)  # plain steps of 4 and 5 sequences
        for rows in (2, 3, 4, 5):
            c.record(rows, (1.0 + 0.02 * rows) * 1e-3, speculated=True)
    # the 4th token of a short match (0.44 x 0.49 x 0.63 x 0.78 kept) saves 0.095 ms for 0.02 ms
    assert c.allocate(1, [((0.44, 0.49, 0.63, 0.78), 4)]) == [4]
    est = SpeculationController(adaptive=True)  # 2 and 8 verify rows measured: between, floored
    for _ in range(WINDOW):
        est.record(1, 0.90e-3)
        est.record(5, 1.33e-3)
        est.record(2, 1.0e-3, speculated=True)
        est.record(8, 1.3e-3, speculated=True)
    assert est.cost(5, True) == pytest.approx(1.15e-3)
    assert est._price(1, est.cost(1), 4)[3] == pytest.approx(1.33e-3)
    # a chance per token: the j-th token counts with the product of the first j
    assert est.allocate(1, [((0.9, 0.1, 0.9, 0.9), 4)]) == [1]
