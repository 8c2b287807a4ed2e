"""transformers as the oracle: greedy continuations, prompt log-probabilities, a fixed prompt mix."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from tiny_checkpoints import VOCAB, hf_greedy, mixed_prompts  # noqa: E402, F401  (the tests' oracle and prompt mix)

MAX_NEW = 8  # greedy tokens per prompt in the exactness tests (conftest's `expected`)
# (arch, config overrides) of the dense tiny models that take each path of the CPU decode stack
DECODE_STACK_ARCHS = [
    ("llama", {}),
    ("qwen2", {"tie_word_embeddings": True}),  # qkv bias, tied lm_head
    ("qwen3", {}),  # q/k norms
    ("mistral", {"num_key_value_heads": 1}),  # a GQA group of 4
]


@torch.no_grad()
def hf_prompt_logprobs(model: torch.nn.Module, prompt: list[int]) -> list[float]:
    """log p(prompt[i] | prompt[:i]) for i >= 1."""
    logp = torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), dim=-1)
    return logp[:-1].gather(1, torch.tensor(prompt[1:])[:, None])[:, 0].tolist()


def random_prompt(n: int, seed: int = 0) -> list[int]:
    """`n` token ids drawn from the vocabulary past the special ids 0-2, the same for the same seed."""
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def small_engine(path: object, **config: object) -> Any:
    """An Engine on the checkpoint at `path` with 8 MiB of KV cache unless `config` says otherwise."""
    from worker.engine import Engine, EngineConfig

    return Engine.from_pretrained(path, EngineConfig(**{"kv_cache_bytes": 8 << 20, **config}))


def greedy_run(path: object, **config: object) -> tuple[list[list[int]], object]:
    """The engine's greedy MAX_NEW tokens for each of mixed_prompts() (small_engine's KV unless
    `config` says otherwise), every request ending by length, the block manager's invariants held after."""
    from worker.engine import SamplingParams

    engine = small_engine(path, **config)
    outs = engine.generate(mixed_prompts(), SamplingParams(max_tokens=MAX_NEW, ignore_eos=True))
    assert all(o.finish_reason == "length" and o.error is None for o in outs), [o.error for o in outs]
    engine.block_manager.check_invariants([])
    return [o.token_ids for o in outs], engine


def prompt_logprobs_error(ckpt: object, count: int = 5) -> float:
    """The largest gap between the engine's prompt log-probabilities and transformers' over the first
    `count` multi-token prompts of mixed_prompts() (ckpt: a conftest checkpoint, .path and .model)."""
    from worker.engine import Engine, EngineConfig, SamplingParams

    prompts = [p for p in mixed_prompts() if len(p) > 1][:count]
    engine = Engine.from_pretrained(
        ckpt.path, EngineConfig(kv_cache_bytes=8 << 20, max_num_batched_tokens=64, max_num_seqs=4)
    )
    outs = engine.generate(prompts, SamplingParams(max_tokens=1, prompt_logprobs=True))
    return max(
        abs(a - b)
        for out, prompt in zip(outs, prompts, strict=True)
        for a, b in zip(out.prompt_logprobs[1:], hf_prompt_logprobs(ckpt.model, prompt), strict=True)
    )
