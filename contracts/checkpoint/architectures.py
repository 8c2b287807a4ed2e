"""What config.json must say for the engine to build a model: the one list of supported architectures.

Plain data and a pure check, no torch: the engine (ModelConfig.from_dict) and the control plane's
model check before a job is planned (jobs/model_check.py, which must not import torch) read this
module, so both refuse the same configs with the same words.
"""

from __future__ import annotations

from typing import Any

from contracts.checkpoint.layer_types import SLIDING, has_local_rope, layer_types_problem, rope_for, rope_kind
from contracts.checkpoint.rope_config import ROPE_TYPES, rope_problem

# Hugging Face architecture name -> the flags our one decoder implementation needs. `moe`: sparse
# mixture-of-experts MLPs (their keys: worker/engine/models/moe_config.py); `sinks`: attention sinks and an o_proj
# bias with the q/k/v one (gpt-oss); `gemma`: the Gemma 2/3 block ((1 + w) RMSNorm weights, norms
# after attention and after the MLP too, embeddings times sqrt(hidden), soft-capping).
SUPPORTED_ARCHITECTURES: dict[str, dict[str, bool]] = {
    "LlamaForCausalLM": {"qk_norm": False, "default_bias": False},
    "MistralForCausalLM": {"qk_norm": False, "default_bias": False},
    "Qwen2ForCausalLM": {"qk_norm": False, "default_bias": True},
    "Qwen3ForCausalLM": {"qk_norm": True, "default_bias": False},
    "MixtralForCausalLM": {"qk_norm": False, "default_bias": False, "moe": True},
    "Qwen2MoeForCausalLM": {"qk_norm": False, "default_bias": True, "moe": True},
    "Qwen3MoeForCausalLM": {"qk_norm": True, "default_bias": False, "moe": True},
    "Gemma2ForCausalLM": {"qk_norm": False, "default_bias": False, "gemma": True},
    "Gemma3ForCausalLM": {"qk_norm": True, "default_bias": False, "gemma": True},
    # fused qkv_proj / gate_up_proj in the checkpoint (loaded by name), LongRoPE, partial rotary
    "Phi3ForCausalLM": {"qk_norm": False, "default_bias": False},
    # attention sinks, o_proj bias, biased router and experts with a clamped SwiGLU, top-k then softmax
    "GptOssForCausalLM": {"qk_norm": False, "default_bias": True, "moe": True, "sinks": True},
}
# The config key holding the q/k/v bias switch, where it is not `attention_bias`.
BIAS_KEYS = {"Qwen2MoeForCausalLM": "qkv_bias"}
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")  # the MLP's gate activation (SwiGLU; GeGLU with tanh GELU)
# Keys without a default: a config.json lacking one cannot describe the model's shapes.
REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
# Keys that, when present, must be positive integers.
_OPTIONAL_INT_KEYS = ("num_key_value_heads", "head_dim", "max_position_embeddings")


def supported_architecture(cfg: dict[str, Any]) -> str | None:
    """The first entry of config.json's `architectures` the engine supports, or None."""
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list):
        return None
    return next((a for a in archs if isinstance(a, str) and a in SUPPORTED_ARCHITECTURES), None)


