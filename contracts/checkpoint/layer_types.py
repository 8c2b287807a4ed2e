"""Per-layer attention facts of a config.json: which layers attend through a sliding window, and the
rope parameters of each layer type (Gemma 3's local layers rotate with their own base). No torch:
architectures.config_problem (run by jobs/ before a job is planned) reads this module too.

Window semantics are Hugging Face's (masking_utils.sliding_window_overlay): with window W, the query
at position p sees keys j with p - W < j <= p, i.e. its last W positions, itself included.
"""

from __future__ import annotations

from typing import Any

SLIDING = "sliding_attention"
FULL = "full_attention"
# Architectures whose configs written before `layer_types` existed imply a layout of their own:
# Gemma 2 alternates (layer 0 local), Gemma 3 has `sliding_window_pattern` - 1 local layers per global.
_ALTERNATING = {"Gemma2ForCausalLM": 2}
_PATTERN_KEY = {"Gemma3ForCausalLM": ("sliding_window_pattern", 6)}


def _num_layers(cfg: dict[str, Any]) -> int:
    n = cfg.get("num_hidden_layers")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


def layer_types(cfg: dict[str, Any], arch: str) -> list[str]:
    """FULL or SLIDING per layer: config.json's `layer_types` when it has them, else the layout the
    architecture's older configs imply (Qwen2: layers >= max_window_layers when use_sliding_window;
    Mistral and the rest: every layer when sliding_window is set)."""
    n = _num_layers(cfg)
    window = cfg.get("sliding_window")
    if not window or cfg.get("use_sliding_window") is False:
        return [FULL] * n
    given = cfg.get("layer_types")
    if isinstance(given, list):
        return [str(t) for t in given]
    if arch in _ALTERNATING:
        every = _ALTERNATING[arch]
        return [SLIDING if (i + 1) % every else FULL for i in range(n)]
    if arch in _PATTERN_KEY:
        key, default = _PATTERN_KEY[arch]
        every = int(cfg.get(key) or default)
        return [SLIDING if (i + 1) % every else FULL for i in range(n)]
    first = cfg.get("max_window_layers")
    first = first if isinstance(first, int) and "use_sliding_window" in cfg else 0
    return [SLIDING if i >= first else FULL for i in range(n)]


def layer_windows(cfg: dict[str, Any], arch: str) -> tuple[int, ...]:
    """Per layer: the sliding window in tokens, or 0 for full attention."""
    window = int(cfg.get("sliding_window") or 0)
    return tuple(window if t == SLIDING else 0 for t in layer_types(cfg, arch))


def layer_types_problem(cfg: dict[str, Any], arch: str) -> str | None:
    """Why the window layout of config.json cannot be built, or None."""
    window = cfg.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 0):
        return f"config.json: sliding_window must be a positive integer, 0 or null (no window), not {window!r}"
    types = layer_types(cfg, arch)
    if len(types) != _num_layers(cfg):
        return f"config.json: layer_types lists {len(types)} layers but num_hidden_layers is {_num_layers(cfg)}"
    unknown = sorted(set(types) - {SLIDING, FULL})
    if unknown:
        return f"config.json: layer_types {unknown} are not supported; freight supports {FULL!r} and {SLIDING!r}"
    return None


def flat_rope(cfg: dict[str, Any]) -> dict[str, Any]:
    """The rope parameters of a config with one rope for every layer (transformers 5 `rope_parameters`,
    or 4's `rope_scaling`), with rope_theta filled in from the top level where it lives there."""
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if "rope_theta" not in rope and cfg.get("rope_theta") is not None:
        rope["rope_theta"] = cfg["rope_theta"]
    return rope


def rope_for(cfg: dict[str, Any], layer_type: str) -> dict[str, Any]:
    """The rope parameters of one layer type: transformers 5 nests them per layer type (Gemma 3:
    {"sliding_attention": {...}, "full_attention": {...}}); older Gemma 3 configs give the local
    layers `rope_local_base_freq` (plain rope) and the global ones rope_theta / rope_scaling."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get(layer_type), dict):
        return dict(params[layer_type])
    if layer_type == SLIDING and cfg.get("rope_local_base_freq") is not None:
        return {"rope_type": "default", "rope_theta": cfg["rope_local_base_freq"]}
    if isinstance(params, dict) and isinstance(params.get(FULL), dict):
        return dict(params[FULL])
    return flat_rope(cfg)


def has_local_rope(cfg: dict[str, Any]) -> bool:
    """Whether config.json gives the windowed layers a rope of their own (Gemma 3)."""
    params = cfg.get("rope_parameters")
    nested = isinstance(params, dict) and isinstance(params.get(SLIDING), dict)
    return nested or cfg.get("rope_local_base_freq") is not None


def rope_kind(rope: dict[str, Any]) -> str:
    return str(rope.get("rope_type", rope.get("type", "default")))
