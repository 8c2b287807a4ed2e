"""Weight-only quantized matmuls in Triton: int8 per-channel and int4 group-wise.

The weight tile is loaded packed (1 byte per int8 weight, 1 byte per two int4 weights), turned
into x's dtype in registers and fed to tl.dot; nothing dequantized ever reaches memory. Decode
(small M) is bound by reading the weight once, so it uses narrow N tiles and splits K across
programs to fill the GPU; prefill (large M) is compute bound and uses 128x128 tiles.
Same signatures as kernels/reference/quant_matmul.py. The smallest M (decode at batch 1-4) goes to
the GEMV-shaped kernels of quant_gemv.py instead; `config` picks a kernel explicitly: a
MatmulConfig this file's, a GemvConfig the GEMV (M <= 16).

Integers become floats through fp32 (int -> fp32 -> x's dtype): exact for |q| <= 127, and Triton
3.9's interpreter turns a direct int -> bf16 cast into garbage (bit patterns, not values).
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.checks import (
    FLOAT_DTYPES,
    check_row_scaled_weight,
    check_same_device,
    check_shape,
    check_tensor,
)
from kernels.triton.launch import check_launchable, dot, dot_upcast, num_sms
from kernels.triton.quant_gemv import INT4_GEMV_MAX_M, INT8_GEMV_MAX_M, GemvConfig, int4_gemv, int8_gemv
from kernels.triton.split_k import split_k_bounds, split_k_out, sum_splits


@triton.jit
def _int8_matmul_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    out_ptr,  # x [M, K]; w int8 [N, K]; s [N]; out [SPLIT_K, M, N] or [M, N]
    M,
    N,
    K,
    k_per_split,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_os,
    stride_om,
    stride_on,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < k_hi
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )  # [BM, BK]
        w = tl.load(
            w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk,
            mask=n_mask[None, :] & k_mask[:, None],
            other=0,
        )  # [BK, BN] int8
        acc = dot(x, w.to(tl.float32).to(x.dtype), acc, UPCAST)  # via fp32, see top
    s = tl.load(s_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)  # [BN]
    acc = acc * s[None, :]
    out_ptrs = out_ptr + pid_k * stride_os + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _int4_matmul_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    out_ptr,  # x [M, K]; w uint8 [N, K//2]; s [N, K//G]; out [SPLIT_K, M, N]
    M,
    N,
    K,
    bytes_per_split,  # packed bytes (K / 2) per K split; a multiple of 16 keeps loads 16-byte wide
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_sn,
    stride_sg,
    stride_os,
    stride_om,
    stride_on,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr,
    SCALE_WEIGHTS: tl.constexpr,
):
    # Invariants set by the wrapper: BLOCK_K divides GROUP (one scale per column per K tile),
    # K % GROUP == 0 and 2 * bytes_per_split % BLOCK_K == 0, so K tiles never need a mask.
    HALF_K: tl.constexpr = BLOCK_K // 2
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_j = tl.arange(0, HALF_K)  # byte index inside the K tile
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    j_lo = pid_k * bytes_per_split
    j_hi = tl.minimum(j_lo + bytes_per_split, K // 2)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for j0 in range(j_lo, j_hi, HALF_K):
        k0 = 2 * j0
        # one dense [BM, BK] load of x, split in registers into even and odd k: [BM, BK/2] twice,
        # one for each nibble
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + (k0 + offs_k[None, :]) * stride_xk,
            mask=m_mask[:, None],
            other=0.0,
        )
        x_even, x_odd = tl.split(tl.reshape(x, (BLOCK_M, HALF_K, 2)))
        packed = tl.load(
            w_ptr + offs_n[None, :] * stride_wn + (j0 + offs_j[:, None]) * stride_wk,
            mask=n_mask[None, :],
            other=0x88,
        )  # [BK/2, BN] uint8
        s = tl.load(s_ptr + offs_n * stride_sn + (k0 // GROUP) * stride_sg, mask=n_mask, other=0.0)
        s = s.to(tl.float32)[None, :]  # [1, BN]: one scale per column for the whole K tile
        w_low = ((packed & 0x0F).to(tl.int8) - 8).to(tl.float32)  # k = 2j
        w_high = ((packed >> 4).to(tl.int8) - 8).to(tl.float32)  # k = 2j + 1
        if SCALE_WEIGHTS:  # BM > BK: scaling the [BK/2, BN] weights is cheaper, one accumulator
            acc = dot(x_even, (w_low * s).to(x_even.dtype), acc, UPCAST)
            acc = dot(x_odd, (w_high * s).to(x_even.dtype), acc, UPCAST)
        else:  # small M: scale the [BM, BN] partial product once per K tile
            part = dot(x_even, w_low.to(x_even.dtype), tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), UPCAST)
            part = dot(x_odd, w_high.to(x_even.dtype), part, UPCAST)  # in units of the group's scale
            acc += part * s
    out_ptrs = out_ptr + pid_k * stride_os + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@dataclass(frozen=True)
class MatmulConfig:
    """Tile sizes and K split of one launch (hand-chosen for Hopper-class GPUs)."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int


