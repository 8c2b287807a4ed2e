"""The rotary embedding's settings from config.json, whichever key and transformers version wrote them.

Plain data, no torch (jobs/model_check.py reads it through architectures.config_problem). The
engine's rope table (worker/engine/models/rotary.py) takes the normalized dict `rope_scaling` returns: every
derived number (LongRoPE's and YaRN's attention factor, the threshold between LongRoPE's short and
long factors) is computed here once, from the same keys and defaults as transformers 5.24's
modeling_rope_utils.
"""

from __future__ import annotations

import math
from typing import Any

ROPE_TYPES = ("default", "llama3", "linear", "longrope", "yarn")
# Phi-3's configuration maps the older names of LongRoPE to it (transformers' Phi3Config does the same)
_PHI3_ALIASES = {"su": "longrope", "yarn": "longrope"}


def rope_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """The rope parameters, whichever key the config uses (transformers 5 `rope_parameters`, or 4's);
    where transformers 5 nests them per layer type (Gemma 3), the full-attention layers' (the windowed
    layers' own: layer_types.rope_for)."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
        params = params["full_attention"]
    return dict(params)


def rope_type(cfg: dict[str, Any]) -> str:
    rope = rope_settings(cfg)
    kind = str(rope.get("rope_type", rope.get("type", "default")))
    if "Phi3ForCausalLM" in (cfg.get("architectures") or []):
        kind = _PHI3_ALIASES.get(kind, kind)
    return kind


def head_dim(cfg: dict[str, Any]) -> int:
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def rotary_dim(cfg: dict[str, Any]) -> int:
    """Dimensions of each head that rotate (the first ones): head_dim * partial_rotary_factor."""
    factor = rope_settings(cfg).get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    return int(head_dim(cfg) * float(factor if factor is not None else 1.0))


def _original_len(cfg: dict[str, Any]) -> Any:
    return rope_settings(cfg).get("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))


def rope_problem(cfg: dict[str, Any]) -> str | None:
    """Why the engine cannot build this config's rotary embedding, or None. Assumes the shape keys
    were checked (architectures.config_problem)."""
    kind = rope_type(cfg)
    if kind not in ROPE_TYPES:
        return f"config.json: rope type {kind!r} is not supported; freight supports {', '.join(ROPE_TYPES)}"
    dim, rot = head_dim(cfg), rotary_dim(cfg)
    if not 2 <= rot <= dim or rot % 2 or (dim - rot) % 2:
        return f"config.json: partial_rotary_factor gives {rot} rotary dimensions of head_dim {dim}; need an even number"
    rope = rope_settings(cfg)
    if kind in ("longrope", "yarn"):
        orig = _original_len(cfg)
        if isinstance(orig, bool) or not isinstance(orig, int) or orig <= 0:
            return f"config.json: {kind} rope needs original_max_position_embeddings (a positive integer), not {orig!r}"
    if kind == "longrope":
        for key in ("short_factor", "long_factor"):
            factors = rope.get(key)
            if not isinstance(factors, list) or len(factors) != rot // 2:
                return f"config.json: longrope {key} must list {rot // 2} numbers (rotary dimensions / 2)"
    if kind == "yarn" and rope.get("factor") is None:
        return "config.json: yarn rope needs a factor"
    return None


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_scaling(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The normalized scaling parameters of a config rope_problem accepted; None for plain rope.

    longrope: short_factor, long_factor, original_max_position_embeddings, attention_factor;
    yarn: factor, beta_fast, beta_slow, truncate, original_max_position_embeddings, attention_factor;
    llama3 / linear: their keys as written."""
    kind = rope_type(cfg)
    rope = rope_settings(cfg)
    if kind == "default":
        return None
    if kind not in ("longrope", "yarn"):
        return {**rope, "rope_type": kind}
    orig = int(_original_len(cfg))
    factor = rope.get("factor")
    if factor is None:  # Phi-3: the ratio of the extended to the pretrained context
        factor = int(cfg.get("max_position_embeddings", 2048)) / orig
    factor = float(factor)
    attention = rope.get("attention_factor")
    if kind == "longrope":
        if attention is None:
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        return {
            "rope_type": kind, "short_factor": [float(f) for f in rope["short_factor"]],
            "long_factor": [float(f) for f in rope["long_factor"]], "original_max_position_embeddings": orig,
            "attention_factor": float(attention),
        }  # fmt: skip
    if attention is None:
        mscale, mscale_all = rope.get("mscale"), rope.get("mscale_all_dim")
        attention = (
            _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all) if mscale and mscale_all
            else _yarn_mscale(factor)
        )  # fmt: skip
    return {
        "rope_type": kind, "factor": factor, "beta_fast": float(rope.get("beta_fast") or 32),
        "beta_slow": float(rope.get("beta_slow") or 1), "truncate": bool(rope.get("truncate", True)),
        "original_max_position_embeddings": orig, "attention_factor": float(attention),
    }  # fmt: skip
