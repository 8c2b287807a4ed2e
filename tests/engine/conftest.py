"""Shared fixtures: tiny random Hugging Face checkpoints built by transformers (the oracle) on disk,
and greedy / log-softmax references computed with transformers in fp32."""

from __future__ import annotations

import copy
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from engine_oracle import MAX_NEW, VOCAB, hf_greedy, mixed_prompts

from worker.demo_model import make_demo_model

transformers = pytest.importorskip("transformers")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


@dataclass
class Checkpoint:
    path: Path
    model: torch.nn.Module  # the transformers model saved at path (fp32, eval)


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


def _config(arch: str, **overrides: object) -> object:
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
    classes = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "mixtral": transformers.MixtralConfig,
        "qwen2_moe": transformers.Qwen2MoeConfig,
        "qwen3_moe": transformers.Qwen3MoeConfig,
        "gemma2": transformers.Gemma2Config,
        "gemma3_text": transformers.Gemma3TextConfig,
        "phi3": transformers.Phi3Config,
        "gpt_oss": transformers.GptOssConfig,
    }
    return classes[arch](**common)


@torch.no_grad()
def _randomize_zero_biases(model: torch.nn.Module) -> None:
    """transformers initializes some biases to zero (gpt-oss's experts and o_proj): random ones make
    the exactness tests see whether they are applied, and where."""
    for name, param in model.named_parameters():
        if name.endswith("bias") and not param.any():
            param.normal_(0.0, 0.05)


@pytest.fixture(autouse=True, scope="package")
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared CPU the threads' spin-waits
    cost more than the work; restore the setting for the rest of the suite."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo_model(tmp_path_factory.mktemp("demo"), "llama", size="tiny")


@pytest.fixture(scope="session")
def make_checkpoint(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path):
    """make_checkpoint(arch, seed=0, **config_overrides) -> Checkpoint (cached per arguments)."""
    cache: dict[tuple, Checkpoint] = {}

    def make(arch: str, seed: int = 0, **overrides: object) -> Checkpoint:
        key = (arch, seed, repr(sorted(overrides.items())))
        if key not in cache:
            torch.manual_seed(seed)
            model = transformers.AutoModelForCausalLM.from_config(_config(arch, **overrides)).float().eval()
            if arch.startswith("gemma"):  # Gemma initializes its (1 + w) norm weights to 0: make them bite
                with torch.no_grad():
                    for name, param in model.named_parameters():
                        if "norm" in name:
                            param.normal_(0.0, 0.3)
            _randomize_zero_biases(model)
            path = tmp_path_factory.mktemp(f"ckpt_{arch}")
            model.save_pretrained(path)
            for name in TOKENIZER_FILES:
                shutil.copy(tokenizer_dir / name, path / name)
            cache[key] = Checkpoint(path, model)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def expected(make_checkpoint):
    """expected(arch, **config_overrides) -> transformers' greedy MAX_NEW tokens for each of
    mixed_prompts() (cached per arguments)."""
    cache: dict = {}

    def get(arch: str, **overrides: object) -> list[list[int]]:
        key = (arch, repr(sorted(overrides.items())))
        if key not in cache:
            model = make_checkpoint(arch, **overrides).model
            cache[key] = [hf_greedy(model, p, MAX_NEW) for p in mixed_prompts()]
        return cache[key]

    return get
