"""Attention over the paged KV cache: decode (one query per sequence) and varlen causal prefill.

Both gather each sequence's keys and values through its block table and run dense matmuls over
them; no per-token Python loops. When every sequence of a decode batch starts with the same
blocks (a shared prompt prefix), those blocks are gathered once and scored for the whole batch
in one matmul (the "cascade" idea), which turns the shared part from a per-sequence copy into a
single GEMM.
"""

import torch

# Below this many shared tokens the cascade split costs more than it saves.
_MIN_SHARED_TOKENS = 64


def _shared_prefix_blocks(block_tables: torch.Tensor, num_blocks: int) -> int:
    """Number of leading block-table columns identical in every row (int32 [B, num_blocks])."""
    if block_tables.shape[0] < 2 or num_blocks == 0:
        return 0
    cols = block_tables[:, :num_blocks]
    same = (cols == cols[:1]).all(dim=0).to(torch.int32)  # [num_blocks]
    return int(same.cumprod(0).sum())


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
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    lens = context_lens.long()
    max_len = int(lens.max())
    num_blocks = -(-max_len // block_size)
    shared = min(_shared_prefix_blocks(block_tables, num_blocks), int(lens.min()) // block_size)
    if shared * block_size < _MIN_SHARED_TOKENS:
        shared = 0
    qg = q.view(batch, num_kv_heads, group, head_dim).float() * scale  # [B, Hkv, G, D]

    # Per-sequence part: blocks shared..num_blocks-1 of each row.
    own_ids = block_tables[:, shared:num_blocks].long().clamp_min(0)  # [B, nb]
    own_len = (num_blocks - shared) * block_size
    k_own = k_cache[own_ids].view(batch, own_len, num_kv_heads, head_dim).float()
    v_own = v_cache[own_ids].view(batch, own_len, num_kv_heads, head_dim).float()
    # [B, Hkv, G, D] @ [B, Hkv, D, L] -> [B, Hkv, G, L]
    scores_own = torch.matmul(qg, k_own.permute(0, 2, 3, 1))
    key_pos = torch.arange(shared * block_size, num_blocks * block_size, device=q.device)
    invalid = key_pos[None, :] >= lens[:, None]  # [B, L]
    scores_own.masked_fill_(invalid[:, None, None, :], float("-inf"))

    if shared == 0:
        probs = torch.softmax(scores_own, dim=-1)
        result = torch.matmul(probs, v_own.transpose(1, 2))  # [B, Hkv, G, D]
    else:
        shared_ids = block_tables[0, :shared].long()
        shared_len = shared * block_size
        k_sh = k_cache[shared_ids].view(shared_len, num_kv_heads, head_dim).float()
        v_sh = v_cache[shared_ids].view(shared_len, num_kv_heads, head_dim).float()
        # One GEMM for the whole batch: [Hkv, B*G, D] @ [Hkv, D, Ls] -> [Hkv, B*G, Ls]
        q_all = qg.permute(1, 0, 2, 3).reshape(num_kv_heads, batch * group, head_dim)
        scores_sh = torch.matmul(q_all, k_sh.permute(1, 2, 0))
        scores_sh = scores_sh.view(num_kv_heads, batch, group, shared_len).permute(1, 0, 2, 3)
        probs = torch.softmax(torch.cat([scores_sh, scores_own], dim=-1), dim=-1)
        p_sh = probs[..., :shared_len].permute(1, 0, 2, 3).reshape(num_kv_heads, batch * group, shared_len)
        out_sh = torch.matmul(p_sh, v_sh.transpose(0, 1))  # [Hkv, B*G, D]
        out_sh = out_sh.view(num_kv_heads, batch, group, head_dim).permute(1, 0, 2, 3)
        result = out_sh + torch.matmul(probs[..., shared_len:], v_own.transpose(1, 2))
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
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    starts = cu_seqlens_q.tolist()
    lens = context_lens.tolist()
    for b, ctx in enumerate(lens):
        lo, hi = starts[b], starts[b + 1]
        q_len = hi - lo
        if q_len == 0:
            continue
        n_blocks = -(-ctx // block_size)
        ids = block_tables[b, :n_blocks].long()
        k = k_cache[ids].view(n_blocks * block_size, num_kv_heads, head_dim)[:ctx]
        v = v_cache[ids].view(n_blocks * block_size, num_kv_heads, head_dim)[:ctx]
        # [Hkv, G*q_len, D] @ [Hkv, D, ctx] -> [Hkv, G*q_len, ctx]
        qb = q[lo:hi].float().view(q_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3) * scale
        scores = torch.matmul(qb.reshape(num_kv_heads, group * q_len, head_dim), k.float().permute(1, 2, 0))
        scores = scores.view(num_kv_heads, group, q_len, ctx)
        if q_len > 1:
            q_pos = torch.arange(ctx - q_len, ctx, device=q.device)
            k_pos = torch.arange(ctx, device=q.device)
            scores.masked_fill_(k_pos[None, :] > q_pos[:, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1).view(num_kv_heads, group * q_len, ctx)
        res = torch.matmul(probs, v.float().transpose(0, 1))  # [Hkv, G*q_len, D]
        out[lo:hi] = (
            res.view(num_kv_heads, group, q_len, head_dim)
            .permute(2, 0, 1, 3)
            .reshape(q_len, num_heads, head_dim)
            .to(out.dtype)
        )
    return out
