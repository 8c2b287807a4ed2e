"""Shared by the speculative decoding tests (test_speculative.py, test_speculative_draft.py): the
prompts, an engine run, and the comparisons with plain decoding."""

from __future__ import annotations

import shutil

import torch
from engine_oracle import VOCAB, mixed_prompts

from worker.engine import Engine, EngineConfig, SamplingParams
from worker.engine.speculation.config import SpeculativeConfig

NGRAM = SpeculativeConfig("ngram", 4, adaptive=False)  # every proposal verified: the paths under test run
GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)
ARCHS = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "phi3", "gpt_oss", "gemma2", "gemma3_text")


def spec_prompts() -> list[list[int]]:
    """mixed_prompts (shared prefixes, lengths 1..300) plus prompts that repeat a span (copy-heavy)."""
    g = torch.Generator().manual_seed(7)
    spans = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (6, 11, 23)]
    return mixed_prompts() + [s * 3 + s[:2] for s in spans]


def run(path, prompts, params, **config: object) -> tuple[list, Engine]:
    engine = Engine.from_pretrained(path, EngineConfig(**{"kv_cache_bytes": 8 << 20, **config}))
    outs = engine.generate(prompts, params)
    assert all(o.error is None for o in outs), [o.error for o in outs]
    engine.block_manager.check_invariants([])
    return outs, engine


def same(a: list, b: list) -> None:
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.text for o in a] == [o.text for o in b]
    assert [o.finish_reason for o in a] == [o.finish_reason for o in b]


def speculated(engine: Engine) -> None:
    """Proposals were verified, some accepted and some rejected (both paths ran)."""
    s = engine.stats
    assert s.spec_runs > 0 and 0 < s.spec_accepted_tokens < s.spec_proposed_tokens, s


def perturbed(path, out, half: bool = False):
    """A copy of the checkpoint whose last layer's attention output is scaled by 0.3: a draft that
    agrees with the target on many tokens, not all (half: stored in fp16)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(path, out)
    weights = load_file(out / "model.safetensors")
    for name in weights:
        if "layers.1.self_attn.o_proj" in name:
            weights[name] = weights[name] * 0.3
        if half:
            weights[name] = weights[name].half()
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out
