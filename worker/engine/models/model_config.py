"""ModelConfig: the architecture facts the engine needs, parsed from a Hugging Face config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.engine.models.architectures import (
    BIAS_KEYS,
    SUPPORTED_ARCHITECTURES,
    config_problem,
    rope_settings,
    rope_type,
    supported_architecture,
)
from worker.engine.models.moe_config import MoeConfig


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
    moe: MoeConfig | None = None  # mixture-of-experts MLPs (Mixtral, Qwen2-MoE, Qwen3-MoE); None: dense

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        problem = config_problem(cfg)  # the same check jobs/ runs before a job is planned
        if problem is not None:
            raise ValueError(problem)
        arch = supported_architecture(cfg)
        assert arch is not None  # invariant: config_problem checked it
        flags = SUPPORTED_ARCHITECTURES[arch]
        num_heads = int(cfg["num_attention_heads"])
        rope = rope_settings(cfg)
        rope_theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        kind = rope_type(cfg)
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
            rope_scaling=None if kind == "default" else {**rope, "rope_type": kind},
            attention_bias=bool(cfg.get(BIAS_KEYS.get(arch, "attention_bias"), flags["default_bias"])),
            qk_norm=flags["qk_norm"],
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            sliding_window=int(window) if window else None,
            eos_token_ids=eos_ids,
            moe=MoeConfig.from_dict(cfg) if flags.get("moe") else None,
        )
