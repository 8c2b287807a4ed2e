"""Two KV cache groups (worker/engine/kv_groups.py) on the models mixing local and global layers
(Gemma 2, Gemma 3, gpt-oss; 32-token windows on tiny random checkpoints): transformers' greedy tokens
on prompts up to ~10 windows long while, at every step, each sequence's local blocks stay within the
window's bound and its global blocks cover its whole context; with prefix caching on and off, chunked
prefill, preemption, overlapped static decode, n > 1 and speculative decoding; a prefix hit cut where
the local pool lost a block; and the same KV budget serving a longer context than one shared pool."""

from __future__ import annotations

import dataclasses
import random

import pytest
from engine_oracle import MAX_NEW, VOCAB, hf_greedy, mixed_prompts

from contracts.sampling import SamplingParams as Params
from worker.engine import Engine, EngineConfig, SamplingParams
from worker.engine.kv_groups import GroupedBlockManager
from worker.engine.sequence import Sequence
from worker.engine.speculation.config import SpeculativeConfig

GREEDY = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
WINDOW = 32
LAYER_BLOCK = 2 * 2 * 16 * 16 * 4  # one layer's k + v of a 16-token block: 2 kv heads x 16 dims, fp32
GROUPED = {"gemma2": {}, "gemma3_text": {}, "gpt_oss": {"sliding_window": WINDOW}}
CONFIGS = {
    "prefix-cache": {"max_num_batched_tokens": 48, "max_num_seqs": 4},
    "chunked-no-cache": {"enable_prefix_caching": False, "max_num_batched_tokens": 24, "max_num_seqs": 3},
    # 28 blocks of each pool (one shared pool would have had 28 too): the 300-token prompt needs 20
    "preemption": {"kv_cache_bytes": 28 * 2 * LAYER_BLOCK, "max_num_batched_tokens": 48, "max_num_seqs": 6},
    "overlap-static": {"static_decode": True, "overlap_steps": True, "max_num_batched_tokens": 40},
}


def _watch(engine: Engine) -> list[int]:
    """After every schedule(): both groups' bookkeeping checked against the running sequences, each
    one's global table covering its context with nothing released; returns the per-step peaks of
    local blocks held by one sequence."""
    scheduler, bm = engine.scheduler, engine.block_manager
    assert isinstance(bm, GroupedBlockManager)
    schedule = scheduler.schedule
    peaks: list[int] = []

    def watched(*args):
        out = schedule(*args)
        running = scheduler.running
        bm.check_invariants(running)
        for s in running:
            assert s.num_released == 0 and len(s.block_table) * bm.block_size >= s.num_computed_tokens
            assert bm.full.held(s) == len(s.block_table)
            engine.batch.check_row(s)
        peaks.append(max((bm.local.held(s.local) for s in running), default=0))
        return out

    scheduler.schedule = watched
    return peaks


@pytest.mark.parametrize(
    ("arch", "config"),
    [pytest.param(arch, config, id=f"{arch}-{name}") for arch in GROUPED for name, config in CONFIGS.items()
     if not (arch == "gpt_oss" and "static_decode" in config)],  # MoE layers decode eagerly
)  # fmt: skip
def test_grouped_matches_transformers_with_bounded_local_blocks(make_checkpoint, expected, arch: str,
                                                                config: dict) -> None:  # fmt: skip
    overrides = GROUPED[arch]
    engine = Engine.from_pretrained(make_checkpoint(arch, **overrides).path,
                                    EngineConfig(**{"kv_cache_bytes": 8 << 20, **config}))  # fmt: skip
    peaks = _watch(engine)
    outs = engine.generate(mixed_prompts(), GREEDY)
    assert [o.error for o in outs] == [None] * len(outs)
    assert [o.token_ids for o in outs] == expected(arch, **overrides)
    bm = engine.block_manager
    bm.check_invariants([])
    assert bm.local.window == WINDOW and bm.full.window is None
    chunk = engine.config.max_num_batched_tokens
    bound = bm.local.blocks_needed(10**6, chunk)  # the window behind a chunk and the chunk's own
    longest = max(len(p) for p in mixed_prompts()) + MAX_NEW
    assert bound < bm.blocks_for(longest) and max(peaks) <= bound, (max(peaks), bound)
    if "kv_cache_bytes" in config:
        assert engine.stats.preemptions > 0 and bm.num_blocks == bm.local.num_blocks == 28
    if config.get("enable_prefix_caching") is False:
        assert engine.stats.cached_tokens == 0
    elif "static_decode" not in config:
        assert engine.stats.cached_tokens > 0