def hidden_act(cfg: dict[str, Any]) -> str:
    """The MLP activation's name (Gemma's configs call the key hidden_activation)."""
    return str(cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu")


def config_problem(cfg: Any) -> str | None:
    """Why the engine cannot build a model from this parsed config.json, in words that name the key
    ("config.json has no hidden_size"), or None when it can."""
    if not isinstance(cfg, dict):
        return "config.json must hold a JSON object"
    if supported_architecture(cfg) is None:
        named = cfg.get("architectures") or cfg.get("model_type")
        return (
            f"config.json names architecture {named!r}, which freight does not support; "
            f"supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
            if named
            else "config.json has no architectures (e.g. [\"LlamaForCausalLM\"])"
        )
    for key in REQUIRED_KEYS:
        if key not in cfg or cfg[key] is None:
            return f"config.json has no {key}"
    for key in (*REQUIRED_KEYS, *_OPTIONAL_INT_KEYS):
        value = cfg.get(key)
        if value is None and key not in REQUIRED_KEYS:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            return f"config.json: {key} must be a positive integer, not {value!r}"
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    if heads % kv_heads:
        return f"config.json: num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
    if not cfg.get("head_dim") and cfg["hidden_size"] % heads:
        return (
            f"config.json: hidden_size ({cfg['hidden_size']}) is not a multiple of num_attention_heads "
            f"({heads}) and there is no head_dim"
        )
    if hidden_act(cfg) not in ACTIVATIONS:
        return f"config.json: hidden_act {hidden_act(cfg)!r} is not supported; freight supports {', '.join(ACTIVATIONS)}"
    if cfg.get("mlp_bias"):
        return "config.json: mlp_bias=true is not supported"
    arch = supported_architecture(cfg)
    problem = layer_types_problem(cfg, arch) or rope_problem(cfg)
    if problem is not None:
        return problem
    local = rope_kind(rope_for(cfg, SLIDING)) if has_local_rope(cfg) else "default"  # Gemma 3's local rope
    if local not in ROPE_TYPES:
        return f"config.json: rope type {local!r} is not supported; freight supports {', '.join(ROPE_TYPES)}"
    for key in ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"):
        value = cfg.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
            return f"config.json: {key} must be a positive number or null, not {value!r}"
    if SUPPORTED_ARCHITECTURES[arch].get("moe"):
        return moe_problem(cfg)
    return None


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def moe_keys(cfg: dict[str, Any]) -> dict[str, Any]:
    """The mixture-of-experts keys of a MoE config.json, under one set of names whichever model wrote
    them (Mixtral and gpt-oss: num_local_experts, every layer sparse, no moe_intermediate_size)."""
    gpt_oss = supported_architecture(cfg) == "GptOssForCausalLM"
    mixtral = gpt_oss or supported_architecture(cfg) == "MixtralForCausalLM"
    # the expert count's key: Mixtral's num_local_experts, the Qwen MoEs' num_experts (the hub's
    # Qwen3-MoE configs); transformers 5 writes Qwen3-MoE's as num_local_experts
    names = ("num_local_experts", "num_experts") if mixtral else ("num_experts", "num_local_experts")
    return {
        "num_experts": next((cfg[k] for k in names if cfg.get(k) is not None), None),
        "top_k": cfg.get("num_experts_per_tok"),
        "expert_size": cfg.get("intermediate_size") if mixtral else cfg.get("moe_intermediate_size"),
        # Mixtral renormalizes the top-k probabilities always; the Qwen MoEs when norm_topk_prob
        "norm_topk_prob": True if mixtral else bool(cfg.get("norm_topk_prob", False)),
        "shared_expert_size": cfg.get("shared_expert_intermediate_size") or 0,
        "sparse_step": 1 if mixtral else cfg.get("decoder_sparse_step", 1),
        "dense_layers": [] if mixtral else list(cfg.get("mlp_only_layers") or []),
        # gpt-oss: top-k of the (biased) router logits, then softmax over the k; biased experts whose
        # SwiGLU clamps gate and up to swiglu_limit (transformers' GptOssExperts)
        "topk_then_softmax": gpt_oss,
        "biases": gpt_oss,
        "swiglu_limit": float(cfg.get("swiglu_limit", 7.0)) if gpt_oss else None,
        "swiglu_alpha": float(cfg.get("swiglu_alpha", 1.702)) if gpt_oss else None,
    }


def moe_problem(cfg: dict[str, Any]) -> str | None:
    """Why a mixture-of-experts config.json cannot be built, or None."""
    keys = moe_keys(cfg)
    local = supported_architecture(cfg) in ("MixtralForCausalLM", "GptOssForCausalLM")
    experts_key = "num_local_experts" if local else "num_experts"
    if keys["num_experts"] is None:
        return f"config.json has no {experts_key}"
    if not _positive_int(keys["num_experts"]):
        return f"config.json: {experts_key} must be a positive integer, not {keys['num_experts']!r}"
    if not _positive_int(keys["top_k"]) or keys["top_k"] > keys["num_experts"]:
        return (
            f"config.json: num_experts_per_tok must be an integer in 1..{experts_key} ({keys['num_experts']}), "
            f"not {keys['top_k']!r}"
        )
    if not _positive_int(keys["expert_size"]):
        return f"config.json: moe_intermediate_size must be a positive integer, not {keys['expert_size']!r}"
    if not _positive_int(keys["sparse_step"]):
        return f"config.json: decoder_sparse_step must be a positive integer, not {keys['sparse_step']!r}"
    if keys["shared_expert_size"] and not _positive_int(keys["shared_expert_size"]):
        return "config.json: shared_expert_intermediate_size must be a positive integer"
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in keys["dense_layers"]):
        return "config.json: mlp_only_layers must list layer indices"
    return None
