"""Fused mixture-of-experts MLP in Triton over sorted token blocks (same signature as
kernels/reference/fused_moe.py's fused_moe).

The T * K (token, expert) pairs are sorted by expert into blocks of BLOCK_M rows, each block padded
to one expert (align_blocks, torch ops on the device with no host read: the block count is the bound
T * K + E * (BLOCK_M - 1) rounded up, trailing blocks marked -1 and skipped). Two launches then run
the experts as grouped GEMMs:
1. gate_up: each program takes one block's rows of x (gathered by token index, never copied) times
   its expert's gate and up tiles, adds the expert's gate and up biases when given (b13), and writes
   the activation: silu(gate) * up, or gpt-oss's clamped SwiGLU (swiglu_limit, swiglu_alpha), fused
   in fp32 in the epilogue, [T * K, I].
2. down: the activations times the expert's down tile, plus its down bias when given (b2), scaled by
   the pair's routing weight (bias included, as transformers' GptOssExperts weight it), [T * K, H].
A sum over each token's K rows finishes. Empty experts get no block; no program ever loops over tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.checks import FLOAT_DTYPES, check_same_device, check_same_dtype, check_shape, check_tensor
from kernels.triton.launch import check_launchable, dot, dot_upcast


def align_blocks(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_ids [T, K] -> (sorted_pairs int32 [B * block_m], block_experts int32 [B]).

    sorted_pairs lists the flat pair indices (token * K + slot) grouped by expert, each expert's run
    padded to a multiple of block_m with the sentinel T * K; block_experts[b] is the expert of block
    b, -1 for the unused blocks at the end. B = cdiv(T * K + E * (block_m - 1), block_m)."""
    flat = topk_ids.reshape(-1).long()
    pairs = flat.numel()
    num_blocks = triton.cdiv(pairs + num_experts * (block_m - 1), block_m)
    # counts by scatter_add, not bincount: bincount reads the ids' max back to the host (a sync)
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    run_start = torch.cumsum(padded, 0) - padded  # [E] first slot of each expert's run
    order = torch.argsort(flat, stable=True)
    first_of = torch.cumsum(counts, 0) - counts  # [E] rank of each expert's first pair in `order`
    experts = flat[order]
    dest = run_start[experts] + torch.arange(pairs, device=flat.device) - first_of[experts]
    sorted_pairs = torch.full((num_blocks * block_m,), pairs, dtype=torch.int32, device=flat.device)
    sorted_pairs[dest] = order.to(torch.int32)
    # block b belongs to the first expert whose runs end past it (searchsorted: no host read of how
    # many blocks are used, unlike repeat_interleave); blocks past every run get E, marked -1
    run_ends = torch.cumsum(padded // block_m, 0)  # [E] blocks used up to and including expert e
    blocks = torch.arange(num_blocks, device=flat.device)
    block_experts = torch.searchsorted(run_ends, blocks, right=True)
    block_experts = torch.where(block_experts < num_experts, block_experts, -1).to(torch.int32)
    return sorted_pairs, block_experts


@triton.jit
def block_tile(rows_ptr, groups_ptr, num_rows, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The tile of program (block, column tile) of a launch over align_blocks' blocks: (the block's
    group, -1 for a block to skip; its BLOCK_M row indices [BM]; which of them are rows, not the
    padding sentinel; the tile's BLOCK_N column offsets [BN], unmasked)."""
    block = tl.program_id(0)
    rows = tl.load(rows_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    return tl.load(groups_ptr + block), rows, rows < num_rows, cols


@triton.jit
def block_matmul(
    a_ptr, rows, valid, stride_ar, stride_ak, w_base, offs_n, n_mask, stride_wn, stride_wk, k_size,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """a[rows, :k_size] @ w[offs_n, :k_size].T -> fp32 [BM, BN], in BLOCK_K steps: a block's gathered
    rows of a (int64 row indices; rows not `valid`, the padding, read 0) times its group's weight
    w [N, K] at w_base (columns outside n_mask read 0), w fed to the dot in a's dtype."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_size, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < k_size
        a = tl.load(a_ptr + rows[:, None] * stride_ar + offs_k[None, :] * stride_ak,
                    mask=valid[:, None] & k_mask[None, :], other=0.0)  # fmt: skip
        w = tl.load(w_base + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk,
                    mask=k_mask[:, None] & n_mask[None, :], other=0.0)  # [BK, BN]  # fmt: skip
        acc = dot(a, w.to(a.dtype), acc, UPCAST)
    return acc


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, pairs_ptr, experts_ptr,  # x [T, H]; w [E, 2I, H]; b [E, 2I]; out [T*K, I]
    num_pairs, hidden, inter, limit, alpha,
    stride_xt, stride_xh, stride_we, stride_wn, stride_wh, stride_be, stride_op, stride_on,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr, HAS_BIAS: tl.constexpr, CLAMPED: tl.constexpr,
):  # fmt: skip
    expert, pair, valid, offs_n = block_tile(pairs_ptr, experts_ptr, num_pairs, BLOCK_M, BLOCK_N)
    if expert < 0:
        return
    token = pair // TOP_K
    n_mask = offs_n < inter
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < hidden
        a = tl.load(x_ptr + token[:, None] * stride_xt + offs_k[None, :] * stride_xh,
                    mask=valid[:, None] & k_mask[None, :], other=0.0)  # fmt: skip
        wk = offs_k[:, None] * stride_wh
        mask = k_mask[:, None] & n_mask[None, :]
        w_gate = tl.load(w_base + offs_n[None, :] * stride_wn + wk, mask=mask, other=0.0)  # [BK, BN]
        w_up = tl.load(w_base + (inter + offs_n[None, :]) * stride_wn + wk, mask=mask, other=0.0)
        acc_gate = dot(a, w_gate, acc_gate, UPCAST)
        acc_up = dot(a, w_up, acc_up, UPCAST)
    if HAS_BIAS:
        b_base = b_ptr + expert.to(tl.int64) * stride_be
        acc_gate += tl.load(b_base + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        acc_up += tl.load(b_base + inter + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if CLAMPED:  # gpt-oss: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit)
        g = tl.minimum(acc_gate, limit)
        u = tl.maximum(tl.minimum(acc_up, limit), -limit)
        act = (u + 1.0) * (g / (1.0 + tl.exp(-alpha * g)))
    else:
        act = acc_gate / (1.0 + tl.exp(-acc_gate)) * acc_up  # silu(gate) * up, in fp32
    out_ptrs = out_ptr + pair[:, None].to(tl.int64) * stride_op + offs_n[None, :] * stride_on
    tl.store(out_ptrs, act.to(out_ptr.dtype.element_ty), mask=valid[:, None] & n_mask[None, :])


@triton.jit
def _down_kernel(
    a_ptr, w_ptr, b_ptr, out_ptr, pairs_ptr, experts_ptr, weights_ptr,  # a [T*K, I]; w [E, H, I]; b [E, H]
    num_pairs, hidden, inter,
    stride_ap, stride_ai, stride_we, stride_wn, stride_wi, stride_be, stride_op, stride_on,  # out [T*K, H]
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):  # fmt: skip
    expert, pair, valid, offs_n = block_tile(pairs_ptr, experts_ptr, num_pairs, BLOCK_M, BLOCK_N)
    if expert < 0:
        return
    rows = pair.to(tl.int64)
    n_mask = offs_n < hidden
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    acc = block_matmul(a_ptr, rows, valid, stride_ap, stride_ai, w_base, offs_n, n_mask, stride_wn, stride_wi, inter,
                       BLOCK_M, BLOCK_N, BLOCK_K, UPCAST)  # fmt: skip
    if HAS_BIAS:  # before the routing weight: it scales the whole expert output
        bias = tl.load(b_ptr + expert.to(tl.int64) * stride_be + offs_n, mask=n_mask, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    scale = tl.load(weights_ptr + pair, mask=valid, other=0.0).to(tl.float32)  # routing weight per row
    acc = acc * scale[:, None]
    out_ptrs = out_ptr + rows[:, None] * stride_op + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & n_mask[None, :])


def _block_m(pairs: int, num_experts: int) -> int:
    """Rows per block: ~the rows an expert gets, 16..64 (decode: small blocks waste little padding)."""
    per_expert = pairs // max(num_experts, 1)
    return 16 if per_expert <= 16 else 32 if per_expert <= 64 else 64


def _check(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
    b13: torch.Tensor | None, b2: torch.Tensor | None, swiglu_limit: float | None, swiglu_alpha: float | None,
) -> None:  # fmt: skip
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("w13", w13, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("w2", w2, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("topk_weights", topk_weights, ndim=2, dtypes=(torch.float32,))
    check_tensor("topk_ids", topk_ids, ndim=2, dtypes=(torch.int32, torch.int64))
    check_same_dtype(x=x, w13=w13, w2=w2)
    tokens, hidden = x.shape
    num_experts, two_i = w13.shape[0], w13.shape[1]
    if two_i % 2:
        raise ValueError(f"w13 must hold gate and up rows (2 * I), got {two_i} rows")
    check_shape("w13", w13, (num_experts, two_i, hidden))
    check_shape("w2", w2, (num_experts, hidden, two_i // 2))
    check_shape("topk_ids", topk_ids, (tokens, None))
    check_shape("topk_weights", topk_weights, topk_ids.shape)
    devices = {"x": x, "w13": w13, "w2": w2, "topk_ids": topk_ids}
    for name, bias, shape in (("b13", b13, (num_experts, two_i)), ("b2", b2, (num_experts, hidden))):
        if bias is not None:
            check_tensor(name, bias, ndim=2, dtypes=FLOAT_DTYPES)
            check_shape(name, bias, shape)
            if bias.stride(1) != 1:
                raise ValueError(f"{name} must be contiguous along its last dim")
            check_same_dtype(x=x, **{name: bias})
            devices[name] = bias
    if swiglu_limit is not None and swiglu_alpha is None:
        raise ValueError("the clamped SwiGLU needs swiglu_alpha with swiglu_limit")
    check_launchable(_gate_up_kernel, check_same_device(**devices))


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    b13: torch.Tensor | None = None,
    b2: torch.Tensor | None = None,
    swiglu_limit: float | None = None,
    swiglu_alpha: float | None = None,
    block_m: int | None = None,
    checked: bool = False,
) -> torch.Tensor:
    """x [T, H] -> [T, H]; see kernels/reference/fused_moe.py (b13 [E, 2I] and b2 [E, H]: expert
    biases; swiglu_limit, swiglu_alpha: the clamped SwiGLU, None: silu(gate) * up). block_m: rows per
    sorted block (16, 32 or 64; chosen from the load when None). checked: the arguments' checks
    already passed."""
    if not checked:
        _check(x, w13, w2, topk_weights, topk_ids, b13, b2, swiglu_limit, swiglu_alpha)
    tokens, hidden = x.shape
    num_experts, inter = w13.shape[0], w13.shape[1] // 2
    top_k = topk_ids.shape[1]
    pairs = tokens * top_k
    if pairs == 0:
        return torch.zeros_like(x)
    bm = block_m or _block_m(pairs, num_experts)
    sorted_pairs, block_experts = align_blocks(topk_ids, num_experts, bm)
    num_blocks = block_experts.numel()
    act = torch.empty((pairs, inter), device=x.device, dtype=x.dtype)
    bn, bk = 64, 32
    upcast = dot_upcast(_gate_up_kernel, x.dtype)
    clamped = swiglu_limit is not None
    limit, alpha = (float(swiglu_limit), float(swiglu_alpha)) if clamped else (0.0, 0.0)
    b13_arg = w13 if b13 is None else b13  # a pointer the kernel never reads without HAS_BIAS
    _gate_up_kernel[(num_blocks, triton.cdiv(inter, bn))](
        x, w13, b13_arg, act, sorted_pairs, block_experts, pairs, hidden, inter, limit, alpha,
        x.stride(0), x.stride(1), w13.stride(0), w13.stride(1), w13.stride(2), b13_arg.stride(0),
        act.stride(0), act.stride(1),
        TOP_K=top_k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, UPCAST=upcast, HAS_BIAS=b13 is not None, CLAMPED=clamped,
    )  # fmt: skip
    rows = torch.empty((pairs, hidden), device=x.device, dtype=x.dtype)
    weights = topk_weights.reshape(-1).contiguous()
    b2_arg = w2 if b2 is None else b2
    _down_kernel[(num_blocks, triton.cdiv(hidden, bn))](
        act, w2, b2_arg, rows, sorted_pairs, block_experts, weights, pairs, hidden, inter,
        act.stride(0), act.stride(1), w2.stride(0), w2.stride(1), w2.stride(2), b2_arg.stride(0),
        rows.stride(0), rows.stride(1),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, UPCAST=upcast, HAS_BIAS=b2 is not None,
    )  # fmt: skip
    return rows.view(tokens, top_k, hidden).sum(1)