def test_grouped_forked_choices_equal_their_single_runs(make_checkpoint) -> None:
    """n = 3 choices fork from one prefill, sharing both groups' blocks (the partial last one copied
    on write in each pool), then release their local blocks independently."""
    ckpt = make_checkpoint("gemma2")
    prompt = random.Random(7).choices(range(3, VOCAB), k=150)  # 9 blocks + 6 tokens
    sampled = SamplingParams(max_tokens=40, temperature=1.0, seed=5, ignore_eos=True)
    engine = Engine.from_pretrained(ckpt.path, EngineConfig(kv_cache_bytes=8 << 20))
    peaks = _watch(engine)
    out = engine.generate([prompt], dataclasses.replace(sampled, n=3))[0]
    engine.block_manager.check_invariants([])
    assert peaks[0] == 10 and max(peaks[1:]) <= engine.block_manager.local.blocks_needed(10**6, 1) == 3
    alone = [engine.generate([prompt], dataclasses.replace(sampled, seed=5 + i))[0].token_ids for i in range(3)]
    assert [o.token_ids for o in out.outputs] == alone and len({tuple(t) for t in alone}) == 3
    greedy = engine.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True, n=2))[0]
    assert [o.token_ids for o in greedy.outputs] == [hf_greedy(ckpt.model, prompt, 12)] * 2


@pytest.mark.parametrize("arch", list(GROUPED))
def test_grouped_speculation_identical_to_plain(make_checkpoint, arch: str) -> None:
    """n-gram speculation (verify rows appended to both groups' tables, rejected tokens' blocks given
    back in both) on prompts that repeat spans many windows long."""
    path = make_checkpoint(arch, **GROUPED[arch]).path
    rng = random.Random(5)
    spans = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (7, 13, 29)]
    prompts = [s * (200 // len(s)) for s in spans] + mixed_prompts()[3:6]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    runs = []
    for spec in (None, SpeculativeConfig("ngram", 4, adaptive=False)):
        engine = Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=8 << 20, max_num_batched_tokens=64,
                                                           speculative=spec))  # fmt: skip
        peaks = _watch(engine)
        runs.append([o.token_ids for o in engine.generate(prompts, params)])
        engine.block_manager.check_invariants([])
        assert max(peaks) <= engine.block_manager.local.blocks_needed(10**6, 64)
    assert runs[0] == runs[1]
    assert engine.stats.spec_runs > 0 and 0 < engine.stats.spec_accepted_tokens < engine.stats.spec_proposed_tokens


def test_gemma3_same_budget_serves_a_longer_context(make_checkpoint) -> None:
    """Gemma 3's 5 local : 1 global layers, 40 blocks' worth of one shared pool (40 x 6 layers): the
    local pool takes what 2 sequences can hold under the window, the global pool the rest, so a
    prompt longer than 40 blocks (one shared pool's whole capacity) runs, with transformers' tokens."""
    layers = ["sliding_attention"] * 5 + ["full_attention"]
    ckpt = make_checkpoint("gemma3_text", num_hidden_layers=6, layer_types=layers)
    budget = 40 * 6 * LAYER_BLOCK
    engine = Engine.from_pretrained(ckpt.path, EngineConfig(kv_cache_bytes=budget, max_num_seqs=2,
                                                            max_num_batched_tokens=32))  # fmt: skip
    bm = engine.block_manager
    local_need = bm.local.blocks_needed(10**6, 32)  # 5 blocks: 31 keys behind a 32-token chunk
    assert bm.local.num_blocks == 2 * local_need + 1 == 11
    # the rest (185 blocks) capped at what 2 sequences of max_model_len tokens can use: vs 40 in one pool
    rest = (budget - 11 * 5 * LAYER_BLOCK) // LAYER_BLOCK
    assert bm.num_blocks == min(rest, 2 * bm.blocks_for(engine.max_model_len) + 1) > 40
    prompt = random.Random(11).choices(range(3, VOCAB), k=900)  # 57 blocks
    peaks = _watch(engine)
    out = engine.generate([prompt], SamplingParams(max_tokens=6, ignore_eos=True))[0]
    assert out.error is None and out.token_ids == hf_greedy(ckpt.model, prompt, 6)
    assert max(peaks) <= local_need and bm.blocks_for(906) > 40


