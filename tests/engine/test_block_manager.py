"""BlockManager and Scheduler invariants, pure Python (no model)."""

from __future__ import annotations

import numpy as np
import pytest

from contracts.sampling import SamplingParams
from worker.engine.batch_state import PersistentBatch
from worker.engine.block_manager import BlockManager, chain_hashes, root_hash, salt_key
from worker.engine.config import EngineConfig
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import Sequence

BS = 4


def _seq(i: int, tokens: list[int], **params: object) -> Sequence:
    return Sequence(i, i, tokens, SamplingParams(**params), seed=i)


def _scheduler(cfg: EngineConfig, bm: BlockManager, max_model_len: int = 64) -> Scheduler:
    batch = PersistentBatch(cfg.max_num_seqs, max_model_len // BS, BS, frozenset({2}))
    return Scheduler(cfg, bm, batch, max_model_len)


def _deliver(sched: Scheduler, out, token: int = 1) -> None:
    """The step ran: its sampled rows get `token` (what the engine's StepOutputs does)."""
    rows = np.concatenate([np.array([c.seq.row for c in out.chunks if c.samples], np.int64), out.decode_rows])
    sched.batch.append_tokens(rows, [token] * rows.size)


def _admit(bm: BlockManager, seq: Sequence) -> None:
    matched, hashes = bm.match_prefix(seq)
    assert bm.can_allocate(seq, matched)
    bm.allocate(seq, matched, hashes)
    seq.num_computed_tokens = seq.num_tokens  # pretend the whole prompt ran
    bm.commit_computed(seq, seq.num_tokens)


def test_prefix_hits_refcounts_and_no_leaks() -> None:
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    a = _seq(0, list(range(10)))  # 2 full blocks + 2 tokens
    _admit(bm, a)
    assert len(a.block_table) == 3 and bm.num_free_blocks == 13
    b = _seq(1, list(range(8)) + [99, 98, 97])
    matched, _ = bm.match_prefix(b)
    assert matched == a.block_table[:2]
    _admit(bm, b)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [bm.ref_counts[x] for x in b.block_table] == [2, 2, 1]
    bm.check_invariants([a, b])
    bm.free(a)
    bm.free(b)
    bm.check_invariants([])
    assert bm.num_free_blocks == 16
    assert len(bm.evictable) == 2  # the two full prefix blocks stay cached, unreferenced


def _salted(i: int, tokens: list[int], salt: str | None) -> Sequence:
    seq = _seq(i, tokens)
    seq.cache_salt = salt_key(salt) if salt is not None else 0
    return seq


def test_cache_salts_keep_prefixes_apart() -> None:
    """Blocks of one salt are reused by that salt's sequences only; unsalted ones share as before."""
    bm = BlockManager(32, BS, enable_prefix_caching=True)
    tokens = list(range(10))  # 2 full blocks
    a = _salted(0, tokens, "team-a")
    _admit(bm, a)
    assert bm.match_prefix(_salted(1, tokens, "team-b"))[0] == []
    assert bm.match_prefix(_salted(2, tokens, None))[0] == []
    assert bm.match_prefix(_salted(3, tokens, "team-a"))[0] == a.block_table[:2]
    plain = _salted(4, tokens, None)
    _admit(bm, plain)
    assert not set(plain.block_table) & set(a.block_table)
    assert bm.match_prefix(_salted(5, tokens, None))[0] == plain.block_table[:2]
    assert root_hash(plain) == root_hash(_seq(6, tokens)) and root_hash(a) != root_hash(plain)
    bm.check_invariants([a, plain])
    assert salt_key("team-a") == 0x663E3517B823368D  # blake2b's: every process's (a str's hash is not)


def test_fully_cached_prompt_recomputes_last_token_without_writing() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    _admit(bm, _seq(0, list(range(8))))
    again = _seq(1, list(range(8)))
    matched, hashes = bm.match_prefix(again)
    bm.allocate(again, matched, hashes)
    assert again.num_computed_tokens == 7 and again.protected_len == 8  # slot of token 7 is -1


def test_lru_eviction_reclaims_oldest_leaf_first() -> None:
    bm = BlockManager(4, BS, enable_prefix_caching=True)
    old, new = _seq(0, list(range(8))), _seq(1, list(range(100, 108)))
    _admit(bm, old)
    old_blocks = list(old.block_table)
    bm.free(old)
    _admit(bm, new)
    bm.free(new)
    assert bm.num_free_blocks == 4 and len(bm.hash_to_block) == 4
    third = _seq(2, list(range(200, 204)))
    _admit(bm, third)  # needs one block: evicts `old`'s leaf (released first, leaves before parents)
    assert third.block_table == [old_blocks[1]]
    assert bm.match_prefix(_seq(3, list(range(8))))[0] == old_blocks[:1]
    assert len(bm.match_prefix(_seq(4, list(range(100, 108))))[0]) == 2  # the newer prefix survived
    bm.check_invariants([third])


def test_pending_prefix_defers_admission_until_computed() -> None:
    cfg = EngineConfig(max_num_batched_tokens=8, max_num_seqs=4)
    bm = BlockManager(32, BS, enable_prefix_caching=True)
    sched = _scheduler(cfg, bm)
    prefix = list(range(1, 17))
    a, b = _seq(0, prefix + [50]), _seq(1, prefix + [60])
    sched.add(a)
    sched.add(b)
    first = sched.schedule()
    assert [c.seq for c in first.chunks] == [a]  # b waits: its prefix is being computed by a
    second = sched.schedule()
    assert [c.seq.seq_id for c in second.chunks] == [0]
    third = sched.schedule()
    by_seq = {c.seq.seq_id: c for c in third.chunks}
    assert by_seq[1].start == 16 and b.num_cached_tokens == 16  # b reused a's 4 blocks
    bm.check_invariants([a, b])


def test_scheduler_errors_a_prompt_larger_than_the_cache() -> None:
    bm = BlockManager(4, BS, enable_prefix_caching=False)
    sched = _scheduler(EngineConfig(max_num_batched_tokens=64), bm)
    big, small = _seq(0, list(range(40))), _seq(1, list(range(5)))
    sched.add(big)
    sched.add(small)
    out = sched.schedule()
    assert out.errored == [big] and big.finish_reason == "error" and "KV blocks" in big.error
    assert [c.seq for c in out.chunks] == [small]
    bm.check_invariants([small])


def test_preemption_frees_and_requeues_the_newest() -> None:
    bm = BlockManager(4, BS, enable_prefix_caching=False)
    sched = _scheduler(EngineConfig(max_num_batched_tokens=64, max_num_seqs=4), bm)
    a, b = _seq(0, list(range(7))), _seq(1, list(range(7)))
    sched.add(a)
    sched.add(b)
    _deliver(sched, sched.schedule())  # both admitted: 2 blocks each, cache full; sampled token 7
    out = sched.schedule()  # position 7 still fits in block 2
    assert out.decode_rows.tolist() == [a.row, b.row] and out.decode_positions.tolist() == [7, 7]
    _deliver(sched, out)  # position 8 needs a third block each
    out = sched.schedule()
    assert out.num_preempted == 1 and sched.waiting[0] is b and b.num_computed_tokens == 0
    assert out.decode_rows.tolist() == [a.row] and not out.chunks and b.row == -1
    bm.check_invariants([a])
    for s in sched.abort_all():
        assert s.finish_reason == "cancelled"
    bm.check_invariants([])


def test_chain_hashes_depend_on_the_whole_prefix() -> None:
    x = chain_hashes([1, 2, 3, 4, 5, 6, 7, 8], BS)
    y = chain_hashes([9, 2, 3, 4, 5, 6, 7, 8], BS)
    assert len(x) == 2 and x[1] != y[1]
    assert chain_hashes([1, 2, 3], BS) == []


def test_sampling_params_validation() -> None:
    for bad in ({"max_tokens": 0}, {"max_tokens": -1}, {"temperature": -1.0}, {"top_p": 0.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)


def test_window_releases_blocks_and_keeps_them_in_the_prefix_cache() -> None:
    """A window of 6 tokens over 4-token blocks: positions >= p - 5 are read from p on. Blocks the
    window left are released (hashed: evictable, reusable by a later prefix hit); a hit's blocks
    wholly behind its window enter the table unheld; invariants hold throughout."""
    bm = BlockManager(16, BS, enable_prefix_caching=True, window=6)
    tokens = list(range(10, 30))  # 20 tokens = 5 full blocks
    a = _seq(0, tokens)
    _admit(bm, a)
    assert bm.held(a) == 5 and not bm.release_behind(a, 8)  # position 8 reads 3..8: block 0 (0..3) still
    assert bm.release_behind(a, 9) and a.num_released == 1  # position 9 reads 4..9
    assert bm.release_behind(a, 14) and a.num_released == 2 and bm.held(a) == 3  # reads 9..14
    bm.check_invariants([a])
    released = a.block_table[:2]
    assert all(bm.ref_counts[b] == 0 and b in bm.evictable for b in released)
    b = _seq(1, tokens + [99])  # same 20-token prefix: hit of 5 blocks, computing from position 20
    matched, hashes = bm.match_prefix(b)
    assert matched == a.block_table  # the released blocks are still cached
    assert bm.can_allocate(b, matched, num_tokens=21)
    bm.allocate(b, matched, hashes, num_tokens=21)
    assert b.num_computed_tokens == 20 and b.num_released == bm.behind(20) == 3  # reads 15..20
    assert bm.held(b) == 3  # blocks 3, 4 of the hit and the fresh block 5
    bm.check_invariants([a, b])
    bm.free(a)
    bm.free(b)
    bm.check_invariants([])
    assert bm.blocks_needed(1000, chunk=8) == -(-(6 - 1 + 8) // BS) + 1 and bm.blocks_needed(5, 8) == 2
