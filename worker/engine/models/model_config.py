"""ModelConfig: the architecture facts the engine needs, parsed from a Hugging Face config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.engine.models.architectures import (
    BIAS_KEYS,
    SUPPORTED_ARCHITECTURES,
    config_problem,
    supported_architecture,
)
from worker.engine.models.moe_config import MoeConfig
from worker.engine.models.rope_config import rope_scaling, rope_settings, rotary_dim


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
    rope_scaling: dict[str, Any] | None  # rope_config.rope_scaling's parameters; None: plain rope
    attention_bias: bool  # bias on q/k/v projections (Qwen2; gpt-oss also on o_proj)
    qk_norm: bool  # per-head RMSNorm of q and k before rotary (Qwen3)
    tie_word_embeddings: bool
    sliding_window: int | None
    eos_token_ids: tuple[int, ...]
    moe: MoeConfig | None = None  # mixture-of-experts MLPs (Mixtral, Qwen2-MoE, Qwen3-MoE, gpt-oss); None: dense
    rotary_dim: int = 0  # leading head dims that rotate (< head_dim: partial rotary, Phi-4-mini); 0: all
    o_proj_bias: bool = False  # bias on o_proj (gpt-oss, with attention_bias)
    attention_sinks: bool = False  # a learned per-head logit in each softmax's denominator (gpt-oss)
    # per layer, whether it attends within sliding_window (gpt-oss's "sliding_attention" layers);
    # empty: every layer alike (sliding_window applies to all of them when set)
    sliding_layers: tuple[bool, ...] = ()

    @property
    def longrope_threshold(self) -> int | None:
        """LongRoPE's original_max_position_embeddings: a prompt longer than this would switch every
        position to the long factors (see models/rotary.py); None for other ropes."""
        scaling = self.rope_scaling
        if scaling is None or scaling["rope_type"] != "longrope":
            return None
        return int(scaling["original_max_position_embeddings"])

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
        layer_types = cfg.get("layer_types") or []
        bias = bool(cfg.get(BIAS_KEYS.get(arch, "attention_bias"), flags["default_bias"]))
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
        head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // num_heads)
        return cls(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=head_dim,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling(cfg),
            attention_bias=bias,
            qk_norm=flags["qk_norm"],
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            sliding_window=int(window) if window else None,
            eos_token_ids=eos_ids,
            moe=MoeConfig.from_dict(cfg) if flags.get("moe") else None,
            rotary_dim=rotary_dim(cfg) if rotary_dim(cfg) < head_dim else 0,
            o_proj_bias=bias and bool(flags.get("sinks")),
            attention_sinks=bool(flags.get("sinks")),
            sliding_layers=tuple(t == "sliding_attention" for t in layer_types) if window else (),
        )
