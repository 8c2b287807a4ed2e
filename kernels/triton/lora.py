"""The gathered LoRA product in Triton, segmented by adapter (SGMV), with the signatures of
kernels/reference/lora.py.

Tokens are sorted by slot into blocks of BLOCK_M rows, each block padded to one slot (`plan_slots`:
fused_moe.align_blocks over the slots, base tokens (-1) an extra group whose blocks are skipped;
torch ops on the device, no host read, so a CUDA graph can hold it). Each program of the two launches
takes one block and one column tile:
1. shrink: the block's rows of x (gathered by token index) times the slot's A tile, summed over K in
   fp32 -> h [T, L * R] (fp32), written in token order;
2. expand: the block's rows of h times the slot's B tile for each slice the column tile meets, times
   the slice's scaling, added to out in place (each (token, column) belongs to one program: no atomics).
A plan is made once per step and shared by every projection of every layer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.checks import (
    FLOAT_DTYPES,
    check_last_dim_contiguous,
    check_same_device,
    check_shape,
    check_tensor,
)
from kernels.triton.fused_moe import align_blocks, block_matmul, block_tile
from kernels.triton.launch import check_launchable, dot, dot_upcast

BLOCK_M = 16  # token rows per block: decode steps hold few tokens of each adapter
Plan = tuple[torch.Tensor, torch.Tensor]


def plan_slots(slots: torch.Tensor, num_slots: int) -> Plan:
    """(rows int32 [B * BLOCK_M]: token indices grouped by slot, each slot's run padded to whole
    blocks with the sentinel T; block_slots int32 [B]: each block's slot, -1 for base tokens' blocks
    and unused ones). No host read."""
    ids = torch.where(slots < 0, num_slots, slots.long())  # base tokens: one more group, skipped
    rows, block_slots = align_blocks(ids[:, None], num_slots + 1, BLOCK_M)
    return rows, torch.where(block_slots == num_slots, -1, block_slots)


@triton.jit
def _shrink_kernel(
    x_ptr, a_ptr, h_ptr, rows_ptr, slots_ptr,  # x [T, K]; a [S, LR, K]; h [T, LR] fp32
    num_tokens, k_size, lr_size,
    stride_xt, stride_xk, stride_as, stride_ar, stride_ak, stride_ht, stride_hr,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    slot, token, valid, offs_r = block_tile(rows_ptr, slots_ptr, num_tokens, BLOCK_M, BLOCK_R)
    if slot < 0:
        return
    r_mask = offs_r < lr_size
    a_base = a_ptr + slot.to(tl.int64) * stride_as
    acc = block_matmul(x_ptr, token.to(tl.int64), valid, stride_xt, stride_xk, a_base, offs_r, r_mask, stride_ar,
                       stride_ak, k_size, BLOCK_M, BLOCK_R, BLOCK_K, UPCAST)  # fmt: skip
    h_ptrs = h_ptr + token[:, None].to(tl.int64) * stride_ht + offs_r[None, :] * stride_hr
    tl.store(h_ptrs, acc, mask=valid[:, None] & r_mask[None, :])


@triton.jit
def _expand_kernel(
    h_ptr, b_ptr, scale_ptr, out_ptr, rows_ptr, slots_ptr,  # h [T, LR]; b [S, N, R]; out [T, N]
    num_tokens, n_size, rank, bound1, bound2,  # slice i's columns: [bound_i, bound_{i+1}), bound_0 = 0
    stride_ht, stride_hr, stride_bs, stride_bn, stride_br, stride_ss, stride_sl, stride_ot, stride_on,
    SLICES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    slot, token, valid, offs_n = block_tile(rows_ptr, slots_ptr, num_tokens, BLOCK_M, BLOCK_N)
    if slot < 0:
        return
    n0 = tl.program_id(1) * BLOCK_N
    offs_r = tl.arange(0, BLOCK_R)
    r_mask = offs_r < rank
    b_base = b_ptr + slot.to(tl.int64) * stride_bs
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in tl.static_range(SLICES):
        lo = 0 if i == 0 else (bound1 if i == 1 else bound2)
        hi = n_size if i == SLICES - 1 else (bound1 if i == 0 else bound2)
        if (n0 < hi) & (n0 + BLOCK_N > lo):  # the column tile meets slice i
            cols = (offs_n >= lo) & (offs_n < hi)
            hs = tl.load(h_ptr + token[:, None].to(tl.int64) * stride_ht + (i * rank + offs_r[None, :]) * stride_hr,
                         mask=valid[:, None] & r_mask[None, :], other=0.0)  # fmt: skip
            bt = tl.load(b_base + offs_n[None, :] * stride_bn + offs_r[:, None] * stride_br,
                         mask=cols[None, :] & r_mask[:, None], other=0.0)  # [BR, BN]  # fmt: skip
            part = dot(hs.to(bt.dtype), bt, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), UPCAST)
            acc += part * tl.load(scale_ptr + slot.to(tl.int64) * stride_ss + i * stride_sl)
    mask = valid[:, None] & (offs_n < n_size)[None, :]
    out_ptrs = out_ptr + token[:, None].to(tl.int64) * stride_ot + offs_n[None, :] * stride_on
    prev = tl.load(out_ptrs, mask=mask, other=0.0)
    tl.store(out_ptrs, (prev.to(tl.float32) + acc).to(out_ptr.dtype.element_ty), mask=mask)


def _block(n: int, lo: int = 16, hi: int = 64) -> int:
    return max(lo, min(hi, triton.next_power_of_2(n)))


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor, plan: Plan | None = None) -> torch.Tensor:
    """x [T, K], a [S, L * R, K], slots int [T] -> h fp32 [T, L * R] (kernels/reference/lora.py).
    plan: `plan_slots(slots, S)` when the caller shares it across calls."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("a", a, ndim=3, dtypes=FLOAT_DTYPES)
    check_shape("a", a, [None, None, x.shape[1]])
    check_shape("slots", slots, [x.shape[0]])
    check_same_device(x=x, a=a, slots=slots)
    check_launchable(_shrink_kernel, x.device)
    rows, block_slots = plan if plan is not None else plan_slots(slots, a.shape[0])
    tokens, lr = x.shape[0], a.shape[1]
    h = torch.zeros((tokens, lr), dtype=torch.float32, device=x.device)
    if not tokens:
        return h
    block_r = _block(lr)
    grid = (block_slots.numel(), triton.cdiv(lr, block_r))
    _shrink_kernel[grid](
        x, a, h, rows, block_slots, tokens, x.shape[1], lr,
        x.stride(0), x.stride(1), a.stride(0), a.stride(1), a.stride(2), h.stride(0), h.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_R=block_r, BLOCK_K=64, UPCAST=dot_upcast(_shrink_kernel, x.dtype),
    )  # fmt: skip
    return h


