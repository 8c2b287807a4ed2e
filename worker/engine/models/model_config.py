"""ModelConfig: the architecture facts the engine needs, parsed from a Hugging Face config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts.checkpoint.architectures import (
    BIAS_KEYS,
    SUPPORTED_ARCHITECTURES,
    config_problem,
    hidden_act,
    supported_architecture,
)
from contracts.checkpoint.layer_types import FULL, SLIDING, has_local_rope, layer_windows, rope_for, rope_kind
from contracts.checkpoint.rope_config import rope_scaling, rope_settings, rotary_dim
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
    rope_scaling: dict[str, Any] | None  # rope_config.rope_scaling's parameters; None: plain rope
    attention_bias: bool  # bias on q/k/v projections (Qwen2; gpt-oss also on o_proj)
    qk_norm: bool  # per-head RMSNorm of q and k before rotary (Qwen3)
    tie_word_embeddings: bool
    sliding_window: int | None  # the window of the layers that have one (HF semantics: layer_types.py)
    eos_token_ids: tuple[int, ...]
    moe: MoeConfig | None = None  # mixture-of-experts MLPs (Mixtral, Qwen2-MoE, Qwen3-MoE, gpt-oss); None: dense
    layer_windows: tuple[int, ...] = ()  # per layer: its sliding window in tokens, 0 = full attention
    hidden_act: str = "silu"  # the MLP gate's activation: silu (SwiGLU) or gelu_pytorch_tanh (GeGLU)
    gemma: bool = False  # Gemma 2/3 block: (1 + w) norms, post-attention / post-MLP norms, scaled embeddings
    attn_softcap: float = 0.0  # attention scores -> softcap * tanh(scores / softcap) (Gemma 2); 0: off
    final_softcap: float = 0.0  # logits -> softcap * tanh(logits / softcap); 0: off
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (Gemma); None: head_dim
    # the rope of the windowed layers where it differs from the others' (Gemma 3's local base); None: same
    local_rope_theta: float | None = None
    local_rope_scaling: dict[str, Any] | None = None
    rotary_dim: int = 0  # leading head dims that rotate (< head_dim: partial rotary, Phi-4-mini); 0: all
    o_proj_bias: bool = False  # bias on o_proj (gpt-oss, with attention_bias)
    attention_sinks: bool = False  # a learned per-head logit in each softmax's denominator (gpt-oss)

    @property
    def longrope_threshold(self) -> int | None:
        """LongRoPE's original_max_position_embeddings: a sequence whose prompt is longer than this
        rotates every position with the long factors (see models/rotary.py); None for other ropes."""
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

    @property
    def attn_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def window(self, layer: int) -> int:
        """Layer `layer`'s sliding window in tokens; 0: it attends to the whole context."""
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def kv_window(self) -> int | None:
        """The window when every layer has one (the same): KV older than it is never read again, so
        the block manager can free it. None when any layer attends to the whole context."""
        windows = set(self.layer_windows)
        return windows.pop() if len(windows) == 1 and 0 not in windows and self.layer_windows else None

    @property
    def local_window(self) -> int | None:
        """The window of the local layers of a model mixing full and windowed layers, all windowed
        ones with the same window (Gemma 2 / 3, gpt-oss): their KV lives in a second paged pool whose
        blocks are released behind the window (worker/engine/kv_groups.py). None otherwise."""
        windows = set(self.layer_windows)
        return max(windows) if len(windows) == 2 and 0 in windows else None

    def kv_group(self, layer: int) -> int:
        """The KV cache group of `layer`: 1 for a local layer of a model with `local_window`, else 0."""
        return int(self.local_window is not None and self.window(layer) > 0)

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
        # the windowed layers' own rope where the config gives them one (Gemma 3's local base)
        local = _rope(rope_for(cfg, SLIDING))
        local_differs = has_local_rope(cfg) and local != _rope(rope_for(cfg, FULL))
        bias = bool(cfg.get(BIAS_KEYS.get(arch, "attention_bias"), flags["default_bias"]))
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        windows = layer_windows(cfg, arch)
        window = max(windows, default=0)
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
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", flags.get("gemma", False))),
            sliding_window=window or None,
            eos_token_ids=eos_ids,
            moe=MoeConfig.from_dict(cfg) if flags.get("moe") else None,
            layer_windows=windows,
            hidden_act=hidden_act(cfg),
            gemma=bool(flags.get("gemma")),
            attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
            final_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
            query_pre_attn_scalar=float(cfg["query_pre_attn_scalar"]) if cfg.get("query_pre_attn_scalar") else None,
            local_rope_theta=local["rope_theta"] if local_differs else None,
            local_rope_scaling=None if not local_differs or local["rope_type"] == "default" else local,
            rotary_dim=rotary_dim(cfg) if rotary_dim(cfg) < head_dim else 0,
            o_proj_bias=bias and bool(flags.get("sinks")),
            attention_sinks=bool(flags.get("sinks")),
        )


def _rope(params: dict[str, Any]) -> dict[str, Any]:
    """Rope parameters with rope_type and a float rope_theta always present (comparable dicts)."""
    out = {k: v for k, v in params.items() if k != "type"}
    out["rope_type"] = rope_kind(params)
    out["rope_theta"] = float(params.get("rope_theta", 10000.0))
    return out
