"""Quantized models on the CPU: the engine with the integer kernels (kernels/cpu/quant.h; the whole-layer
decode stack where it takes the step) gives the greedy tokens of the quantized reference path (the
same math in torch: activations rounded to int8 per block, exact integer block sums, the scales;
kernels/reference/quant_matmul.py) on the tiny models of every dense architecture the stack runs."""

from __future__ import annotations

import pytest
from engine_oracle import MAX_NEW, mixed_prompts

from worker.engine import Engine, EngineConfig, SamplingParams
from worker.engine.quant.linear import QuantLinear

GREEDY = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)


def _engine(path, **config: object) -> Engine:
    return Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=8 << 20, **config))


def _reference_tokens(path, quantization: str, **config: object) -> list[list[int]]:
    """Greedy tokens with every quantized Linear on its torch reference, layers op by op."""
    engine = _engine(path, quantization=quantization, decode_stack=False, **config)
    modules = [m for m in engine.runner.model.modules() if isinstance(m, QuantLinear)]
    assert modules
    for m in modules:
        m.cpu_path = "dynamic"
    return [o.token_ids for o in engine.generate(mixed_prompts(), GREEDY)]


@pytest.mark.parametrize("quantization", ["int8", "int4"])
@pytest.mark.parametrize(
    ("arch", "overrides"),
    [
        ("llama", {}),
        ("qwen2", {"tie_word_embeddings": True}),  # qkv bias, tied lm_head
        ("qwen3", {}),  # q/k norms
        ("mistral", {"num_key_value_heads": 1}),  # a GQA group of 4
    ],
)
def test_kernels_give_the_reference_paths_greedy_tokens(make_checkpoint, arch: str, overrides: dict,
                                                        quantization: str) -> None:  # fmt: skip
    path = make_checkpoint(arch, **overrides).path
    engine = _engine(path, quantization=quantization, max_num_seqs=4)
    outs = engine.generate(mixed_prompts(), GREEDY)
    assert [o.token_ids for o in outs] == _reference_tokens(path, quantization, max_num_seqs=4)
    engine.block_manager.check_invariants([])
