"""MXFP4 (OCP microscaling FP4), as gpt-oss checkpoints store their expert weights: dequantized at load.

A block of 32 consecutive values along a row shares one scale, 2 ** (scale - 127) (an E8M0 byte);
each value is an FP4 E2M1 code, two per byte, the low nibble first. Checkpoints hold `*_blocks`
uint8 [..., G, 16] (G = columns / 32) and `*_scales` uint8 [..., G]. freight has no MXFP4 matmul on
any device, so the engine dequantizes every such tensor when it loads it (on the CPU, one expert at a
time) and runs the experts in the model dtype, or in a format EngineConfig.quantization asks for.
"""

from __future__ import annotations

import torch

# FP4 E2M1: sign bit, 2 exponent bits, 1 mantissa bit; code -> value
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCK = 32  # values per shared scale
SCALE_BIAS = 127


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """blocks uint8 [..., G, 16], scales uint8 [..., G] -> fp32 [..., G * 32] (exact: every value is
    an FP4 value times a power of two)."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}")
    if blocks.shape[-1] != BLOCK // 2 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise ValueError(
            f"MXFP4 blocks {tuple(blocks.shape)} do not match scales {tuple(scales.shape)} "
            f"(want blocks [..., G, {BLOCK // 2}] and scales [..., G])"
        )
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).long()  # [..., G, 16, 2]: low nibble first
    values = lut[codes].reshape(*blocks.shape[:-1], BLOCK)  # [..., G, 32]
    exponents = (scales.to(torch.int32) - SCALE_BIAS)[..., None]
    return torch.ldexp(values, exponents).reshape(*blocks.shape[:-2], -1)
