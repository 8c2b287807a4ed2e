"""The modules of a base model a LoRA adapter may wrap, by their Hugging Face names, from config.json.

Freight adds a LoRA product after the attention projections (q/k/v/o) of every supported model and
after the dense MLP projections (gate/up/down). The other linear layers PEFT could target are named
too, so an adapter targeting one is refused by name: the output head, the embeddings, a mixture of
experts' router and experts (and Qwen2-MoE's shared expert), Phi-3's fused qkv_proj and gate_up_proj.
"""

from __future__ import annotations

from typing import Any

from contracts.checkpoint.architectures import SUPPORTED_ARCHITECTURES, moe_keys, supported_architecture

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
PROJECTIONS = ATTENTION + MLP  # what freight applies a LoRA to
_FUSED = "Phi3ForCausalLM"  # q/k/v and gate/up fused in the checkpoint's own modules


def _dense_layers(config: dict[str, Any], arch: str) -> list[int]:
    """Layers whose MLP is one dense SwiGLU / GeGLU (every layer but a mixture of experts' sparse ones)."""
    layers = int(config["num_hidden_layers"])
    if not SUPPORTED_ARCHITECTURES[arch].get("moe"):
        return list(range(layers))
    keys = moe_keys(config)
    step = int(keys["sparse_step"] or 1)
    return [i for i in range(layers) if i in keys["dense_layers"] or (i + 1) % step]


def base_modules(config: dict[str, Any]) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """({module name: (in_features, out_features)} of every projection freight can put a LoRA on,
    [names of the base's other linear modules and embeddings]) for a config.json that
    contracts.checkpoint.architectures.config_problem accepts."""
    arch = supported_architecture(config) or ""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    inter = int(config["intermediate_size"])
    q, kv = heads * head_dim, kv_heads * head_dim
    shapes = {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
              "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}  # fmt: skip
    dense = set(_dense_layers(config, arch))
    modules: dict[str, tuple[int, int]] = {}
    others = ["lm_head", "model.embed_tokens"]
    for i in range(int(config["num_hidden_layers"])):
        prefix = f"model.layers.{i}"
        for p in ATTENTION:
            if arch == _FUSED and p != "o_proj":
                continue
            modules[f"{prefix}.self_attn.{p}"] = shapes[p]
        if arch == _FUSED:
            others += [f"{prefix}.self_attn.qkv_proj", f"{prefix}.mlp.gate_up_proj"]
            modules[f"{prefix}.mlp.down_proj"] = shapes["down_proj"]
        elif i in dense:
            modules.update((f"{prefix}.mlp.{p}", shapes[p]) for p in MLP)
        else:  # a sparse mixture-of-experts MLP
            others += [f"{prefix}.mlp.gate", f"{prefix}.mlp.router", f"{prefix}.mlp.experts",
                       f"{prefix}.mlp.shared_expert_gate"]  # fmt: skip
            others += [f"{prefix}.mlp.shared_expert.{p}" for p in MLP]
            others += [f"{prefix}.mlp.experts.0.{p}" for p in MLP]  # per-expert modules, as older checkpoints name them
    return modules, others