def lora_expand(h: torch.Tensor, b: torch.Tensor, scaling: torch.Tensor, slots: torch.Tensor,
                bounds: tuple[int, ...], out: torch.Tensor, plan: Plan | None = None) -> None:  # fmt: skip
    """out [T, N] += the adapters' products (kernels/reference/lora.py); h fp32 [T, L * R], b [S, N, R],
    scaling fp32 [S, L], bounds: L + 1 column offsets (0, ..., N)."""
    check_tensor("out", out, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("b", b, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("scaling", scaling, ndim=2, dtypes=(torch.float32,))
    rank, slices = b.shape[2], len(bounds) - 1
    check_shape("b", b, [None, out.shape[1], None])
    check_shape("h", h, [out.shape[0], slices * rank])
    check_shape("scaling", scaling, [b.shape[0], slices])
    check_last_dim_contiguous("out", out)
    if bounds[0] != 0 or bounds[-1] != out.shape[1] or any(x > y for x, y in zip(bounds, bounds[1:], strict=False)):
        raise ValueError(f"bounds must rise from 0 to out's {out.shape[1]} columns, got {bounds}")
    check_same_device(h=h, b=b, scaling=scaling, slots=slots, out=out)
    check_launchable(_expand_kernel, out.device)
    if not out.shape[0]:
        return
    if slices > 3:
        raise ValueError(f"lora_expand takes at most 3 slices (q, k, v), got {slices}")
    rows, block_slots = plan if plan is not None else plan_slots(slots, b.shape[0])
    inner = (*bounds[1:-1], 0, 0)  # scalars, not a tensor: no host-to-device copy (CUDA graphs)
    block_n = 64
    grid = (block_slots.numel(), triton.cdiv(out.shape[1], block_n))
    _expand_kernel[grid](
        h, b, scaling, out, rows, block_slots, out.shape[0], out.shape[1], rank, inner[0], inner[1],
        h.stride(0), h.stride(1), b.stride(0), b.stride(1), b.stride(2), scaling.stride(0), scaling.stride(1),
        out.stride(0), out.stride(1),
        SLICES=slices, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_R=_block(rank),
        UPCAST=dot_upcast(_expand_kernel, b.dtype),
    )  # fmt: skip
