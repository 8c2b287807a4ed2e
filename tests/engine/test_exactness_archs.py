"""Every architecture beyond the four dense ones against transformers (fp32) on tiny random
checkpoints, the same cases for each: greedy tokens with prefix caching on, off with a small token
budget (many prefill chunks), under preemption, on the torch backend; prompt log-probabilities within
1e-4. Phi-3's LongRoPE switch and gpt-oss's sliding layers: test_exactness_phi3_gptoss.py; Gemma's
and Mistral's windows: test_sliding_window.py; MoE routing: test_moe_block.py, test_gpt_oss_parts.py."""

from __future__ import annotations

import pytest
from engine_oracle import greedy_run, prompt_logprobs_error

ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe", "phi3", "gpt_oss", "gemma2", "gemma3_text")
# Gemma's tiny checkpoints have a 32-token window on their local layers; Gemma 2 ties its embeddings
CHECKPOINT = {"gemma2": {"tie_word_embeddings": True}}
# the torch backend, plus its overlapped and static decode where the model allows them
TORCH_MODES = {"gemma2": {"overlap_steps": True, "static_decode": True},
               "gemma3_text": {"overlap_steps": True, "static_decode": True}}  # fmt: skip


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_with_prefix_caching(make_checkpoint, expected, arch: str) -> None:
    got, engine = greedy_run(make_checkpoint(arch).path)
    assert got == expected(arch)
    assert engine.stats.snapshot().cached_tokens > 0  # the shared prefixes were reused
    # only dense layers without windows or soft-caps decode through the whole-stack C path (Phi-3's
    # partial rotary included); MoE layers have no router there, Gemma's layer is op by op
    assert (engine.runner.model.decode_stack is not None) == (arch == "phi3")
    if arch.startswith("gemma"):  # local (32-token window) and global layers: two KV cache groups
        cfg = engine.runner.model.cfg
        assert cfg.layer_windows == (32, 0) and cfg.kv_window is None and cfg.local_window == 32
        assert engine.block_manager.window == 32 and engine.block_manager.local.window == 32


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_without_prefix_caching_chunked(make_checkpoint, expected, arch: str) -> None:
    """Prefix caching off and a 24-token budget: the 300-token prompt prefills in many chunks."""
    got, engine = greedy_run(
        make_checkpoint(arch).path, enable_prefix_caching=False, max_num_batched_tokens=24, max_num_seqs=3
    )
    assert got == expected(arch)
    assert engine.stats.cached_tokens == 0 and engine.stats.steps > 300 // 24


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_under_preemption(make_checkpoint, expected, arch: str) -> None:
    # 2 layers x 2 kv heads x 16 dims x 2 (k, v) x 4 bytes x 16 tokens = 8 KiB per block; 30 blocks.
    got, engine = greedy_run(make_checkpoint(arch).path, kv_cache_bytes=30 * 8192, max_num_seqs=8)
    assert got == expected(arch)
    assert engine.stats.preemptions > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_torch_backend(make_checkpoint, expected, arch: str) -> None:
    """The torch references (attention sinks, windows, soft-caps, reference fused_moe) give the C
    backend's tokens."""
    got, _ = greedy_run(make_checkpoint(arch).path, backend="torch", **TORCH_MODES.get(arch, {}))
    assert got == expected(arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_prompt_logprobs_match_transformers(make_checkpoint, arch: str) -> None:
    assert prompt_logprobs_error(make_checkpoint(arch, **CHECKPOINT.get(arch, {}))) < 1e-4
