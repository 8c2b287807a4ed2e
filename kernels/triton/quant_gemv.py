"""GEMV-shaped weight-only quantized matmuls for small M (decode): int8 per channel, int4 per group.

At M <= 16 a quantized matmul is bound by reading the weight once, so these kernels give every
thread whole weight rows (16 packed bytes per row and load: 16 int8 or 32 int4 weights), convert
them in registers, and reduce along K inside the thread: no tl.dot, no tensor-core tile to fill
with padding rows, no cross-thread reduction or shared memory in the loop. Each weight row
segment is read once and used for all M rows of x (a static loop over M; x comes from L1/L2 as
a broadcast load). Programs split K when the N tiles alone cannot fill the GPU (fp32 partials,
summed after). The work per weight is ~3 instructions of conversion plus ~1.5 per row of x (the
multiply-add and its share of the sum), so on an H200 they are bound by the weight read only at M
1-2 and by issue slots beyond, growing with M where the tensor-core kernel of quant_matmul.py does
not: the wrappers use them up to INT4_GEMV_MAX_M / INT8_GEMV_MAX_M, and bench/gpu_check.py times
both kernels at every M.

Layouts are the kernel contract's (docs/ARCHITECTURE.md): int8 qweight [N, K], scales [N];
int4 qweight uint8 [N, K // 2] (k = 2j in byte j's low nibble, 2j + 1 in its high one, each q + 8),
scales [N, K // G]. Integers become floats by placing them in the mantissa of 2^23 and subtracting
(exact; no int-to-float convert instruction, which runs at a quarter of the FMA rate).
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.triton.launch import num_sms
from kernels.triton.split_k import split_k_bounds, split_k_out, sum_splits

GEMV_MAX_M = 16  # the most rows of x these kernels take
# Where the wrappers use them (config=None), until a GPU run of bench/gpu_check.py (which times
# both kernels at M 1-16) moves these: the GEMV's sm_90 issue-slot floor (bench/compile_check.py:
# int4 6.0 / 7.7 / 11.0 / 17.6 SASS instructions a weight at M 1 / 2 / 4 / 8, ~1.76 us each on
# 14336 x 4096 on an H200: 11 / 14 / 19 / 31 us) against the tensor-core kernel's one measured time
# there, 41-43 us at M 1-16 (docs/PERFORMANCE.md): the GEMV until its floor nears that at M 8.
# int8: its floor (5.4 / 7.8 / 12.0: 10 / 14 / 21 us) meets the weight read (~14 us) at M 2, past
# which the tensor-core kernel (4.4 a weight, the same read) should not be slower.
INT4_GEMV_MAX_M = 4
INT8_GEMV_MAX_M = 2


@triton.jit
def _accumulate(acc, part, offs_m, m: tl.constexpr):
    """acc[:, m] += part: acc [BN, BM] holds every row of x in each thread, so with m a constant
    this folds to one add per weight row (no select survives compilation)."""
    return tl.where(offs_m[None, :] == m, acc + part[:, None], acc)


@triton.jit
def _int8_to_f32(w):
    """int8 -> fp32 without the quarter-rate int-to-float convert: the bits 0x4B000000 + (w + 128)
    are the float 2^23 + 128 + w, exactly."""
    return (w.to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0


@triton.jit
def _nibble_to_f32(u):
    """A stored nibble u = q + 8 in [0, 15] (int32) -> q as fp32: 2^23 + u minus 2^23 + 8, exactly."""
    return (u | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0


@triton.jit
def _int8_gemv_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    out_ptr,  # x [M, K]; w int8 [N, K]; s [N]; out [SPLIT_K, M, N] (fp32 partials) or [M, N]
    M,
    N,
    K,
    k_per_split,  # K elements per split, a multiple of 32
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_os,
    stride_om,
    stride_on,
    BLOCK_M: tl.constexpr,  # M rounded up to a power of two
    BLOCK_N: tl.constexpr,  # weight rows per program: 32 * num_warps * rows per thread
):
    # Each step takes two 16-weight chunks per row (a, b: one 16-byte load each) and multiplies
    # them elementwise into one [BN, 16] chain before the in-thread sum: ~1 FMA per MAC plus 15
    # adds per 32 MACs. With K, k_per_split and so k_hi multiples of 16 (launch specialization)
    # the K masks are constant over each vector and the loads stay 16 bytes wide; other K still
    # work, with element loads.
    VEC: tl.constexpr = 16
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_v = tl.arange(0, VEC)
    offs_m = tl.arange(0, BLOCK_M)
    n_mask = offs_n < N
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    w_rows = w_ptr + offs_n[:, None] * stride_wn  # [BN, 1]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, 2 * VEC):
        ka = tl.multiple_of(k0, 2 * VEC) + offs_v  # [16]; steps start 32-element aligned
        kb = ka + VEC
        a_ok = ka < k_hi
        b_ok = kb < k_hi
        wa = tl.load(w_rows + ka[None, :] * stride_wk, mask=n_mask[:, None] & a_ok[None, :], other=0)
        wb = tl.load(w_rows + kb[None, :] * stride_wk, mask=n_mask[:, None] & b_ok[None, :], other=0)
        wa = _int8_to_f32(wa)  # [BN, 16]
        wb = _int8_to_f32(wb)
        for m in tl.static_range(BLOCK_M):
            if m < M:  # uniform branch: the padding rows of BLOCK_M cost nothing
                xa = tl.load(x_ptr + m * stride_xm + ka * stride_xk, mask=a_ok, other=0.0).to(tl.float32)
                xb = tl.load(x_ptr + m * stride_xm + kb * stride_xk, mask=b_ok, other=0.0).to(tl.float32)
                part = tl.sum(wa * xa[None, :] + wb * xb[None, :], axis=1)  # [BN], in the thread
                acc = _accumulate(acc, part, offs_m, m)
    s = tl.load(s_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    acc = acc * s[:, None]
    out_ptrs = out_ptr + pid_k * stride_os + offs_m[None, :] * stride_om + offs_n[:, None] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(offs_m[None, :] < M) & n_mask[:, None])


@triton.jit
def _int4_gemv_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    out_ptr,  # x [M, K]; w uint8 [N, K // 2]; s [N, K // G]; out [SPLIT_K, M, N] or [M, N]
    M,
    N,
    K,
    bytes_per_split,  # packed bytes (K / 2) per split, a multiple of 16
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
):
    # Each step takes one 16-byte chunk per row: 32 weights, the low nibbles (even k) and the high
    # ones (odd k), multiplied into one [BN, 16] chain before the in-thread sum. K % GROUP == 0
    # and GROUP >= 32 (the wrapper checks): a chunk lies in one group and wholly inside the split
    # or wholly outside, so no load needs a K mask.
    VEC: tl.constexpr = 16
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_j = tl.arange(0, VEC)  # byte within the chunk
    offs_k = tl.arange(0, 2 * VEC)  # weight within the chunk
    offs_m = tl.arange(0, BLOCK_M)
    n_mask = offs_n < N
    j_lo = pid_k * bytes_per_split
    j_hi = tl.minimum(j_lo + bytes_per_split, K // 2)
    w_rows = w_ptr + offs_n[:, None] * stride_wn
    s_rows = s_ptr + offs_n * stride_sn
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for j0 in range(j_lo, j_hi, VEC):
        j = tl.multiple_of(j0, VEC)  # chunks start 16-byte aligned: whole vector loads
        packed = tl.load(w_rows + (j + offs_j[None, :]) * stride_wk, mask=n_mask[:, None], other=0x88)
        packed = packed.to(tl.int32)  # [BN, 16], zero-extended bytes
        w_low = _nibble_to_f32(packed & 0x0F)  # k = 2j
        w_high = _nibble_to_f32(packed >> 4)  # k = 2j + 1
        s = tl.load(s_rows + ((2 * j) // GROUP) * stride_sg, mask=n_mask, other=0.0).to(tl.float32)
        kk = 2 * j + offs_k  # [32]
        for m in tl.static_range(BLOCK_M):
            if m < M:  # uniform branch: the padding rows of BLOCK_M cost nothing
                # one dense load of the chunk's 32 x values, split into even and odd k in registers
                xm = tl.load(x_ptr + m * stride_xm + kk * stride_xk).to(tl.float32)
                x_even, x_odd = tl.split(tl.reshape(xm, (VEC, 2)))
                part = tl.sum(w_low * x_even[None, :] + w_high * x_odd[None, :], axis=1)  # [BN]
                acc = _accumulate(acc, part * s, offs_m, m)
    out_ptrs = out_ptr + pid_k * stride_os + offs_m[None, :] * stride_om + offs_n[:, None] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(offs_m[None, :] < M) & n_mask[:, None])


@dataclass(frozen=True)
class GemvConfig:
    """Launch of the small-M kernels: weight rows per program, K split, warps. block_n must be a
    multiple of 32 * num_warps: each thread owns block_n / (32 * num_warps) whole rows."""

    block_n: int
    split_k: int
    num_warps: int

    def __post_init__(self) -> None:
        if self.num_warps < 1 or self.block_n < 1 or self.block_n % (32 * self.num_warps) or self.split_k < 1:
            raise ValueError(
                f"GemvConfig needs block_n a positive multiple of 32 * num_warps and split_k >= 1, "
                f"got {self}"
            )


def choose_gemv_config(n: int, k_units: int, step: int, device: torch.device) -> GemvConfig:
    """128 rows per program (one warp, 4 rows per thread: each x value a thread converts serves four
    rows; one warp per program compiles to the fewest loop instructions per weight of the shapes
    bench/compile_check.py tries) and K splits for ~8 programs (warps) per SM, which their ~200
    registers allow: latency is hidden by programs in flight, not by a pipeline, and 8 warps of 4
    rows x 16-32 bytes a step keep ~16-32 KiB in flight per SM. Each split keeps >= 8 loop steps.
    k_units / step: the kernel's K loop (int8: 32 elements a step; int4: 16 packed bytes)."""
    block_n, num_warps = 128, 1
    tiles = triton.cdiv(n, block_n)
    by_occupancy = triton.cdiv(8 * num_sms(device), tiles)
    by_work = max(1, k_units // (8 * step))
    return GemvConfig(block_n, max(1, min(by_occupancy, by_work)), num_warps)


def _block_m(m: int) -> int:
    if not 1 <= m <= GEMV_MAX_M:
        raise ValueError(f"the GEMV kernels take 1 <= M <= {GEMV_MAX_M} rows, got M={m}; use a MatmulConfig")
    return triton.next_power_of_2(m)


def int8_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, cfg: GemvConfig | None) -> torch.Tensor:
    """x [M, K] @ (qweight int8 [N, K] * scales[:, None]).T for M <= 16; arguments already checked."""
    (m, k), n = x.shape, qweight.shape[0]
    cfg = cfg or choose_gemv_config(n, k, 32, x.device)
    per_split, splits = split_k_bounds(k, 32, cfg.split_k)  # K loop step: 32 elements
    out = split_k_out(x, n, splits)
    _int8_gemv_kernel[(triton.cdiv(n, cfg.block_n), splits)](
        x, qweight, scales, out, m, n, k, per_split,
        x.stride(0), x.stride(1), qweight.stride(0), qweight.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        BLOCK_M=_block_m(m), BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=1,
    )  # fmt: skip
    return sum_splits(out, x.dtype)


def int4_gemv(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int, cfg: GemvConfig | None
) -> torch.Tensor:
    """x [M, K] @ dequant(qweight uint8 [N, K // 2], scales [N, K // G]).T for M <= 16; arguments
    already checked (K % G == 0, G a power of two >= 32)."""
    (m, k), n = x.shape, qweight.shape[0]
    cfg = cfg or choose_gemv_config(n, k // 2, 16, x.device)
    per_split, splits = split_k_bounds(k // 2, 16, cfg.split_k)  # K loop step: 16 packed bytes
    out = split_k_out(x, n, splits)
    _int4_gemv_kernel[(triton.cdiv(n, cfg.block_n), splits)](
        x, qweight, scales, out, m, n, k, per_split,
        x.stride(0), x.stride(1), qweight.stride(0), qweight.stride(1), scales.stride(0), scales.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        GROUP=group_size, BLOCK_M=_block_m(m), BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=1,
    )  # fmt: skip
    return sum_splits(out, x.dtype)
