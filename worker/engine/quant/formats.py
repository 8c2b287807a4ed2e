"""freight's quantized weight layouts and round-to-nearest quantization (ARCHITECTURE.md, Kernel contract).

int8: `qweight` int8 [N, K], `scales` [N]; w[n, k] = qweight[n, k] * scales[n] (symmetric, per
output channel, q in [-127, 127]).
int4: `qweight` uint8 [N, K // 2], `scales` [N, K // G]; byte j of row n holds k = 2j in its low
nibble and k = 2j + 1 in its high nibble, each stored as q + 8 with q in [-8, 7];
w[n, k] = q * scales[n, k // G] (symmetric, group-wise along K).

Scales are float32 here; a checkpoint may store them in the model's dtype.
"""

from __future__ import annotations

import torch

from contracts.quantization import INT4_GROUP_SIZES
from kernels.reference.quant_matmul import pack_int4, unpack_int4

# pack_int4 / unpack_int4 come from the kernels' reference: one definition of the nibble order.
__all__ = [
    "INT4_GROUP_SIZES",
    "check_group_size",
    "dequantize_int4",
    "dequantize_int8",
    "fp16_scales",
    "int4_group_scales",
    "pack_int4",
    "quantize_int4",
    "quantize_int4_values",
    "quantize_int8",
    "unpack_int4",
]



def check_group_size(in_features: int, group_size: int, name: str = "weight") -> None:
    """Raise ValueError unless `group_size` is allowed and divides `in_features`."""
    if group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"int4 group size {group_size} is not supported; use one of {INT4_GROUP_SIZES}")
    if in_features % group_size:
        raise ValueError(
            f"int4 group size {group_size} does not divide {name}'s input dimension {in_features}; "
            f"choose a group size that divides it (allowed: {INT4_GROUP_SIZES})"
        )


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Round to nearest, per output channel: [N, K] float -> (qweight int8 [N, K], scales fp32 [N])."""
    w = weight.float()
    scales = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0  # [N]
    q = torch.clamp(torch.round(w / scales[:, None]), -127, 127).to(torch.int8)
    return q, scales


def dequantize_int8(qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[N, K] int8, [N] -> fp32 [N, K]."""
    return qweight.float() * scales.float()[:, None]


def int4_group_scales(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """Symmetric scales: max |w| of each group over 7 (so the largest maps to +-7), rounded to fp16
    values: fp32 [N, K // G]."""
    n, k = weight.shape
    amax = weight.float().reshape(n, k // group_size, group_size).abs().amax(dim=-1)
    return fp16_scales(amax.clamp(min=1e-8) / 7.0)


def fp16_scales(scales: torch.Tensor) -> torch.Tensor:
    """fp32 scales rounded to the nearest fp16 value (the smallest positive one for those below it):
    the CPU kernels keep an int4 layer's group scales in fp16 when every one is an fp16 value, 2 bytes
    a group of 32-128 weights instead of 4 (what GPTQ checkpoints store). Weights are quantized
    against the rounded scale, so the dequantized values are what the kernels compute; in fp16's
    normal range (scales above 6e-5) a scale moves by at most 2^-11 of itself, and a group's largest
    weight still maps to +-7."""
    tiny = torch.finfo(torch.float16).smallest_normal * 2.0**-10  # the smallest positive fp16
    return scales.half().float().clamp(min=tiny)


def quantize_int4_values(weight: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """Integer values q in [-8, 7] (int8 [N, K]) of `weight` under group `scales` [N, K // G]."""
    full = scales.float().repeat_interleave(group_size, dim=1)  # [N, K]
    return torch.clamp(torch.round(weight.float() / full), -8, 7).to(torch.int8)


def quantize_int4(weight: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Round to nearest, group-wise: [N, K] -> (qweight uint8 [N, K // 2], scales fp32 [N, K // G])."""
    check_group_size(weight.shape[1], group_size)
    scales = int4_group_scales(weight, group_size)
    return pack_int4(quantize_int4_values(weight, scales, group_size)), scales


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """uint8 [N, K // 2], [N, K // G] -> fp32 [N, K]."""
    q = unpack_int4(qweight).float()
    return q * scales.float().repeat_interleave(group_size, dim=1)
