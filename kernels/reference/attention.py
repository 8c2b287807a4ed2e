"""Attention over the paged KV cache: decode (one query per sequence) and varlen causal prefill.

Keys and values are gathered through the block tables and fed to a fused attention that also
returns the log-sum-exp (the CPU flash kernel on the CPU, plain math elsewhere), so partial results
over disjoint key ranges merge exactly. Two things keep the CPU fast:
- cascade: when every sequence of a call starts with the same blocks (a shared prompt prefix),
  those blocks are read once and attended by all queries in one call; only each sequence's own
  tail is gathered per sequence;
- decode sequences are sorted by length and gathered in small groups, so padding stays small and
  each group's keys are still in cache when attention reads them.
No per-token Python loops: prefill loops over sequences, decode over groups.
"""

from __future__ import annotations

import torch

_MIN_SHARED_TOKENS = 64  # below this the cascade split costs more than it saves
_DECODE_GROUP = 16  # decode sequences per gathered group


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float):
    """q [N, H, M, D], k/v [N, H, L, D], additive fp32 mask broadcastable to [N, H, M, L] or None.

    Returns (out [N, H, M, D] fp32, lse [N, H, M] fp32). Every query row must see >= 1 key.
    """
    q, k, v = q.float(), k.float(), v.float()
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, attn_mask=mask, scale=scale
        )
    return _attend_math(q, k, v, mask, scale)


