"""Rotary position embedding, rotate-half (Llama / GPT-NeoX) style, applied in place."""

import torch


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] in place at positions int64 [T].

    cos_sin_cache [max_pos, D]: row p = cat(cos[p, :D/2], sin[p, :D/2]).
    """
    half = q.shape[-1] // 2
    cos_sin = cos_sin_cache.index_select(0, positions.long())  # [T, D]
    cos = cos_sin[:, None, :half]  # [T, 1, D/2]
    sin = cos_sin[:, None, half:]
    for x in (q, k):
        x1 = x[..., :half].float()
        x2 = x[..., half:].float()
        rot1 = x1 * cos - x2 * sin
        rot2 = x2 * cos + x1 * sin
        x[..., :half] = rot1.to(x.dtype)
        x[..., half:] = rot2.to(x.dtype)
