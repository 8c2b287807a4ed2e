"""Phi-3 (fused qkv / gate_up, LongRoPE, partial rotary) and gpt-oss (attention sinks, biases,
alternating sliding / full layers, top-k-then-softmax MoE with a clamped SwiGLU, YaRN) against
transformers (fp32) on tiny random checkpoints: what is particular to them, Phi-3's LongRoPE switch
from short to long factors and gpt-oss's sliding layers (the cases every architecture passes are in
test_exactness_archs.py)."""

from __future__ import annotations

import torch
from engine_oracle import VOCAB, greedy_run, hf_greedy

from worker.engine import Engine, EngineConfig, SamplingParams


def test_gpt_oss_sliding_layers_are_real_windows(make_checkpoint, expected) -> None:
    """A 32-token window on the sliding layers (the full ones keep every key): prompts many windows
    long give transformers' tokens, and the window caps no context (sliding_window.py's semantics;
    its sliding layers' KV is a pool of its own, released behind the window: kv_groups.py)."""
    ckpt = make_checkpoint("gpt_oss", sliding_window=32)
    got, engine = greedy_run(ckpt.path)
    assert got == expected("gpt_oss", sliding_window=32)
    cfg = engine.runner.model.cfg
    assert cfg.layer_windows == (32, 0) and engine.max_model_len == cfg.max_position_embeddings
    assert engine.block_manager.window == 32 and engine.block_manager.local.window == 32  # two KV cache groups


def test_phi3_longrope_crossing_the_threshold(make_checkpoint) -> None:
    """original_max_position_embeddings 32: prompts below it generate past it. transformers (with its
    KV cache) computes each token from position 32 on with the long factors and keeps the earlier keys'
    short ones; the engine's table does the same, with prefix caching, chunks and preemption alike.
    Prompts longer than 32 (transformers: long factors everywhere): test_longrope_prompts.py."""
    ckpt = make_checkpoint("phi3", original_max_position_embeddings=32)
    g = torch.Generator().manual_seed(3)
    base = torch.randint(3, VOCAB, (20,), generator=g).tolist()
    prompts = [base + [7, 8], base[:16] + [9], torch.randint(3, VOCAB, (32,), generator=g).tolist(), [4, 5]]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    want = [hf_greedy(ckpt.model, p, 24) for p in prompts]
    for config in ({}, {"enable_prefix_caching": False, "max_num_batched_tokens": 8, "max_num_seqs": 2},
                   {"kv_cache_bytes": 6 * 8192, "max_num_seqs": 4}):  # fmt: skip
        engine = Engine.from_pretrained(ckpt.path, EngineConfig(**{"kv_cache_bytes": 8 << 20, **config}))
        assert engine.runner.model.cfg.longrope_threshold == 32
        assert [o.token_ids for o in engine.generate(prompts, params)] == want, config
    assert engine.stats.preemptions > 0
