"""Paged decode attention (Triton): one query token per sequence over its paged KV cache, GQA, any
context lengths in one launch. Flash-decoding: the context is split across programs when the batch
alone cannot fill the GPU, each split keeps an online softmax (running max, sum, weighted values)
and a second small kernel merges the splits. Same signature as
kernels.reference.paged_decode_attention (plus an optional launch config). Attention sinks (gpt-oss)
join the denominator once, where it is final: in the split kernel without splits, else in the merge.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.attention_options import FULL_ATTENTION, AttentionOptions
from kernels.checks import check_attention_queries
from kernels.triton.launch import dot_upcast, num_sms
from kernels.triton.paged import LOG2E, attend_tiles, check_paged_launch


@triton.jit
def _decode_split_kernel(
    q_ptr,
    kc_ptr,
    vc_ptr,
    bt_ptr,
    lens_ptr,
    out_ptr,
    po_ptr,
    pml_ptr,
    # q, out [B, Hq, D]; caches [NB, BS, Hkv, D]; bt [B, MB]; lens [B];
    # partials po [B, Hq, S, D] fp32 and pml [2, B, Hq, S] fp32 (running max, sum) when SPLIT
    scale_log2,
    window,  # keys ctx - window .. ctx - 1 only (WINDOW)
    softcap_log2,  # softcap * log2 e (SOFTCAP)
    group,
    head_dim,
    block_size: tl.constexpr,  # tokens per cache block; constexpr: // and % become shifts
    tokens_per_split,
    table_tokens,  # max_blocks * block_size: a context past it is cut there, never read out of the table
    stride_qb,
    stride_qh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    stride_ob,
    stride_oh,
    stride_pob,
    stride_poh,
    stride_pos,
    stride_pml,
    stride_pmb,
    stride_pmh,
    sinks_ptr,  # fp32 [Hq] logits, read when HAS_SINKS
    SPLIT: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    # Program (b, kv head, split): the `group` query heads of one KV head as the rows of a tile.
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.minimum(tl.load(lens_ptr + b), table_tokens)
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, ctx)
    if WINDOW:  # a split wholly before the window reads nothing (max -1e30, sum 0: weighs nothing)
        start = tl.maximum(start, ctx - window)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < group
    d_mask = offs_d < head_dim
    heads = kvh * group + offs_g
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )  # [BG, BD]
    m_i = tl.full((BLOCK_G,), -1.0e30, tl.float32)
    l_i = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    table = bt_ptr + b * stride_bt
    # every key of the split is visible to every query head (the window moved `start`); only the
    # last tile's keys past `end` are masked. q_pos (`heads`) is never read without CAUSAL.
    acc, m_i, l_i = attend_tiles(
        acc, m_i, l_i, q, heads, kc_ptr, vc_ptr, table, kvh, block_size, stride_cb, stride_cs, stride_ch,
        start, end, offs_d, d_mask, scale_log2, window, softcap_log2, False, True, BLOCK_G, BLOCK_N, UPCAST,
        WINDOW, SOFTCAP,
    )  # fmt: skip
    out_mask = g_mask[:, None] & d_mask[None, :]
    if SPLIT:
        po = po_ptr + b * stride_pob + heads[:, None] * stride_poh + split * stride_pos + offs_d[None, :]
        tl.store(po, acc, mask=out_mask)
        pml = pml_ptr + b * stride_pmb + heads * stride_pmh + split
        tl.store(pml, m_i, mask=g_mask)
        tl.store(pml + stride_pml, l_i, mask=g_mask)
    else:
        if HAS_SINKS:  # one more term of the denominator, in the running max's units (log2)
            l_i += tl.exp2(tl.load(sinks_ptr + heads, mask=g_mask, other=0.0) * 1.4426950408889634 - m_i)
        res = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
            res.to(out_ptr.dtype.element_ty),
            mask=out_mask,
        )


@triton.jit
def _decode_merge_kernel(
    po_ptr,
    pml_ptr,
    out_ptr,
    num_splits,
    head_dim,
    stride_pob,
    stride_poh,
    stride_pos,
    stride_pml,
    stride_pmb,
    stride_pmh,
    stride_ob,
    stride_oh,
    sinks_ptr,  # fp32 [Hq] logits, read when HAS_SINKS
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    # Program (b, query head): weight each split by exp2(its max - global max); empty splits have
    # max -1e30 and sum 0, so they weigh nothing.
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_splits
    pml = pml_ptr + b * stride_pmb + h * stride_pmh + offs_s
    m = tl.load(pml, mask=s_mask, other=-1.0e30)
    l_s = tl.load(pml + stride_pml, mask=s_mask, other=0.0)
    w = tl.exp2(m - tl.max(m, axis=0))  # [BS]
    total = tl.sum(w * l_s, axis=0)
    if HAS_SINKS:
        total += tl.exp2(tl.load(sinks_ptr + h) * 1.4426950408889634 - tl.max(m, axis=0))
    po = po_ptr + b * stride_pob + h * stride_poh + offs_s[:, None] * stride_pos + offs_d[None, :]
    acc = tl.load(po, mask=s_mask[:, None] & (offs_d[None, :] < head_dim), other=0.0)  # [BS, BD]
    res = tl.sum(acc * w[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + b * stride_ob + h * stride_oh + offs_d,
        res.to(out_ptr.dtype.element_ty),
        mask=offs_d < head_dim,
    )


@dataclass(frozen=True)
class DecodeConfig:
    """Launch shape: BLOCK_N keys per tile; splits: programs per (sequence, KV head) along the
    context (None: enough to give every SM two programs, at least 256 tokens each)."""

    block_n: int = 64
    num_splits: int | None = None
    num_warps: int = 4
    num_stages: int = 2
    min_tokens_per_split: int = 256


def _num_splits(
    cfg: DecodeConfig, batch: int, num_kv_heads: int, max_context: int, device: torch.device
) -> int:
    if cfg.num_splits is not None:
        return max(1, cfg.num_splits)
    want = triton.cdiv(2 * num_sms(device), batch * num_kv_heads)
    return max(1, min(want, max_context // cfg.min_tokens_per_split))


def paged_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, out: torch.Tensor | None = None,
    options: AttentionOptions = FULL_ATTENTION, *, config: DecodeConfig | None = None, checked: bool = False,
) -> torch.Tensor:  # fmt: skip
    """q [B, Hq, D] attends keys 0..context_lens[b]-1 of its sequence under `options` (the last
    `window` of them, scores soft-capped, sinks in the denominator); returns [B, Hq, D].
    checked=True skips the argument checks (for a caller that saw them pass for the same shapes,
    strides, dtypes and devices).

    k_cache, v_cache [num_blocks, block_size, Hkv, D]; block_tables int32 [B, max_blocks] (only
    entries below a sequence's context are read); context_lens int32 [B], each <= max_blocks *
    block_size (not checked: that is a sync per call; a longer one is cut at the table's end, never
    read past it). The split count is sized from max_blocks * block_size, so pass block tables
    trimmed to the batch's longest sequence.
    """
    cfg = config or DecodeConfig()
    if checked:  # the caller saw the checks below pass for the same shapes, strides, dtypes
        _, block_size, num_kv_heads, head_dim = k_cache.shape
        batch, num_heads, _ = q.shape
        group, device = num_heads // num_kv_heads, q.device
    else:
        block_size, num_kv_heads, head_dim, num_heads, group = check_attention_queries(q, k_cache, v_cache)
        batch = q.shape[0]
        device = check_paged_launch(
            _decode_split_kernel, q, k_cache, v_cache, block_tables, context_lens, batch, scale, out, options.sinks
        )
    if out is None:
        out = torch.empty_like(q)
    if batch == 0:
        return out
    max_context = block_tables.shape[1] * block_size
    if max_context == 0:
        raise ValueError("block_tables has no columns, but every sequence needs >= 1 cached token")
    splits = _num_splits(cfg, batch, num_kv_heads, max_context, device)
    per_split = triton.cdiv(triton.cdiv(max_context, splits), cfg.block_n) * cfg.block_n
    splits = max(1, triton.cdiv(max_context, per_split))
    block_d = triton.next_power_of_2(head_dim)
    if splits > 1:
        part_o = torch.empty((batch, num_heads, splits, head_dim), device=device, dtype=torch.float32)
        part_ml = torch.empty((2, batch, num_heads, splits), device=device, dtype=torch.float32)
    else:  # unused by the kernel; any fp32 tensor keeps the signature
        part_o = part_ml = torch.empty((1, 1, 1, 1), device=device, dtype=torch.float32)
    _decode_split_kernel[(batch, num_kv_heads, splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        out,
        part_o,
        part_ml,
        float(scale) * LOG2E,
        int(options.window),
        float(options.softcap) * LOG2E,
        group,
        head_dim,
        block_size,
        per_split,
        max_context,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        part_o.stride(0),
        part_o.stride(1),
        part_o.stride(2),
        part_ml.stride(0),
        part_ml.stride(1),
        part_ml.stride(2),
        out if options.sinks is None else options.sinks,  # any pointer when there are none: never read
        SPLIT=splits > 1,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_N=cfg.block_n,
        BLOCK_D=block_d,
        UPCAST=dot_upcast(_decode_split_kernel, q.dtype),
        WINDOW=options.window > 0,
        SOFTCAP=options.softcap > 0,
        HAS_SINKS=options.sinks is not None and splits == 1,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if splits > 1:
        _decode_merge_kernel[(batch, num_heads)](
            part_o,
            part_ml,
            out,
            splits,
            head_dim,
            part_o.stride(0),
            part_o.stride(1),
            part_o.stride(2),
            part_ml.stride(0),
            part_ml.stride(1),
            part_ml.stride(2),
            out.stride(0),
            out.stride(1),
            out if options.sinks is None else options.sinks,
            BLOCK_S=max(2, triton.next_power_of_2(splits)),
            BLOCK_D=block_d,
            HAS_SINKS=options.sinks is not None,
        )
    return out
