"""Gathering key/value tiles from the paged KV cache through a block table, and the argument checks
of a launch over it (shared by the decode and prefill attention kernels)."""

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
from kernels.triton.launch import check_launchable

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