def test_grouped_on_the_triton_backend_interpreted(make_checkpoint, monkeypatch) -> None:
    """The Triton kernels (interpreter mode) read each layer's group tables through the same seam:
    prefill chunks past the window, a prefix hit, padded static decode."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ckpt = make_checkpoint("gemma2")
    rng = random.Random(1)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (90, 40)]
    prompts.append(prompts[0][:64] + [5, 6, 7])
    engine = Engine.from_pretrained(ckpt.path, EngineConfig(kv_cache_bytes=8 << 20, backend="triton", static_decode=True,
                                                            max_num_batched_tokens=48, max_num_seqs=4))  # fmt: skip
    outs = engine.generate(prompts, SamplingParams(max_tokens=5, ignore_eos=True))
    assert [o.token_ids for o in outs] == [hf_greedy(ckpt.model, p, 5) for p in prompts]
    assert engine.stats.cached_tokens > 0
    engine.block_manager.check_invariants([])


def _seq(i: int, tokens: list[int]) -> Sequence:
    return Sequence(i, i, tokens, Params(max_tokens=4), 0)


def _run_prefill(bm: GroupedBlockManager, seq: Sequence, chunk: int) -> None:
    """Prefill seq chunk by chunk as the scheduler does: release behind, grow, compute, commit."""
    m, h = bm.match_prefix(seq)
    bm.allocate(seq, m, h, min(seq.num_tokens, seq.num_computed_tokens + chunk))
    while seq.num_computed_tokens < seq.num_tokens:
        bm.release_behind(seq, seq.num_computed_tokens)
        end = min(seq.num_tokens, seq.num_computed_tokens + chunk)
        assert bm.append_slots(seq, end)
        seq.num_computed_tokens = end
        bm.commit_computed(seq, end)
        bm.check_invariants([seq])


def test_prefix_hit_is_cut_where_the_local_pool_lost_a_block() -> None:
    bm = GroupedBlockManager(num_blocks=16, num_local_blocks=6, block_size=4, enable_prefix_caching=True, window=4)
    tokens = list(range(100, 124))  # 6 full blocks
    a = _seq(0, tokens)
    _run_prefill(bm, a, 4)
    assert bm.local.held(a.local) <= 2 and bm.full.held(a) == 6
    bm.free(a)
    # local blocks went evictable as released (blocks 0-3), the rest at free leaf-first (5, 4)
    c = _seq(1, tokens + [1, 2])
    m, _ = bm.match_prefix(c)
    assert len(m) == 6 and m.local[:5] == [0] * 5  # the hit's window needs only block 5's local copy
    b = _seq(2, list(range(500, 520)))  # 5 fresh local blocks: evicts a's 0-3 and 5 (least recent first)
    _run_prefill(bm, b, 20)
    bm.free(b)
    m, h = bm.match_prefix(c)
    assert len(m) == 5 and m.local[4] == bm.local.hash_to_block[h[4]]  # cut before the lost block 5
    bm.allocate(c, m, h)
    assert c.num_computed_tokens == 20 and c.local.num_released == 4 and c.local.block_hashes == h[:5]
    bm.check_invariants([c])
    bm.free(c)
    bm.check_invariants([])


def test_both_groups_keep_cache_salts_apart() -> None:
    """The local group's hashes are rooted in the sequence's salt as group 0's are."""
    from worker.engine.block_manager import salt_key

    bm = GroupedBlockManager(num_blocks=16, num_local_blocks=16, block_size=4, enable_prefix_caching=True, window=8)
    tokens = list(range(100, 112))  # 3 full blocks
    a = _seq(0, tokens)
    a.cache_salt = salt_key("team-a")
    _run_prefill(bm, a, 12)
    other, same = _seq(1, tokens + [1]), _seq(2, tokens + [1])
    other.cache_salt, same.cache_salt = salt_key("team-b"), a.cache_salt
    assert bm.match_prefix(other)[0] == []
    m, h = bm.match_prefix(same)
    assert len(m) == 3 and h == a.block_hashes and h[:1] == a.local.block_hashes[:1]
    bm.free(a)
    bm.check_invariants([])


