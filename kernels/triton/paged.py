"""Gathering key/value tiles from the paged KV cache through a block table (shared by the decode
and prefill attention kernels)."""

import triton
import triton.language as tl

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
