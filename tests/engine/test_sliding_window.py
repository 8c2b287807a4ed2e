"""Real sliding windows against transformers (fp32, tiny random checkpoints): a model whose every
layer has a window (Mistral; Gemma 3 configured with local layers only) serves prompts many windows
long with bounded KV blocks (released as the window leaves them), and gives transformers' greedy
tokens with prefix caching on and off, chunked prefill and preemption. Models mixing local and
global layers (two KV cache groups): tests/engine/test_kv_groups.py."""

from __future__ import annotations

import random

import pytest
from engine_oracle import MAX_NEW, VOCAB, hf_greedy, hf_prompt_logprobs, mixed_prompts

from worker.engine import Engine, EngineConfig, SamplingParams

GREEDY = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
WINDOW = 32  # two 16-token blocks: mixed_prompts() runs up to ~10 windows
# 2 layers x 2 kv heads x 16 dims x 2 (k, v) x 4 bytes x 16 tokens = 8 KiB per block
BLOCK_BYTES = 8192


def _watch_blocks(engine: Engine) -> list[int]:
    """Record, after every schedule(), the most blocks any running sequence holds."""
    peaks: list[int] = []
    scheduler, bm = engine.scheduler, engine.block_manager
    schedule = scheduler.schedule

    def watched(*args):
        out = schedule(*args)
        peaks.append(max((bm.held(s) for s in scheduler.running), default=0))
        return out

    scheduler.schedule = watched
    return peaks


def _generate(path, prompts, **config: object) -> tuple[list[list[int]], Engine]:
    engine = Engine.from_pretrained(path, EngineConfig(**{"kv_cache_bytes": 8 << 20, **config}))
    outs = engine.generate(prompts, GREEDY)
    assert all(o.finish_reason == "length" and o.error is None for o in outs), [o.error for o in outs]
    engine.block_manager.check_invariants([])
    return [o.token_ids for o in outs], engine


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"enable_prefix_caching": False, "max_num_batched_tokens": 24, "max_num_seqs": 3},
        {"static_decode": True, "overlap_steps": True, "max_num_batched_tokens": 40},
    ],
    ids=["prefix-cache", "chunked-no-cache", "overlap-static"],
)
def test_mistral_window_matches_transformers(make_checkpoint, expected, config: dict) -> None:
    ckpt = make_checkpoint("mistral", sliding_window=WINDOW)
    got, engine = _generate(ckpt.path, mixed_prompts(), **config)
    assert got == expected("mistral", sliding_window=WINDOW)
    assert engine.block_manager.window == WINDOW and engine.max_model_len == 1024  # the window caps nothing
    if "enable_prefix_caching" in config:
        assert engine.stats.cached_tokens == 0
    else:
        assert engine.stats.cached_tokens > 0


