"""FP8 (e4m3) matmul with per-output-channel weight scales and dynamic per-token activation scales.

Layout (docs/ARCHITECTURE.md, "Kernel contract"): qweight float8_e4m3fn [N, K], scales fp32 [N];
w[n, k] = qweight[n, k] * scales[n]. Each call quantizes x the same way, row by row:
scale[m] = max_k |x[m, k]| / 448 (448: the largest e4m3 value), x8 = e4m3(x / scale[m]) rounded
to nearest even; out[m, n] = scale_x[m] * scales[n] * sum_k x8[m, k] * qweight[n, k], which is
what torch._scaled_mm computes on the GPU with row-wise scales. These references run on any
device torch can cast float8 on (CPU included) and compute in fp32.
"""

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
MIN_SCALE = 1e-12 / FP8_MAX  # the scale of an all-zero row (keeps the division finite)


def quantize_fp8_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, K] float -> (float8_e4m3fn [R, K], fp32 scales [R]) with t ~= q * scales[:, None]: each
    row's largest magnitude maps to 448. Weights (per output channel) and activations (per token)
    alike."""
    t = t.float()
    scales = (t.abs().amax(dim=1) / FP8_MAX).clamp_min(MIN_SCALE)  # [R]
    q = (t / scales[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scales


def round_to_e4m3(v: torch.Tensor) -> torch.Tensor:
    """fp32 v with |v| <= 448 -> the nearest e4m3 value (ties to even), as fp32: the same values as
    `v.to(float8_e4m3fn).float()` in vectorized fp32 arithmetic, where torch's float8 casts on the CPU
    are scalar code (bench/quant_speed.py times the fp8 Linear).
    For |v| in [2^e, 2^(e+1)), c = 2^(e+20) leaves 3 fraction bits in |v| + c, so (|v| + c) - c
    rounds to e4m3's spacing 2^(e-3); below its smallest normal 2^-6, c = 2^14: spacing 2^-9."""
    c = (v.view(torch.int32) & 0x7F800000).view(torch.float32).mul(2.0**20).clamp_min_(2.0**14)
    return v.abs().add_(c).sub_(c).copysign_(v)


def fp8_matmul_dequantized(x: torch.Tensor, weight_fp8_values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp8_matmul with the weight's e4m3 values already widened to fp32 [N, K] (unscaled): the CPU
    execution path widens them once at load instead of on every call, and rounds x to the e4m3
    grid in fp32 (round_to_e4m3) instead of through the float8 dtype."""
    xf = x.float()
    x_scales = (xf.abs().amax(dim=1) / FP8_MAX).clamp_min(MIN_SCALE)  # [M], as quantize_fp8_rows
    x8 = round_to_e4m3((xf / x_scales[:, None]).clamp_(-FP8_MAX, FP8_MAX))  # e4m3 values, fp32
    acc = x8 @ weight_fp8_values.T  # [M, N]: products of e4m3 values, summed in fp32
    return (acc * x_scales[:, None] * scales.float()[None, :]).to(x.dtype)


def fp8_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ (qweight e4m3 [N, K] * scales [N, None]).T with x quantized to e4m3 per row
    -> [M, N] in x's dtype."""
    x8, x_scales = quantize_fp8_rows(x)
    acc = x8.float() @ qweight.float().T  # [M, N]: products of e4m3 values, summed in fp32
    return (acc * x_scales[:, None] * scales.float()[None, :]).to(x.dtype)
