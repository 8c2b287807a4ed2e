"""Phi-3 (fused qkv / gate_up, LongRoPE, partial rotary) and gpt-oss (attention sinks, biases,
alternating sliding / full layers, top-k-then-softmax MoE with a clamped SwiGLU, YaRN) against
transformers (fp32) on tiny random checkpoints: greedy tokens with prefix caching on and off, chunked
prefill, preemption; prompt log-probabilities; Phi-3's LongRoPE switch from short to long factors."""

from __future__ import annotations

import pytest
import torch
from engine_oracle import MAX_NEW, VOCAB, hf_greedy, hf_prompt_logprobs, mixed_prompts

from worker.engine import Engine, EngineConfig, SamplingParams

GREEDY = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
ARCHS = ("phi3", "gpt_oss")


def _generate(path, **config: object) -> tuple[list[list[int]], Engine]:
    engine = Engine.from_pretrained(path, EngineConfig(**{"kv_cache_bytes": 8 << 20, **config}))
    outs = engine.generate(mixed_prompts(), GREEDY)
    assert all(o.finish_reason == "length" and o.error is None for o in outs)
    engine.block_manager.check_invariants([])
    return [o.token_ids for o in outs], engine


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_transformers_with_prefix_caching(make_checkpoint, expected, arch: str) -> None:
    got, engine = _generate(make_checkpoint(arch).path)
    assert got == expected(arch)
    assert engine.stats.snapshot().cached_tokens > 0  # the shared prefixes were reused
    # Phi-3 is dense: its decode steps run the whole-stack C path (partial rotary included)
    assert (engine.runner.model.decode_stack is not None) == (arch == "phi3")


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_without_prefix_caching_chunked(make_checkpoint, expected, arch: str) -> None:
    """Prefix caching off and a 24-token budget: the 300-token prompt prefills in many chunks."""
    got, engine = _generate(
        make_checkpoint(arch).path, enable_prefix_caching=False, max_num_batched_tokens=24, max_num_seqs=3
    )
    assert got == expected(arch)
    assert engine.stats.cached_tokens == 0 and engine.stats.steps > 300 // 24


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_under_preemption(make_checkpoint, expected, arch: str) -> None:
    # 2 layers x 2 kv heads x 16 dims x 2 (k, v) x 4 bytes x 16 tokens = 8 KiB per block; 30 blocks.
    got, engine = _generate(make_checkpoint(arch).path, kv_cache_bytes=30 * 8192, max_num_seqs=8)
    assert got == expected(arch)
    assert engine.stats.preemptions > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_torch_backend(make_checkpoint, expected, arch: str) -> None:
    """The torch references (attention sinks applied from the log-sum-exp) give the C backend's tokens."""
    got, _ = _generate(make_checkpoint(arch).path, backend="torch")
    assert got == expected(arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_prompt_logprobs_match_transformers(make_checkpoint, arch: str) -> None:
    ckpt = make_checkpoint(arch)
    prompts = [p for p in mixed_prompts() if len(p) > 1][:5]
    engine = Engine.from_pretrained(
        ckpt.path, EngineConfig(kv_cache_bytes=8 << 20, max_num_batched_tokens=64, max_num_seqs=4)
    )
    params = SamplingParams(max_tokens=1, prompt_logprobs=True)
    for out, prompt in zip(engine.generate(prompts, params), prompts, strict=True):
        want = hf_prompt_logprobs(ckpt.model, prompt)
        assert max(abs(a - b) for a, b in zip(out.prompt_logprobs[1:], want, strict=True)) < 1e-4


def test_gpt_oss_sliding_layers_are_real_windows(make_checkpoint, expected) -> None:
    """A 32-token window on the sliding layers (the full ones keep every key): prompts many windows
    long give transformers' tokens, and the window caps no context (sliding_window.py's semantics;
    a model mixing windowed and full layers keeps every block)."""
    ckpt = make_checkpoint("gpt_oss", sliding_window=32)
    got, engine = _generate(ckpt.path)
    assert got == expected("gpt_oss", sliding_window=32)
    cfg = engine.runner.model.cfg
    assert cfg.layer_windows == (32, 0) and engine.max_model_len == cfg.max_position_embeddings
    assert engine.block_manager.window is None


def test_phi3_longrope_crossing_the_threshold(make_checkpoint) -> None:
    """original_max_position_embeddings 32: prompts below it generate past it. transformers (with its
    KV cache) computes each token from position 32 on with the long factors and keeps the earlier keys'
    short ones; the engine's table does the same, with prefix caching, chunks and preemption alike. A
    prompt longer than 32 (transformers: long factors everywhere) is refused with the reason."""
    ckpt = make_checkpoint("phi3", original_max_position_embeddings=32)
    g = torch.Generator().manual_seed(3)
    base = torch.randint(3, VOCAB, (20,), generator=g).tolist()
    prompts = [base + [7, 8], base[:16] + [9], torch.randint(3, VOCAB, (32,), generator=g).tolist(), [4, 5]]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    want = [hf_greedy(ckpt.model, p, 24) for p in prompts]
    for config in ({}, {"enable_prefix_caching": False, "max_num_batched_tokens": 8, "max_num_seqs": 2},
                   {"kv_cache_bytes": 6 * 8192, "max_num_seqs": 4}):  # fmt: skip
        engine = Engine.from_pretrained(ckpt.path, EngineConfig(**{"kv_cache_bytes": 8 << 20, **config}))
        assert engine.longrope_threshold == 32
        assert [o.token_ids for o in engine.generate(prompts, params)] == want, config
    assert engine.stats.preemptions > 0
    refused = engine.generate([base + base], params)[0]
    assert refused.finish_reason == "error" and "LongRoPE original_max_position_embeddings (32)" in refused.error
