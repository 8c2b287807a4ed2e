"""Varlen causal prefill attention over the paged KV cache (Triton), flash-style: query tiles
stream key tiles through an online softmax; the score matrix never reaches memory.

The keys are the cached prefix plus the new chunk, all read from the paged cache (the chunk's K/V
are stored before the call), which is what chunked prefill after a prefix-cache hit needs.
Sequence b's query i sits at position context_lens[b] - q_len_b + i and sees keys 0..position.
Same signature as kernels.reference.prefill_attention (plus an optional launch config).
Attention sinks (gpt-oss): each head's sink logit joins the softmax denominator at the end,
exp(sink - running max), as one more key with no value.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.attention_options import FULL_ATTENTION, AttentionOptions
from kernels.checks import check_attention_queries, check_tensor
from kernels.triton.launch import dot_upcast
from kernels.triton.paged import LOG2E, attend_tiles, check_paged_launch


@triton.jit
def _prefill_kernel(
    q_ptr,
    kc_ptr,
    vc_ptr,
    cu_ptr,
    lens_ptr,
    bt_ptr,
    out_ptr,
    # q, out [T, Hq, D]; caches [NB, BS, Hkv, D]; cu [B+1]; lens [B]; bt [B, MB]
    scale_log2,
    window,  # the query at position p sees keys p - window < j <= p (WINDOW)
    softcap_log2,  # softcap * log2 e (SOFTCAP)
    group,
    head_dim,
    block_size: tl.constexpr,  # tokens per cache block; constexpr: // and % become shifts
    stride_qt,
    stride_qh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    stride_ot,
    stride_oh,
    sinks_ptr,  # fp32 [Hq] logits, read when HAS_SINKS
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    # Program (query head, sequence, query tile). Heads vary fastest, so the heads sharing a KV head
    # run together (their keys stay in L2), and tiles run last-first: the longest causal rows start
    # first and the short ones fill the tail.
    h = tl.program_id(0)
    b = tl.program_id(1)
    tile = tl.num_programs(2) - 1 - tl.program_id(2)
    q_start = tl.load(cu_ptr + b)
    q_len = tl.load(cu_ptr + b + 1) - q_start
    if tile * BLOCK_M < q_len:
        ctx = tl.load(lens_ptr + b)
        prefix = ctx - q_len  # keys before the chunk
        kvh = h // group
        offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        m_mask = offs_m < q_len
        d_mask = offs_d < head_dim
        q_pos = prefix + offs_m  # [BM] absolute positions
        rows = (q_start + offs_m).to(tl.int64)
        q = tl.load(
            q_ptr + rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
            mask=m_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        m_i = tl.full((BLOCK_M,), -1.0e30, tl.float32)
        l_i = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        table = bt_ptr + b * stride_bt
        # Keys 0..first row's position are visible to every row: no causal mask there (whole tiles).
        # With a window, one masked pass from the first row's first visible key instead.
        full_end = ((prefix + tile * BLOCK_M + 1) // BLOCK_N) * BLOCK_N
        end = tl.minimum(prefix + (tile + 1) * BLOCK_M, ctx)  # one past the last row's position
        start = 0
        if WINDOW:
            start = tl.maximum(prefix + tile * BLOCK_M - window + 1, 0)
            full_end = start
        for causal in tl.static_range(2):  # keys start..full_end-1 unmasked, then full_end..end-1 causal
            acc, m_i, l_i = attend_tiles(
                acc, m_i, l_i, q, q_pos, kc_ptr, vc_ptr, table, kvh, block_size, stride_cb, stride_cs, stride_ch,
                start if causal == 0 else full_end, full_end if causal == 0 else end, offs_d, d_mask, scale_log2,
                window, softcap_log2, causal == 1, False, BLOCK_M, BLOCK_N, UPCAST, WINDOW, SOFTCAP,
            )  # fmt: skip
        if HAS_SINKS:  # the sink: one more term of the denominator, in the running max's units (log2)
            l_i += tl.exp2(tl.load(sinks_ptr + h) * 1.4426950408889634 - m_i)
        res = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
            res.to(out_ptr.dtype.element_ty),
            mask=m_mask[:, None] & d_mask[None, :],
        )


@dataclass(frozen=True)
class PrefillConfig:
    """Launch shape (hand-chosen for Hopper: 128x64 tiles, 8 warps for head_dim 128)."""

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 3


def _check_lengths(cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, tokens: int, capacity: int) -> int:
    """The one host sync: the longest chunk (grid size) and the bounds that keep the kernel's reads
    and writes inside q, out and the block tables. Returns the longest chunk."""
    q_lens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
    first, last, shortest, longest, min_prefix, max_ctx = torch.stack([
        cu_seqlens_q[0], cu_seqlens_q[-1], q_lens.min(), q_lens.max(), (context_lens - q_lens).min(),
        context_lens.max()]).tolist()  # fmt: skip
    if first != 0 or last != tokens or shortest < 0:
        raise ValueError(
            f"cu_seqlens_q must rise from 0 to the number of query rows ({tokens}), "
            f"got {cu_seqlens_q.tolist()}"
        )
    if min_prefix < 0:
        raise ValueError(
            "context_lens[b] must be >= the chunk length of sequence b (the chunk's keys are "
            f"in the cache), got context_lens={context_lens.tolist()}"
        )
    if max_ctx > capacity:
        raise ValueError(
            f"a context of {max_ctx} tokens does not fit the block tables "
            f"({capacity} tokens = max_blocks * block_size)"
        )
    return int(longest)


def prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor, block_tables: torch.Tensor, scale: float, out: torch.Tensor | None = None,
    options: AttentionOptions = FULL_ATTENTION, *, config: PrefillConfig | None = None, checked: bool = False,
) -> torch.Tensor:  # fmt: skip
    """Varlen causal attention for T new query tokens of B sequences; returns [T, Hq, D]. Under
    `options` each query sees its last `window` positions only, scores are soft-capped, sinks join
    the denominator.
    checked=True skips the argument checks (for a caller that saw them pass for the same shapes,
    strides, dtypes and devices).

    cu_seqlens_q int32 [B+1] (rows cu[b]:cu[b+1] belong to sequence b); context_lens int32 [B]
    (cached prefix + chunk, >= the chunk); block_tables int32 [B, max_blocks]. One host sync reads
    the longest chunk to size the grid and checks the lengths against q and the block tables.
    """
    cfg = config or PrefillConfig()
    if checked:  # the caller saw the checks below pass for the same shapes, strides, dtypes
        _, block_size, num_kv_heads, head_dim = k_cache.shape
        tokens, num_heads, _ = q.shape
        batch, group = cu_seqlens_q.shape[0] - 1, num_heads // num_kv_heads
    else:
        block_size, num_kv_heads, head_dim, num_heads, group = check_attention_queries(q, k_cache, v_cache)
        tokens = q.shape[0]
        check_tensor("cu_seqlens_q", cu_seqlens_q, ndim=1, dtypes=(torch.int32,))
        batch = cu_seqlens_q.shape[0] - 1
        if batch < 0:
            raise ValueError("cu_seqlens_q must hold B+1 offsets (at least [0])")
        check_paged_launch(
            _prefill_kernel, q, k_cache, v_cache, block_tables, context_lens, batch, scale, out, options.sinks,
            cu_seqlens_q=cu_seqlens_q,
        )  # fmt: skip
    if out is None:
        out = torch.empty_like(q)
    if batch == 0 or tokens == 0:
        return out
    max_q_len = _check_lengths(cu_seqlens_q, context_lens, tokens, block_tables.shape[1] * block_size)
    if max_q_len == 0:
        return out
    grid = (num_heads, batch, triton.cdiv(max_q_len, cfg.block_m))
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        cu_seqlens_q,
        context_lens,
        block_tables,
        out,
        float(scale) * LOG2E,
        int(options.window),
        float(options.softcap) * LOG2E,
        group,
        head_dim,
        block_size,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        out if options.sinks is None else options.sinks,  # any pointer when there are none: never read
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_D=triton.next_power_of_2(head_dim),
        UPCAST=dot_upcast(_prefill_kernel, q.dtype),
        WINDOW=options.window > 0,
        SOFTCAP=options.softcap > 0,
        HAS_SINKS=options.sinks is not None,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out
