"""Gemma 2 and Gemma 3 (text) against transformers (fp32, eager attention) on tiny random
checkpoints: local (32-token window) and global layers, attention and final-logit soft-capping
(Gemma 2), q/k norms and local / global rope bases (Gemma 3), sandwich (1 + w) norms, GeGLU and
scaled embeddings. Greedy tokens with prefix caching on and off, chunked prefill, preemption, the
torch backend; prompt log-probabilities."""

from __future__ import annotations

import pytest
from engine_oracle import MAX_NEW, hf_prompt_logprobs, mixed_prompts

from worker.engine import Engine, EngineConfig, SamplingParams

GREEDY = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
GEMMA_ARCHS = ("gemma2", "gemma3_text")


def _generate(path, **config: object) -> tuple[list[list[int]], Engine]:
    engine = Engine.from_pretrained(path, EngineConfig(**{"kv_cache_bytes": 8 << 20, **config}))
    outs = engine.generate(mixed_prompts(), GREEDY)
    assert all(o.finish_reason == "length" and o.error is None for o in outs), [o.error for o in outs]
    engine.block_manager.check_invariants([])
    return [o.token_ids for o in outs], engine


@pytest.mark.parametrize("arch", GEMMA_ARCHS)
def test_greedy_matches_transformers_with_prefix_caching(make_checkpoint, expected, arch: str) -> None:
    got, engine = _generate(make_checkpoint(arch).path)
    assert got == expected(arch)
    assert engine.stats.snapshot().cached_tokens > 0
    cfg = engine.runner.model.cfg
    assert cfg.layer_windows == (32, 0) and cfg.kv_window is None  # the global layer keeps every block
    assert engine.block_manager.window is None and engine.runner.model.decode_stack is None


@pytest.mark.parametrize("arch", GEMMA_ARCHS)
def test_greedy_without_prefix_caching_chunked(make_checkpoint, expected, arch: str) -> None:
    got, engine = _generate(
        make_checkpoint(arch).path, enable_prefix_caching=False, max_num_batched_tokens=24, max_num_seqs=3
    )
    assert got == expected(arch)
    assert engine.stats.cached_tokens == 0 and engine.stats.steps > 300 // 24


@pytest.mark.parametrize("arch", GEMMA_ARCHS)
def test_greedy_under_preemption(make_checkpoint, expected, arch: str) -> None:
    # 2 layers x 2 kv heads x 16 dims x 2 (k, v) x 4 bytes x 16 tokens = 8 KiB per block; 30 blocks.
    got, engine = _generate(make_checkpoint(arch).path, kv_cache_bytes=30 * 8192, max_num_seqs=8)
    assert got == expected(arch)
    assert engine.stats.preemptions > 0


@pytest.mark.parametrize("arch", GEMMA_ARCHS)
def test_greedy_torch_backend_overlapped(make_checkpoint, expected, arch: str) -> None:
    got, _ = _generate(make_checkpoint(arch).path, backend="torch", overlap_steps=True, static_decode=True)
    assert got == expected(arch)


@pytest.mark.parametrize(("arch", "tied"), [("gemma2", True), ("gemma3_text", False)])
def test_prompt_logprobs_match_transformers(make_checkpoint, arch: str, tied: bool) -> None:
    ckpt = make_checkpoint(arch, tie_word_embeddings=tied)
    prompts = [p for p in mixed_prompts() if len(p) > 1][:6]
    engine = Engine.from_pretrained(
        ckpt.path, EngineConfig(kv_cache_bytes=8 << 20, max_num_batched_tokens=64, max_num_seqs=4)
    )
    params = SamplingParams(max_tokens=1, prompt_logprobs=True)
    for out, prompt in zip(engine.generate(prompts, params), prompts, strict=True):
        want = hf_prompt_logprobs(ckpt.model, prompt)
        assert max(abs(a - b) for a, b in zip(out.prompt_logprobs[1:], want, strict=True)) < 1e-4