@pytest.mark.parametrize(
    ("arch", "overrides"),
    [("mistral", {"sliding_window": WINDOW}), ("gemma3_text", {"layer_types": ["sliding_attention"] * 2})],
)
def test_window_bounded_blocks_under_preemption(make_checkpoint, arch: str, overrides: dict) -> None:
    """Prompts 6-15 windows long through a cache of 10 blocks (a 300-token prompt alone needs 19
    without the window): transformers' tokens, every sequence holding at most the window's bound
    at every step, and preemption under the pressure. Gemma 3 with only local layers is bounded too."""
    ckpt = make_checkpoint(arch, **overrides)
    rng = random.Random(3)
    shared = [rng.randrange(3, VOCAB) for _ in range(120)]
    prompts = [(shared if i % 2 else []) + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(80, 360))]
               for i in range(6)]  # fmt: skip
    chunk = 48
    engine = Engine.from_pretrained(
        ckpt.path,
        EngineConfig(kv_cache_bytes=10 * BLOCK_BYTES, max_num_seqs=6, max_num_batched_tokens=chunk),
    )
    peaks = _watch_blocks(engine)
    outs = engine.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    assert [o.error for o in outs] == [None] * len(prompts)
    assert [o.token_ids for o in outs] == [hf_greedy(ckpt.model, p, 12) for p in prompts]
    bound = -(-(WINDOW - 1 + chunk) // 16) + 1  # BlockManager.blocks_needed: 6 blocks = 96 tokens
    assert max(len(p) for p in prompts) > 10 * WINDOW and max(peaks) <= bound
    assert engine.block_manager.num_blocks == 10 and engine.stats.preemptions > 0
    engine.block_manager.check_invariants([])


def test_mistral_window_prompt_logprobs(make_checkpoint) -> None:
    ckpt = make_checkpoint("mistral", sliding_window=WINDOW)
    prompts = [p for p in mixed_prompts() if len(p) > 3 * WINDOW][:3]
    engine = Engine.from_pretrained(
        ckpt.path, EngineConfig(kv_cache_bytes=8 << 20, max_num_batched_tokens=64, max_num_seqs=4)
    )
    for out, prompt in zip(engine.generate(prompts, SamplingParams(max_tokens=1, prompt_logprobs=True)), prompts,
                           strict=True):  # fmt: skip
        want = hf_prompt_logprobs(ckpt.model, prompt)
        assert max(abs(a - b) for a, b in zip(out.prompt_logprobs[1:], want, strict=True)) < 1e-4


def test_window_forked_choices_equal_their_single_runs(make_checkpoint) -> None:
    """n = 3 choices fork from one prefill (sharing its blocks, the partial last one copied on write)
    and then release their windows' blocks independently: each equals the n = 1 run of its seed."""
    import dataclasses

    ckpt = make_checkpoint("mistral", sliding_window=WINDOW)
    prompt = random.Random(7).choices(range(3, VOCAB), k=150)  # 150 = 9 blocks + 6 tokens
    sampled = SamplingParams(max_tokens=40, temperature=1.0, seed=5, ignore_eos=True)
    engine = Engine.from_pretrained(ckpt.path, EngineConfig(kv_cache_bytes=8 << 20))
    peaks = _watch_blocks(engine)
    out = engine.generate([prompt], dataclasses.replace(sampled, n=3))[0]
    engine.block_manager.check_invariants([])
    # the prefill step holds the prompt's 10 blocks; each decoding choice then at most 3 (blocks_needed(., 1))
    assert peaks[0] == 10 and max(peaks[1:]) <= engine.block_manager.blocks_needed(10**6, 1) == 3
    alone = [engine.generate([prompt], dataclasses.replace(sampled, seed=5 + i))[0].token_ids for i in range(3)]
    assert [o.token_ids for o in out.outputs] == alone and len({tuple(t) for t in alone}) == 3


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arch", "overrides", "modes", "blocks"),
    [
        ("mistral", {"sliding_window": WINDOW}, {}, 20),  # bounded sequences: a smaller cache for pressure
        ("mistral", {"sliding_window": WINDOW}, {"static_decode": True, "overlap_steps": True}, 20),
        ("gemma2", {}, {}, 80),
    ],
)
def test_window_long_mixed_batch_under_pressure(make_checkpoint, arch: str, overrides: dict, modes: dict,
                                                blocks: int) -> None:  # fmt: skip
    """40 prompts up to 600 tokens (shared prefixes), 24 new tokens, a tiny token budget and KV cache."""
    ckpt = make_checkpoint(arch, **overrides)
    rng = random.Random(1)
    shared = [rng.randrange(3, VOCAB) for _ in range(300)]
    prompts = [
        (shared[: rng.randrange(0, 300)] if i % 2 else []) + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 300))]
        for i in range(40)
    ]
    engine = Engine.from_pretrained(
        ckpt.path, EngineConfig(kv_cache_bytes=blocks * BLOCK_BYTES, max_num_batched_tokens=96, max_num_seqs=12, **modes)
    )
    outs = engine.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
    assert [o.token_ids for o in outs] == [hf_greedy(ckpt.model, p, 24) for p in prompts]
    assert engine.stats.preemptions > 0 and engine.stats.cached_tokens > 0
    engine.block_manager.check_invariants([])
