"""Tiny random Hugging Face checkpoints of every supported architecture, built by transformers.

The engine's exactness tests (tests/engine/conftest.py) and the GPU check's exactness section
(bench/gpu_check_exactness.py) both compare freight's greedy tokens against transformers' on these
models, so both build them here: the same shapes, the same non-default settings that make each
architecture's peculiarities bite.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
VOCAB = 1024  # the demo tokenizer's size

# Mixture-of-experts shapes: 8 experts (top-2 / top-3), small experts; Qwen2-MoE with its shared
# expert and one dense layer (mlp_only_layers), Qwen3-MoE renormalizing its top-k (norm_topk_prob).
MOE_DEFAULTS: dict[str, dict[str, object]] = {
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 64},
    "qwen2_moe": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "intermediate_size": 96,
        "mlp_only_layers": [1],
    },
    "qwen3_moe": {"num_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 32, "norm_topk_prob": True},
    # gpt-oss: top-2 of 8 biased experts, alternating sliding / full layers (a 512-token window holds
    # every test prompt; test_exactness_phi3_gptoss narrows it), its default YaRN rope
    "gpt_oss": {
        "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 32, "sliding_window": 512,
        "pad_token_id": None,
    },  # fmt: skip
}
# Phi-3 with LongRoPE (short factors below original_max_position_embeddings, long from it, attention
# factor sqrt(1 + ln 2 / ln 512)) and Phi-4-mini's partial rotary (12 of 16 dims).
PHI3_DEFAULTS: dict[str, object] = {
    "original_max_position_embeddings": 512,
    "rope_parameters": {
        "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
        "short_factor": [1.0, 1.05, 1.1, 1.3, 1.6, 2.0], "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0],
    },
    "pad_token_id": None,
}  # fmt: skip
# Gemma: untied embeddings (tied, the default, makes a tiny random model repeat its input token; the
# logprob tests tie them), a query_pre_attn_scalar unlike head_dim, a 32-token window on
# the local layers (Gemma 2 alternates local / global; the Gemma 3 default here mixes them too), caps
# small enough to bite on a tiny model's scores and logits.
GEMMA_DEFAULTS: dict[str, dict[str, object]] = {
    "gemma2": {"tie_word_embeddings": False, "query_pre_attn_scalar": 24, "sliding_window": 32,
               "attn_logit_softcapping": 2.0, "final_logit_softcapping": 5.0},
    "gemma3_text": {"tie_word_embeddings": False, "query_pre_attn_scalar": 24, "sliding_window": 32,
                    "layer_types": ["sliding_attention", "full_attention"]},
}  # fmt: skip
CONFIG_CLASSES = {
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
    "mixtral": "MixtralConfig",
    "qwen2_moe": "Qwen2MoeConfig",
    "qwen3_moe": "Qwen3MoeConfig",
    "gemma2": "Gemma2Config",
    "gemma3_text": "Gemma3TextConfig",
    "phi3": "Phi3Config",
    "gpt_oss": "GptOssConfig",
}
ARCHS = tuple(CONFIG_CLASSES)


def tiny_config(arch: str, **overrides: object) -> object:
    """The transformers config of a tiny `arch` model: 2 layers, hidden 64, 4 query heads over 2 KV
    heads of 16, the demo tokenizer's vocabulary; `overrides` replace any field."""
    import transformers

    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        initializer_range=0.08,  # peaky logits: greedy ties between implementations stay unlikely
        bos_token_id=0,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    # copies: transformers' configs write into the dicts they are given (Phi3Config puts
    # original_max_position_embeddings into rope_parameters), and a model reads its config at each forward
    common.update(copy.deepcopy(MOE_DEFAULTS.get(arch, {})))
    common.update(copy.deepcopy(GEMMA_DEFAULTS.get(arch, {})))
    if arch == "phi3":
        common.update(copy.deepcopy(PHI3_DEFAULTS))
    common.update(copy.deepcopy(overrides))
    return getattr(transformers, CONFIG_CLASSES[arch])(**common)


@torch.no_grad()
def tiny_model(arch: str, seed: int = 0, **overrides: object) -> torch.nn.Module:
    """A random transformers model of `arch` (fp32, eval): Gemma's (1 + w) norm weights and the
    biases transformers initializes to zero made random, so the comparisons see whether and where
    they are applied."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(arch, **overrides)).float().eval()
    if arch.startswith("gemma"):
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0.0, 0.3)
    for name, param in model.named_parameters():
        if name.endswith("bias") and not param.any():
            param.normal_(0.0, 0.05)
    return model


def save_tiny_checkpoint(model: torch.nn.Module, path: Path, tokenizer_dir: Path) -> Path:
    """`model` saved at `path` with the demo tokenizer's files from `tokenizer_dir`."""
    model.save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, path / name)
    return path


def mixed_prompts(seed: int = 0) -> list[list[int]]:
    """Lengths 1..300; some share long prefixes (block-aligned and not), one exact duplicate."""
    g = torch.Generator().manual_seed(seed)

    def rand(n: int) -> list[int]:
        return torch.randint(3, VOCAB, (n,), generator=g).tolist()

    base = rand(200)
    return [
        rand(1),
        rand(2),
        rand(17),
        base[:64] + rand(9),
        base + rand(100),
        base[:100],
        rand(33),
        base[:64] + rand(40),
        base[:100],
        rand(300),
    ]


@torch.no_grad()
def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation with transformers' own KV cache on the model's device, EOS ignored."""
    device = next(model.parameters()).device
    out = model(torch.tensor([prompt], device=device), use_cache=True)
    tokens: list[int] = []
    for _ in range(max_new_tokens):
        nxt = int(out.logits[0, -1].argmax())
        tokens.append(nxt)
        out = model(torch.tensor([[nxt]], device=device), cache=out.cache, use_cache=True)
    return tokens
