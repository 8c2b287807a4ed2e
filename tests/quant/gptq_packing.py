"""The common GPTQ 4-bit packing (AutoGPTQ's "gptq" format), written independently of freight's reader."""

from __future__ import annotations

import torch


def words(nibbles: torch.Tensor) -> torch.Tensor:
    """int64 [..., 8] values in [0, 15] -> int32 words, nibble j in bits 4j..4j+3 (two's complement)."""
    word = sum(nibbles[..., j] << (4 * j) for j in range(8))
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32).contiguous()


def pack_gptq(u: torch.Tensor, scales: torch.Tensor, group_size: int, zero: int = 8,
              v2: bool = False) -> dict[str, torch.Tensor]:
    """Unsigned values u [K, N] in [0, 15] and scales [K/G, N] -> qweight, qzeros, scales, g_idx."""
    k, n = u.shape
    stored_zero = zero if v2 else zero - 1  # format "gptq" stores zero - 1
    return {
        "qweight": words(u.reshape(k // 8, 8, n).permute(0, 2, 1)),  # [K/8, N]: k = 8i + j
        "qzeros": words(torch.full((k // group_size, n // 8, 8), stored_zero)),  # [K/G, N/8]: n = 8c + j
        "scales": scales.half(),
        "g_idx": (torch.arange(k) // group_size).to(torch.int32),
    }


def make_gptq_layer(n: int, k: int, g: int, seed: int = 0, v2: bool = False) -> dict[str, torch.Tensor]:
    """A random symmetric GPTQ layer, plus `weight` [N, K]: the fp32 weight it dequantizes to."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.randint(0, 16, (k, n), generator=gen)
    scales = torch.rand(k // g, n, generator=gen) * 0.02 + 0.001
    layer = pack_gptq(u, scales, g, v2=v2)
    layer["weight"] = (layer["scales"].float()[layer["g_idx"].long()] * (u - 8)).T.contiguous()
    return layer


def gptq_from_weight(weight: torch.Tensor, group_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Symmetric RTN of a real weight [N, K] into GPTQ tensors, and the weight those dequantize to."""
    n, k = weight.shape
    w = weight.float().T  # [K, N]
    scales = (w.reshape(k // group_size, group_size, n).abs().amax(dim=1) / 7).clamp(min=1e-6).half()
    full = scales.float().repeat_interleave(group_size, dim=0)  # [K, N]
    u = torch.clamp(torch.round(w / full), -8, 7).to(torch.int64) + 8
    return pack_gptq(u, scales, group_size), ((u - 8) * full).T.contiguous()
