"""The rotary cos/sin table in the kernel layout: row p = cat(cos[p, :D/2], sin[p, :D/2]).

Scaled ropes multiply cos and sin by their attention factor (LongRoPE, YaRN), as transformers does,
so q . k carries its square. Partial rotary (rotary_dim R < D, Phi-4-mini): the table's columns
past R/2 hold cos 1, sin 0 (those pairs pass through), and the q/k head dimensions are permuted
once at load (partial_rotary_order) so that the R rotating dimensions pair up as the kernels pair
them (i with i + D/2); q . k is unchanged by a permutation applied to both.

LongRoPE picks its short or long factors per forward by the sequence length (transformers 5.24:
long iff max(position) + 1 > original_max_position_embeddings). In transformers' generation with a
KV cache, a prompt of at most that length is prefilled with the short factors and each later token
is computed in a forward whose length is its position + 1: tokens at positions >= the threshold get
the long factors, the cached keys before them keep the short ones. A prompt longer than the
threshold is prefilled in one forward with the long factors, so every position of that sequence
(its cached prompt keys and every generated token) is rotated with the long ones. The table holds
both: rows [0, P) by position (short below the threshold, long from it: a prompt that fits), then
rows [P, 2P) long at every position (a prompt longer than the threshold). A long prompt's sequence
computes its prompt (and, after preemption, its recompute) at rows position + P (CausalLM.rope_offset,
decided once from the prompt length, which never changes); its decodes run at positions past the
threshold, where rows p and p + P are equal, so they pass their plain position.
"""

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


def _yarn_inv_freq(dim: int, theta: float, p: dict[str, Any]) -> torch.Tensor:
    """YaRN: interpolated (divided by factor) for long wavelengths, extrapolated (plain) for short,
    a linear ramp between the correction dims of beta_fast and beta_slow rotations."""
    factor, orig = p["factor"], p["original_max_position_embeddings"]

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(p["beta_fast"]), correction_dim(p["beta_slow"])
    if p["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def _plain_inv_freq(dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))  # [dim/2]


def _table(freqs: torch.Tensor, head_dim: int, attention_factor: float) -> torch.Tensor:
    """freqs [P, R/2] (angles) -> [P, D]: scaled cos and sin, pass-through columns past R/2."""
    pad = head_dim // 2 - freqs.shape[1]
    cos = torch.cat([freqs.cos() * attention_factor, freqs.new_ones(freqs.shape[0], pad)], dim=1)
    sin = torch.cat([freqs.sin() * attention_factor, freqs.new_zeros(freqs.shape[0], pad)], dim=1)
    return torch.cat([cos, sin], dim=-1)


def cos_sin_cache(
    head_dim: int, max_positions: int, theta: float, scaling: dict[str, Any] | None, rotary_dim: int | None = None
) -> torch.Tensor:
    """fp32 [max_positions, head_dim], or [2 * max_positions, head_dim] for a LongRoPE table with
    both halves (longrope_offset > 0, module docstring). scaling: ModelConfig.rope_scaling."""
    dim = rotary_dim or head_dim
    kind = None if scaling is None else scaling["rope_type"]
    positions = torch.arange(max_positions, dtype=torch.float32)
    if kind == "longrope":
        base = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        orig = scaling["original_max_position_embeddings"]
        short = 1.0 / (torch.tensor(scaling["short_factor"], dtype=torch.float32) * theta**base)
        long = 1.0 / (torch.tensor(scaling["long_factor"], dtype=torch.float32) * theta**base)
        inv = torch.where((positions >= orig)[:, None], long[None, :], short[None, :])  # [P, R/2]
        table = _table(positions[:, None] * inv, head_dim, scaling["attention_factor"])
        if not longrope_offset(max_positions, scaling):
            return table
        every_long = _table(torch.outer(positions, long), head_dim, scaling["attention_factor"])
        return torch.cat([table, every_long])
    factor = 1.0
    if kind == "yarn":
        inv_freq = _yarn_inv_freq(dim, theta, scaling)
        factor = scaling["attention_factor"]
    else:
        inv_freq = _plain_inv_freq(dim, theta)
        if kind == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, scaling)
        elif kind == "linear":
            inv_freq = inv_freq / float(scaling["factor"])
    return _table(torch.outer(positions, inv_freq), head_dim, factor)


def longrope_offset(max_positions: int, scaling: dict[str, Any] | None) -> int:
    """The rope row offset of a sequence whose prompt is longer than LongRoPE's threshold: max_positions
    when the table has the all-long half (LongRoPE, a threshold below max_positions), else 0 (no prompt
    can be longer than the threshold: nothing to tell apart)."""
    if scaling is None or scaling["rope_type"] != "longrope":
        return 0
    return max_positions if scaling["original_max_position_embeddings"] < max_positions else 0


def partial_rotary_order(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """int64 [head_dim]: new dimension j takes old dimension order[j], so that transformers' pairs
    (i, i + R/2), i < R/2, become the kernels' (j, j + D/2) and the D - R pass-through dimensions fill
    the rest of each half."""
    half, rhalf, rest = head_dim // 2, rotary_dim // 2, (head_dim - rotary_dim) // 2
    first = list(range(rhalf)) + list(range(rotary_dim, rotary_dim + rest))
    second = list(range(rhalf, rotary_dim)) + list(range(rotary_dim + rest, head_dim))
    assert len(first) == len(second) == half  # invariant: rope_problem checked R and D - R even
    return torch.tensor(first + second, dtype=torch.int64)