def test_scheduler_refuses_what_the_local_pool_never_holds() -> None:
    """Group 0's pool holds the 20-token prompt (6 blocks of 16); the local pool's 2 blocks never hold
    the window behind its chunk (6 blocks): refused at once, not left waiting for blocks forever."""
    from worker.engine.batch_state import PersistentBatch
    from worker.engine.scheduler import Scheduler

    bm = GroupedBlockManager(num_blocks=16, num_local_blocks=2, block_size=4, enable_prefix_caching=True, window=8)
    sched = Scheduler(EngineConfig(max_num_batched_tokens=64, max_num_seqs=4), bm,
                      PersistentBatch(4, 16, 4, frozenset({2}), grouped=True), 64)  # fmt: skip
    big, small = _seq(0, list(range(100, 120))), _seq(1, list(range(100, 106)))
    sched.add(big)
    sched.add(small)
    out = sched.schedule()
    assert out.errored == [big] and big.finish_reason == "error"
    assert big.error == "needs 6 KV blocks; the sliding-window layers' cache holds 2; raise kv_cache_bytes or shorten the prompt"
    assert [c.seq for c in out.chunks] == [small]  # 2 blocks in each pool
    bm.check_invariants([small])


def test_engine_refuses_per_row_what_the_local_pool_never_holds(make_checkpoint, tmp_path, monkeypatch) -> None:
    """An engine whose local pool is smaller than kv_pool_sizes makes it (3 blocks; a 32-token window
    behind a 32-token chunk spans 4 to 5 of 16 tokens): generate and embed fail the long prompt alone
    (before, generate waited forever for a fourth local block) and run the short one (3 blocks)."""
    from test_embeddings import embedding_checkpoint

    import worker.engine.engine_build as engine_module

    sizes = engine_module.kv_pool_sizes
    monkeypatch.setattr(engine_module, "kv_pool_sizes", lambda *args: (sizes(*args)[0], 3))
    path, model = embedding_checkpoint(make_checkpoint, tmp_path, "gemma3_text", "mean", True)
    engine = Engine.from_pretrained(path, EngineConfig(max_num_batched_tokens=32, max_num_seqs=2))
    assert engine.block_manager.local.num_blocks == 3
    long, short = list(range(3, 103)), list(range(3, 40))
    outs = engine.generate([long, short], SamplingParams(max_tokens=4, ignore_eos=True))
    assert "needs 5 KV blocks; the sliding-window layers' cache holds 3" in outs[0].error
    assert outs[1].error is None and outs[1].token_ids == hf_greedy(model, short, 4)
    embeds = engine.embed([long, short])
    assert "100 tokens and needs 5 KV blocks; the sliding-window layers' cache holds 3" in embeds[0].error
    assert embeds[1].error is None and embeds[1].embedding is not None
    engine.block_manager.check_invariants([])


def test_copy_on_write_copies_in_both_groups_or_neither() -> None:
    bm = GroupedBlockManager(num_blocks=8, num_local_blocks=3, block_size=4, enable_prefix_caching=False, window=4)
    parent, child, other = _seq(0, list(range(100, 106))), _seq(1, list(range(100, 106))), _seq(2, [5, 6, 7])
    for seq in (parent, other):  # 2 + 1 blocks in each pool: the local pool is full
        bm.allocate(seq, [], [])
    bm.fork(parent, child)
    tables = (list(child.block_table), list(child.local.block_table))
    assert bm.copy_on_write(child, 1) is None  # group 0 has free blocks, group 1 none: nothing changes
    assert (child.block_table, child.local.block_table) == tables and bm.full.num_free_blocks == 5
    bm.free(other)
    copies = bm.copy_on_write(child, 1)
    assert copies == [(0, tables[0][1], child.block_table[1]), (1, tables[1][1], child.local.block_table[1])]
    assert child.block_table[1] != tables[0][1] and child.local.block_table[1] != tables[1][1]
    assert bm.copy_on_write(child, 1) == []  # its own now, in both
    bm.check_invariants([parent, child])
