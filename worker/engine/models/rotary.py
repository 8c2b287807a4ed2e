"""The rotary cos/sin table in the kernel layout: row p = cat(cos[p, :D/2], sin[p, :D/2])."""

from __future__ import annotations

import math
from typing import Any

import torch


def _llama3_inv_freq(inv_freq: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    """Llama 3.x frequency scaling: long wavelengths divided by `factor`, a smooth band between."""
    factor = float(p["factor"])
    low, high = float(p.get("low_freq_factor", 1.0)), float(p.get("high_freq_factor", 4.0))
    old_len = float(p["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, smoothed, scaled)


def cos_sin_cache(
    head_dim: int, max_positions: int, theta: float, scaling: dict[str, Any] | None
) -> torch.Tensor:
    """fp32 [max_positions, head_dim]."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)  # [D/2]
    if scaling is not None and scaling["rope_type"] == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, scaling)
    elif scaling is not None and scaling["rope_type"] == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)  # [P, D/2]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)
