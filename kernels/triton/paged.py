"""Gathering key/value tiles from the paged KV cache through a block table, the online softmax over
them, and the argument checks of a launch over it (shared by the decode and prefill attention
kernels)."""

import torch
import triton
import triton.language as tl

from kernels.checks import (
    check_out,
    check_paged_operands,
    check_positive,
    check_shape,
    check_sinks,
    check_tensor,
)
from kernels.triton.launch import check_launchable, dot

LOG2E = 1.4426950408889634  # the kernels work in log2 units: exp(x) = exp2(x * LOG2E)


@triton.jit
def load_kv_tile(
    cache_ptr,
    table_ptr,
    offs_n,
    n_mask,
    kv_head,
    block_size: tl.constexpr,
    stride_cb,
    stride_cs,
    stride_ch,
    offs_d,
    d_mask,
):
    """Tokens offs_n [BLOCK_N] of one sequence (table_ptr = its block-table row), one KV head:
    returns [BLOCK_N, BLOCK_D] from cache [num_blocks, block_size, Hkv, D] (last dim dense).
    Masked tokens read 0 and never touch the block table."""
    block = tl.load(table_ptr + offs_n // block_size, mask=n_mask, other=0).to(tl.int64)
    row = block * stride_cb + (offs_n % block_size) * stride_cs + kv_head * stride_ch  # int64 [BLOCK_N]
    return tl.load(
        cache_ptr + row[:, None] + offs_d[None, :], mask=n_mask[:, None] & d_mask[None, :], other=0.0
    )


@triton.jit
def soft_cap(s, softcap_log2):
    """Scores s in log2 units (q.k * scale * log2 e) -> softcap * tanh(raw / softcap) in log2 units,
    with softcap_log2 = softcap * log2 e; tanh from exp (stable at both ends: exp2 -> inf gives 1)."""
    e = tl.exp2(2.0 * s / softcap_log2 * 1.4426950408889634)  # exp(2 * raw / softcap)
    return (1.0 - 2.0 / (e + 1.0)) * softcap_log2


@triton.jit
def attend_tiles(
    acc,
    m_i,
    l_i,
    q,
    q_pos,
    kc_ptr,
    vc_ptr,
    table,
    kvh,
    block_size: tl.constexpr,
    stride_cb,
    stride_cs,
    stride_ch,
    lo,
    hi,
    offs_d,
    d_mask,
    scale_log2,
    window,
    softcap_log2,
    CAUSAL: tl.constexpr,
    TAIL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """Online softmax of the query rows q [BM, BD] over keys lo..hi-1 of one sequence's KV head
    (hi <= context): returns the running (acc [BM, BD], max m_i [BM], sum l_i [BM]), log2 units.
    CAUSAL masks keys past hi and key > the row's position q_pos [BM] (WINDOW also key <= position
    - window); TAIL masks only keys past hi (a last tile that runs over); neither: every key in range
    is visible to every row (whole tiles)."""
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < hi
        k = load_kv_tile(
            kc_ptr, table, offs_n, n_mask, kvh, block_size, stride_cb, stride_cs, stride_ch, offs_d, d_mask
        )  # [BN, BD]
        s = dot(q, tl.trans(k), tl.zeros((BLOCK_M, BLOCK_N), tl.float32), UPCAST) * scale_log2
        if SOFTCAP:
            s = soft_cap(s, softcap_log2)
        if CAUSAL:  # (the unmasked range is whole tiles below every row's position)
            visible = n_mask[None, :] & (offs_n[None, :] <= q_pos[:, None])
            if WINDOW:
                visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
            s = tl.where(visible, s, float("-inf"))
        elif TAIL:
            s = tl.where(n_mask[None, :], s, float("-inf"))  # [BM, BN]
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = load_kv_tile(
            vc_ptr, table, offs_n, n_mask, kvh, block_size, stride_cb, stride_cs, stride_ch, offs_d, d_mask
        )
        acc = dot(p.to(v.dtype), v, acc * alpha[:, None], UPCAST)
        m_i = m_new
    return acc, m_i, l_i


def check_paged_launch(
    kernel: object,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    batch: int,
    scale: float,
    out: torch.Tensor | None,
    sinks: torch.Tensor | None,
    **more: torch.Tensor,
) -> torch.device:
    """The operands of a paged-attention launch past the queries (kernels.checks.check_attention_queries
    checked q and the caches): int32 block tables [batch, max_blocks] and context lengths [batch], a
    positive scale, an optional out shaped as q, `more` (a kernel's own int32 index tensors, already
    checked) laid out and placed as the rest, and `kernel` launchable there. Returns the device."""
    check_tensor("block_tables", block_tables, ndim=2, dtypes=(torch.int32,))
    check_shape("block_tables", block_tables, (batch, None))
    check_tensor("context_lens", context_lens, ndim=1, dtypes=(torch.int32,))
    check_shape("context_lens", context_lens, (batch,))
    check_positive("scale", scale)
    check_out("out", out, tuple(q.shape), q)
    device = check_paged_operands(
        q=q, k_cache=k_cache, v_cache=v_cache, **more, block_tables=block_tables, context_lens=context_lens, out=out
    )
    check_launchable(kernel, device)
    check_sinks(sinks, q.shape[1], q)
    return device