def choose_config(m: int, n: int, k: int, device: torch.device, group: int | None = None) -> MatmulConfig:
    """Small M (decode): 16-row tiles, narrow N, K split until ~2 programs per SM; the weight read
    dominates. Large M (prefill): 128x128 tiles, no split; the tensor cores dominate."""
    cap_k = group if group is not None else 128
    if m <= 64:
        block_m = 16 if m <= 16 else 32 if m <= 32 else 64
        block_n, block_k = 64, min(128, cap_k)
        tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
        k_tiles = triton.cdiv(k, block_k)
        split_k = max(1, min(k_tiles // 4, triton.cdiv(2 * num_sms(device), tiles)))
        return MatmulConfig(block_m, block_n, block_k, split_k, num_warps=4, num_stages=4)
    block_m, block_n, block_k = 128, 128, min(64, cap_k)
    return MatmulConfig(block_m, block_n, block_k, split_k=1, num_warps=8, num_stages=3)


def _launch(
    kernel, x, qweight, scales, n, k, cfg: MatmulConfig, extra_strides, k_per_unit: int = 1, **meta
) -> torch.Tensor:
    """k_per_unit: K elements per unit of the kernel's split length (2 for int4: bytes)."""
    m = x.shape[0]
    per_split, splits = split_k_bounds(k, cfg.block_k, cfg.split_k)  # in elements
    out = split_k_out(x, n, splits)
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), splits)
    kernel[grid](
        x,
        qweight,
        scales,
        out,
        m,
        n,
        k,
        per_split // k_per_unit,
        x.stride(0),
        x.stride(1),
        qweight.stride(0),
        qweight.stride(1),
        *extra_strides,
        out.stride(0),
        out.stride(1),
        out.stride(2),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        UPCAST=dot_upcast(kernel, x.dtype),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **meta,
    )
    return sum_splits(out, x.dtype)


def int8_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    config: MatmulConfig | GemvConfig | None = None,
) -> torch.Tensor:
    """x [M, K] @ (qweight int8 [N, K] * scales [N, None]).T -> [M, N] in x's dtype."""
    m, k, n = check_row_scaled_weight(x, qweight, torch.int8, scales, FLOAT_DTYPES)
    check_launchable(_int8_matmul_kernel, check_same_device(x=x, qweight=qweight, scales=scales))
    if m == 0 or n == 0 or k == 0:  # nothing to launch (K = 0: zeros, as the reference)
        return x.new_zeros((m, n))
    if isinstance(config, GemvConfig) or (config is None and m <= INT8_GEMV_MAX_M):
        return int8_gemv(x, qweight, scales, config)
    cfg = config or choose_config(m, n, k, x.device)
    return _launch(_int8_matmul_kernel, x, qweight, scales, n, k, cfg, ())


def int4_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    config: MatmulConfig | GemvConfig | None = None,
) -> torch.Tensor:
    """x [M, K] @ dequant(qweight uint8 [N, K // 2], scales [N, K // G]).T -> [M, N] in x's dtype."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("qweight", qweight, ndim=2, dtypes=(torch.uint8,))
    check_tensor("scales", scales, ndim=2, dtypes=FLOAT_DTYPES)
    m, k = x.shape
    n = qweight.shape[0]
    if not isinstance(group_size, int) or group_size < 32 or group_size & (group_size - 1):
        raise ValueError(f"group_size must be a power of two >= 32 (32, 64, 128 ...), got {group_size!r}")
    if k % group_size:
        raise ValueError(f"K ({k}) must be a multiple of group_size ({group_size}); pad the weight's K")
    check_shape("qweight", qweight, (n, k // 2))
    check_shape("scales", scales, (n, k // group_size))
    check_launchable(_int4_matmul_kernel, check_same_device(x=x, qweight=qweight, scales=scales))
    if m == 0 or n == 0 or k == 0:  # nothing to launch (K = 0: zeros, as the reference)
        return x.new_zeros((m, n))
    if isinstance(config, GemvConfig) or (config is None and m <= INT4_GEMV_MAX_M):
        return int4_gemv(x, qweight, scales, group_size, config)
    cfg = config or choose_config(m, n, k, x.device, group=group_size)
    if group_size % cfg.block_k or cfg.block_k < 32:
        raise ValueError(f"block_k ({cfg.block_k}) must divide group_size ({group_size}) and be >= 32")
    return _launch(
        _int4_matmul_kernel,
        x,
        qweight,
        scales,
        n,
        k,
        cfg,
        (scales.stride(0), scales.stride(1)),
        k_per_unit=2,
        GROUP=group_size,
        SCALE_WEIGHTS=cfg.block_m > cfg.block_k,
    )