def _attend_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float):
    """_attend in plain torch ops (any device)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]), v), lse


def _merge(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor) -> torch.Tensor:
    """Combine attention over two disjoint key sets from their outputs and log-sum-exps."""
    m = torch.maximum(lse1, lse2)
    w1, w2 = torch.exp(lse1 - m)[..., None], torch.exp(lse2 - m)[..., None]
    return (o1 * w1 + o2 * w2) / (w1 + w2)


def _shared_blocks(block_tables: torch.Tensor, limit: int) -> int:
    """Leading block-table columns (at most `limit`) identical in every row of int32 [B, W]."""
    if block_tables.shape[0] < 2 or limit <= 0:
        return 0
    cols = block_tables[:, :limit]
    same = (cols == cols[:1]).all(dim=0).to(torch.int32)
    return int(same.cumprod(0).sum())


def _gather(cache: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """cache [num_blocks, bs, Hkv, D], ids int [N, nb] -> [N, Hkv, nb*bs, D] (a transposed copy)."""
    n, nb = ids.shape
    _, bs, hkv, d = cache.shape
    return cache[ids.long()].view(n, nb * bs, hkv, d).transpose(1, 2)


def _fold(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """[B, Hq, D] -> [B, Hkv, G, D]: the G query heads sharing a KV head become query rows."""
    b, hq, d = q.shape
    return q.view(b, num_kv_heads, hq // num_kv_heads, d)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B, Hq, D] attends keys 0..context_lens[b]-1 of its sequence; returns [B, Hq, D].

    k_cache, v_cache: [num_blocks, block_size, Hkv, D]; block_tables int32 [B, max_blocks]
    (entries past a sequence's blocks are ignored); context_lens int32 [B], each >= 1.
    """
    batch, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    lens = context_lens.tolist()
    # Shared blocks must leave every sequence at least one key of its own.
    shared = _shared_blocks(block_tables, (min(lens) - 1) // block_size)
    if shared * block_size < _MIN_SHARED_TOKENS:
        shared = 0
    base = shared * block_size
    qf = _fold(q, num_kv_heads)  # [B, Hkv, G, D]
    group = qf.shape[2]
    result = torch.empty(batch, num_kv_heads, group, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(batch, num_kv_heads, group, dtype=torch.float32, device=q.device)
    order = sorted(range(batch), key=lens.__getitem__)
    for lo in range(0, batch, _DECODE_GROUP):
        idx = order[lo : lo + _DECODE_GROUP]
        width = -(-max(lens[i] for i in idx) // block_size)  # blocks
        rows = torch.tensor(idx, device=q.device)
        ids = block_tables.index_select(0, rows)[:, shared:width]
        k, v = _gather(k_cache, ids), _gather(v_cache, ids)  # [n, Hkv, L, D]
        key_pos = torch.arange(base, width * block_size, device=q.device)
        own_lens = torch.tensor([lens[i] for i in idx], device=q.device)
        mask = torch.zeros(len(idx), 1, 1, key_pos.numel(), device=q.device)
        mask.masked_fill_((key_pos[None, :] >= own_lens[:, None])[:, None, None, :], float("-inf"))
        o, s = _attend(qf.index_select(0, rows), k, v, mask, scale)
        result[rows], lse[rows] = o, s
    if shared:
        ids = block_tables[:1, :shared]
        k, v = _gather(k_cache, ids), _gather(v_cache, ids)  # [1, Hkv, base, D]
        q_all = qf.permute(1, 0, 2, 3).reshape(1, num_kv_heads, batch * group, head_dim)
        o, s = _attend(q_all, k, v, None, scale)  # one call for the whole batch
        o = o.view(num_kv_heads, batch, group, head_dim).permute(1, 0, 2, 3)
        s = s.view(num_kv_heads, batch, group).permute(1, 0, 2)
        result = _merge(result, lse, o, s)
    result = result.reshape(batch, num_heads, head_dim).to(q.dtype)
    if out is None:
        return result
    out.copy_(result)
    return out


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Varlen causal attention for T new query tokens of B sequences; returns [T, Hq, D].

    Sequence b owns q rows cu_seqlens_q[b]:cu_seqlens_q[b+1]; its chunk's K/V are already in the
    cache; its query i sits at position context_lens[b] - q_len_b + i and sees keys 0..position.
    """
    total, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    starts = cu_seqlens_q.tolist()
    lens = context_lens.tolist()
    q_lens = [starts[b + 1] - starts[b] for b in range(len(lens))]
    # Cascade only over blocks that lie before every sequence's first query (no causal cut inside).
    first_query = min(c - n for c, n in zip(lens, q_lens, strict=True))
    shared = _shared_blocks(block_tables, first_query // block_size)
    if shared * block_size < _MIN_SHARED_TOKENS:
        shared = 0
    base = shared * block_size
    res = torch.empty(total, num_kv_heads, group, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(total, num_kv_heads, group, dtype=torch.float32, device=q.device)
    for b, ctx in enumerate(lens):
        lo, q_len = starts[b], q_lens[b]
        if q_len == 0:
            continue
        width = -(-ctx // block_size)
        ids = block_tables[b : b + 1, shared:width]
        k = _gather(k_cache, ids)[:, :, : ctx - base]  # [1, Hkv, L, D]
        v = _gather(v_cache, ids)[:, :, : ctx - base]
        o, s = _attend(
            _fold_tokens(q[lo : lo + q_len], num_kv_heads),
            k,
            v,
            _causal_mask(ctx, q_len, base, group, q.device),
            scale,
        )
        res[lo : lo + q_len] = _unfold_tokens(o, q_len)
        lse[lo : lo + q_len] = _unfold_tokens(s[..., None], q_len)[..., 0]
    if shared:
        ids = block_tables[:1, :shared]
        o, s = _attend(
            _fold_tokens(q, num_kv_heads), _gather(k_cache, ids), _gather(v_cache, ids), None, scale
        )
        res = _merge(res, lse, _unfold_tokens(o, total), _unfold_tokens(s[..., None], total)[..., 0])
    out.copy_(res.view(total, num_heads, head_dim))
    return out


def _fold_tokens(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """[n, Hq, D] -> [1, Hkv, G*n, D]; query row g*n + i is head g of the group at token i."""
    n, hq, d = q.shape
    return q.view(n, num_kv_heads, hq // num_kv_heads, d).permute(1, 2, 0, 3).reshape(1, num_kv_heads, -1, d)


def _unfold_tokens(x: torch.Tensor, n: int) -> torch.Tensor:
    """[1, Hkv, G*n, E] -> [n, Hkv, G, E]."""
    hkv, e = x.shape[1], x.shape[-1]
    return x.view(hkv, -1, n, e).permute(2, 0, 1, 3)


def _causal_mask(ctx: int, q_len: int, base: int, group: int, device: torch.device) -> torch.Tensor:
    """Additive [1, 1, G*q_len, ctx-base]: query i (position ctx-q_len+i) sees keys base..position."""
    q_pos = torch.arange(ctx - q_len, ctx, device=device).repeat(group)
    k_pos = torch.arange(base, ctx, device=device)
    mask = torch.zeros(group * q_len, ctx - base, device=device)
    return mask.masked_fill_(k_pos[None, :] > q_pos[:, None], float("-inf"))[None, None]
