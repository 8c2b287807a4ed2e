"""Greedy tokens and prompt log-probabilities against transformers (fp32) on tiny random checkpoints."""

from __future__ import annotations

import pytest
from engine_oracle import MAX_NEW, hf_prompt_logprobs, mixed_prompts

from worker.engine import Engine, EngineConfig, SamplingParams

GREEDY = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)


def _run(path, **config: object) -> tuple[list[list[int]], Engine]:
    engine = Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=8 << 20, **config))
    outs = engine.generate(mixed_prompts(), GREEDY)
    assert all(o.finish_reason == "length" and o.error is None for o in outs)
    engine.block_manager.check_invariants([])
    return [o.token_ids for o in outs], engine


@pytest.mark.parametrize(
    ("arch", "overrides"),
    [
        ("llama", {}),
        ("qwen2", {"tie_word_embeddings": True}),
        ("qwen3", {}),
    ],
)
def test_greedy_matches_transformers(make_checkpoint, expected, arch: str, overrides: dict) -> None:
    got, engine = _run(make_checkpoint(arch, **overrides).path)
    assert got == expected(arch, **overrides)
    stats = engine.stats.snapshot()
    assert stats.cached_tokens > 0  # the shared prefixes were reused
    assert stats.computed_prefill_tokens == stats.prompt_tokens - stats.cached_tokens


@pytest.mark.parametrize(("backend", "decode_stack"), [("torch", True), ("cpu", True), ("cpu", False)])
def test_greedy_per_cpu_backend(make_checkpoint, expected, backend: str, decode_stack: bool) -> None:
    """"auto" is the C decode kernels on the CPU, with every decode step's layers in one C call
    (decode_stack) or op by op; the torch references (its fallback where no compiler is found) give
    the same tokens."""
    got, engine = _run(make_checkpoint("qwen3").path, backend=backend, decode_stack=decode_stack)
    assert got == expected("qwen3")
    assert (engine.runner.model.decode_stack is not None) == (backend == "cpu" and decode_stack)


def test_greedy_without_prefix_caching(make_checkpoint, expected) -> None:
    got, engine = _run(make_checkpoint("llama").path, enable_prefix_caching=False)
    assert got == expected("llama")
    assert engine.stats.cached_tokens == 0


def test_chunked_prefill_small_token_budget(make_checkpoint, expected) -> None:
    got, engine = _run(make_checkpoint("qwen3").path, max_num_batched_tokens=24, max_num_seqs=3)
    assert got == expected("qwen3")
    assert engine.stats.steps > 300 // 24  # the 300-token prompt needed many chunks


def test_preemption_small_kv_cache(make_checkpoint, expected) -> None:
    ckpt = make_checkpoint("llama")
    # 2 layers x 2 kv heads x 16 dims x 2 (k, v) x 4 bytes x 16 tokens = 8 KiB per block; 30 blocks.
    engine = Engine.from_pretrained(ckpt.path, EngineConfig(kv_cache_bytes=30 * 8192, max_num_seqs=8))
    outs = engine.generate(mixed_prompts(), GREEDY)
    assert [o.token_ids for o in outs] == expected("llama")
    assert engine.stats.preemptions > 0
    engine.block_manager.check_invariants([])


@pytest.mark.parametrize(
    "modes", [{"static_decode": True}, {"overlap_steps": True}, {"static_decode": True, "overlap_steps": True}]
)
def test_hot_path_modes_match_transformers(make_checkpoint, expected, modes: dict) -> None:
    """Decode on the padded static buffers (CUDA graphs' inputs, run eagerly here) and overlapped steps
    keep greedy exactness, also with chunked prefill and preemption."""
    got, _ = _run(make_checkpoint("qwen3").path, **modes)
    assert got == expected("qwen3")
    engine = Engine.from_pretrained(
        make_checkpoint("llama").path,
        EngineConfig(kv_cache_bytes=30 * 8192, max_num_seqs=8, max_num_batched_tokens=128, **modes),
    )
    outs = engine.generate(mixed_prompts(), GREEDY)
    assert [o.token_ids for o in outs] == expected("llama")
    assert engine.stats.preemptions > 0
    engine.block_manager.check_invariants([])


@pytest.mark.parametrize(
    ("arch", "overrides"),
    [
        ("mistral", {}),
        (
            "llama",
            {
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
                "rope_theta": 500000.0,
            },
        ),
    ],
)
def test_other_architectures(make_checkpoint, expected, arch: str, overrides: dict) -> None:
    got, _ = _run(make_checkpoint(arch, **overrides).path)
    assert got == expected(arch, **overrides)


def test_prompt_logprobs_match_log_softmax(make_checkpoint) -> None:
    ckpt = make_checkpoint("qwen2", tie_word_embeddings=True)
    prompts = [p for p in mixed_prompts() if len(p) > 1][:5]
    engine = Engine.from_pretrained(
        ckpt.path, EngineConfig(kv_cache_bytes=8 << 20, max_num_batched_tokens=64, max_num_seqs=4)
    )
    params = SamplingParams(max_tokens=1, prompt_logprobs=True, logprobs=3)
    for out, prompt in zip(engine.generate(prompts, params), prompts, strict=True):
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
        want = hf_prompt_logprobs(ckpt.model, prompt)
        assert max(abs(a - b) for a, b in zip(out.prompt_logprobs[1:], want, strict=True)) < 1e-4
        assert len(out.logprobs) == 1 and out.token_ids[0] in out.logprobs[0]
        assert max(out.logprobs[0].values()) == pytest.approx(out.logprobs[0][out.token_ids[0]], abs=1e-5)


def test_sharded_checkpoint_loads(make_checkpoint, expected, tmp_path) -> None:
    import shutil

    ckpt = make_checkpoint("llama")
    sharded = tmp_path / "sharded"
    ckpt.model.save_pretrained(sharded, max_shard_size="200KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ckpt.path / name, sharded / name)
    got, _ = _run(sharded)
    assert got == expected("llama")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arch", "modes"),
    [("llama", {}), ("qwen2", {}), ("qwen3", {}), ("llama", {"static_decode": True, "overlap_steps": True})],
)
def test_greedy_long_mixed_batch_under_pressure(make_checkpoint, arch: str, modes: dict) -> None:
    """60 prompts up to 700 tokens, 24 new tokens, tiny token budget and KV cache together."""
    import random

    from engine_oracle import VOCAB, hf_greedy

    ckpt = make_checkpoint(arch, max_position_embeddings=1024)
    rng = random.Random(1)
    shared = [rng.randrange(3, VOCAB) for _ in range(300)]
    prompts = [
        (shared[: rng.randrange(0, 300)] if i % 2 else [])
        + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 400))]
        for i in range(60)
    ]
    engine = Engine.from_pretrained(
        ckpt.path, EngineConfig(kv_cache_bytes=80 * 8192, max_num_batched_tokens=96, max_num_seqs=12, **modes)
    )
    outs = engine.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
    assert [o.token_ids for o in outs] == [hf_greedy(ckpt.model, p, 24) for p in prompts]
    assert engine.stats.preemptions > 0 and engine.stats.cached_tokens > 0
    engine.block_manager.check_invariants([])
