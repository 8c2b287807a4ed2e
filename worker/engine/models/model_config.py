"""ModelConfig: the architecture facts the engine needs, parsed from a Hugging Face config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Hugging Face architecture name -> the flags our one decoder implementation needs.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": {"qk_norm": False, "default_bias": False},
    "MistralForCausalLM": {"qk_norm": False, "default_bias": False},
    "Qwen2ForCausalLM": {"qk_norm": False, "default_bias": True},
    "Qwen3ForCausalLM": {"qk_norm": True, "default_bias": False},
}
ROPE_TYPES = ("default", "llama3", "linear")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # rope_type llama3 / linear parameters; None: plain rope
    attention_bias: bool  # bias on q/k/v projections (Qwen2)
    qk_norm: bool  # per-head RMSNorm of q and k before rotary (Qwen3)
    tie_word_embeddings: bool
    sliding_window: int | None
    eos_token_ids: tuple[int, ...]

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"unsupported architecture {archs or cfg.get('model_type')!r} in config.json; "
                f"freight supports {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        flags = SUPPORTED_ARCHITECTURES[arch]
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported (only 'silu')")
        if cfg.get("mlp_bias"):
            raise ValueError("mlp_bias=true is not supported")
        num_heads = int(cfg["num_attention_heads"])
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        rope_theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"rope type {rope_type!r} is not supported; freight supports {ROPE_TYPES}")
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
        return cls(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // num_heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            rope_theta=rope_theta,
            rope_scaling=None if rope_type == "default" else {**rope, "rope_type": rope_type},
            attention_bias=bool(cfg.get("attention_bias", flags["default_bias"])),
            qk_norm=flags["qk_norm"],
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            sliding_window=int(window) if window else None,
            eos_token_ids=eos_ids,
        )
