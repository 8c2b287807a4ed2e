"""Attention over the paged KV cache: decode (one query per sequence) and varlen causal prefill.

Keys and values are gathered through the block tables (one index_select of whole blocks) and fed to
a fused attention that also returns the log-sum-exp (the CPU flash kernel on the CPU, plain math
elsewhere), so partial results over disjoint key ranges merge exactly. What keeps the CPU fast:
- cascade: when every sequence of a call starts with the same blocks (a shared prompt prefix),
  those blocks are read once and attended by all queries in one call; only each sequence's own
  tail is gathered per sequence;
- decode sequences are sorted by length and gathered in groups, so padding stays small;
- the index work (groups, gather ids, masks) is a plan that depends only on the block tables and
  lengths, so a caller running many layers builds it once per step (plan_decode / plan_prefill).
No per-token Python loops: prefill loops over sequences, decode over groups.

The entry points take a layer's AttentionOptions (kernels/attention_options.py). With a `window`
only the blocks inside it are gathered, so blocks a window has left may hold anything finite, such
as another sequence's keys once the block manager has recycled them; no cascade then. With a
`softcap` the math is plain: the CPU flash kernel has no cap.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.attention_options import FULL_ATTENTION, AttentionOptions

_MIN_SHARED_TOKENS = 64  # below this the cascade split costs more than it saves
_DECODE_GROUP = 4  # decode sequences per gathered group: small groups pad little and stay in cache


@dataclass(frozen=True)
class _Part:
    """Queries `rows` (decode: sequence indices; prefill: token range) against gathered blocks."""

    rows: torch.Tensor | slice
    block_ids: torch.Tensor  # int64 [n * nb]: blocks to gather, row-major per sequence
    num_seqs: int
    num_keys: int  # keys per sequence after gathering (nb * block_size, or trimmed for prefill)
    mask: torch.Tensor | None  # additive fp32, broadcastable to [n, Hkv, M, num_keys]; None: causal


@dataclass(frozen=True)
class AttentionPlan:
    parts: list[_Part]
    shared_ids: torch.Tensor | None  # int64 [shared blocks] attended by every query, or None


def _shared_blocks(block_tables: torch.Tensor, limit: int) -> int:
    """Leading block-table columns (at most `limit`) identical in every row of int32 [B, W]."""
    if block_tables.shape[0] < 2 or limit <= 0:
        return 0
    cols = block_tables[:, :limit]
    same = (cols == cols[:1]).all(dim=0).to(torch.int32)
    return int(same.cumprod(0).sum())


def _gather(cache: torch.Tensor, block_ids: torch.Tensor, num_seqs: int, num_keys: int) -> torch.Tensor:
    """cache [num_blocks, bs, Hkv, D] -> [n, Hkv, num_keys, D] (a transposed view of one copy)."""
    nb, bs, hkv, d = cache.shape
    rows = cache.view(nb, bs * hkv * d).index_select(0, block_ids)
    return rows.view(num_seqs, -1, hkv, d)[:, :num_keys].transpose(1, 2)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float, softcap: float = 0.0
):
    """q [N, H, M, D], k/v [N, H, L, D], additive fp32 mask broadcastable to [N, H, M, L] or None.

    Returns (out [N, H, M, D] fp32, lse [N, H, M] fp32). Every query row must see >= 1 key.
    """
    q, k, v = q.float(), k.float(), v.float()
    if softcap:
        return _attend_math(q, k, v, mask, scale, softcap)
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, attn_mask=mask, scale=scale
        )
        return out, lse
    return _attend_math(q, k, v, mask, scale)


def _attend_math(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float, softcap: float = 0.0
):
    """_attend in plain torch ops (any device; any float dtype in, fp32 out like _attend)."""
    q, k, v = q.float(), k.float(), v.float()
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores + mask
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]), v), lse


def _attend_causal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, flash: bool | None = None, softcap: float = 0.0
):
    """q [n, Hq, D] at positions 0..n-1, k/v [1, Hkv, n, D] -> (out [n, Hkv, G, D], lse [n, Hkv, G]).

    flash: use the CPU flash kernel (default: on the CPU, without softcap); else plain math with an
    explicit mask.
    """
    n, hq, d = q.shape
    hkv = k.shape[1]
    if softcap or not (q.device.type == "cpu" if flash is None else flash):
        mask = torch.full((n, n), float("-inf"), device=q.device).triu_(1)
        o, s = _attend_math(_fold_tokens(q, hkv), k, v, mask.repeat(hq // hkv, 1)[None, None], scale, softcap)
        return _unfold_tokens(o, n), _unfold_tokens(s[..., None], n)[..., 0]
    qg = q.float().view(n, hkv, hq // hkv, d).permute(2, 1, 0, 3)  # [G, Hkv, n, D]: G as batch
    g = qg.shape[0]
    o, s = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        qg, k.float().expand(g, -1, -1, -1), v.float().expand(g, -1, -1, -1), is_causal=True, scale=scale
    )
    return o.permute(2, 1, 0, 3), s.permute(2, 1, 0)


def merge_partials(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor) -> torch.Tensor:
    """Combine attention over two disjoint key sets from their outputs and log-sum-exps."""
    m = torch.maximum(lse1, lse2)
    w1, w2 = torch.exp(lse1 - m)[..., None], torch.exp(lse2 - m)[..., None]
    return (o1 * w1 + o2 * w2) / (w1 + w2)


def apply_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> None:
    """Attention sinks (gpt-oss), in place: out [N, Hkv, G, D] fp32 over its keys, whose log-sum-exp is
    lse [N, Hkv, G], becomes the attention whose softmax denominator also holds exp(sinks[h]) for query
    head h = kv_head * G + g (a logit with no value): out * sigmoid(lse - sink)."""
    out.mul_(torch.sigmoid(lse - sinks.float().view(lse.shape[1:]))[..., None])


# ---- decode -------------------------------------------------------------------------------------
def decode_shared_blocks(block_tables: torch.Tensor, lens: list[int], block_size: int) -> int:
    """Leading blocks every decode sequence shares and is worth a cascade (leaving each sequence at
    least one key of its own), else 0."""
    shared = _shared_blocks(block_tables, (min(lens) - 1) // block_size)
    return shared if shared * block_size >= _MIN_SHARED_TOKENS else 0


def attend_shared_blocks(
    qf: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, shared_ids: torch.Tensor, scale: float,
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Every decode query qf [B, Hkv, G, D] over the same blocks (read once, one call for the whole
    batch) -> (out [B, Hkv, G, D], lse [B, Hkv, G]), to merge with the rest of each context."""
    batch, num_kv_heads, group, head_dim = qf.shape
    n = shared_ids.numel() * k_cache.shape[1]
    k = _gather(k_cache, shared_ids, 1, n)
    v = _gather(v_cache, shared_ids, 1, n)
    q_all = qf.permute(1, 0, 2, 3).reshape(1, num_kv_heads, batch * group, head_dim)
    o, s = _attend(q_all, k, v, None, scale, softcap)
    o = o.view(num_kv_heads, batch, group, head_dim).permute(1, 0, 2, 3)
    return o, s.view(num_kv_heads, batch, group).permute(1, 0, 2)


def _window_part(
    block_tables: torch.Tensor, idx: list[int], lens: list[int], block_size: int, window: int
) -> _Part:
    """Decode rows `idx` with a sliding window: each gathers its blocks from the first one its window
    touches (the same count for all, the widest; columns past a table's end repeat its last column
    and are masked), keys outside (len - window, len) masked."""
    device = block_tables.device
    first = [max(0, lens[i] - window) // block_size for i in idx]
    count = max(-(-lens[i] // block_size) - f for i, f in zip(idx, first, strict=True))
    rows = torch.tensor(idx, device=device)
    cols = (torch.tensor(first, device=device)[:, None] + torch.arange(count, device=device)).clamp_max(
        block_tables.shape[1] - 1
    )
    ids = block_tables.index_select(0, rows).gather(1, cols).reshape(-1).long().clamp_min(0)
    key_pos = torch.tensor(first, device=device)[:, None] * block_size + torch.arange(count * block_size, device=device)
    own = torch.tensor([lens[i] for i in idx], device=device)[:, None]
    outside = (key_pos >= own) | (key_pos < own - window)
    mask = torch.zeros(outside.shape, device=device).masked_fill_(outside, float("-inf"))
    return _Part(rows, ids, len(idx), count * block_size, mask[:, None, None, :])


def plan_decode(
    block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int, group_size: int = _DECODE_GROUP,
    window: int = 0,
) -> AttentionPlan:  # fmt: skip
    lens = context_lens.tolist()
    device = block_tables.device
    if window and max(lens, default=0) <= window:
        window = 0  # every key is inside every window: the plain plan (and its cascade)
    shared = 0 if window else decode_shared_blocks(block_tables, lens, block_size)
    base = shared * block_size
    order = sorted(range(len(lens)), key=lens.__getitem__)
    parts = []
    for lo in range(0, len(order), group_size):
        idx = order[lo : lo + group_size]
        if window:
            parts.append(_window_part(block_tables, idx, lens, block_size, window))
            continue
        width = -(-lens[idx[-1]] // block_size)  # sorted: the last is the longest
        rows = torch.tensor(idx, device=device)
        ids = block_tables.index_select(0, rows)[:, shared:width].reshape(-1).long().clamp_min(0)
        key_pos = torch.arange(base, width * block_size, device=device)
        own = torch.tensor([lens[i] for i in idx], device=device)
        mask = torch.zeros(len(idx), 1, 1, key_pos.numel(), device=device)
        mask.masked_fill_((key_pos[None, :] >= own[:, None])[:, None, None, :], float("-inf"))
        parts.append(_Part(rows, ids, len(idx), key_pos.numel(), mask))
    shared_ids = block_tables[0, :shared].long() if shared else None
    return AttentionPlan(parts, shared_ids)


def decode_with_plan(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan, scale: float,
    out: torch.Tensor | None = None, options: AttentionOptions = FULL_ATTENTION,
) -> torch.Tensor:  # fmt: skip
    """paged_decode_attention with a prebuilt plan_decode(...)."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    qf = q.view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)  # [B, Hkv, G, D]
    result = torch.empty(qf.shape, dtype=torch.float32, device=q.device)  # [B, Hkv, G, D]
    lse = torch.empty(qf.shape[:3], dtype=torch.float32, device=q.device)
    for part in plan.parts:  # gather each group's blocks, attend, scatter back by rows
        k = _gather(k_cache, part.block_ids, part.num_seqs, part.num_keys)
        v = _gather(v_cache, part.block_ids, part.num_seqs, part.num_keys)
        o, s = _attend(qf.index_select(0, part.rows), k, v, part.mask, scale, options.softcap)
        result[part.rows], lse[part.rows] = o, s
    if plan.shared_ids is not None:
        o2, s2 = attend_shared_blocks(qf, k_cache, v_cache, plan.shared_ids, scale, options.softcap)
        result, lse = merge_partials(result, lse, o2, s2), torch.logaddexp(lse, s2)
    if options.sinks is not None:
        apply_sinks(result, lse, options.sinks)
    result = result.reshape(batch, num_heads, head_dim)
    if out is None:
        return result.to(q.dtype)
    out.copy_(result)
    return out


def paged_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, out: torch.Tensor | None = None,
    options: AttentionOptions = FULL_ATTENTION,
) -> torch.Tensor:  # fmt: skip
    """q [B, Hq, D] attends keys 0..context_lens[b]-1 of its sequence (the last `options.window` of
    them when that is > 0); returns [B, Hq, D].

    k_cache, v_cache: [num_blocks, block_size, Hkv, D]; block_tables int32 [B, max_blocks]
    (entries past a sequence's blocks are ignored); context_lens int32 [B], each >= 1.
    Slots past a sequence's context in its last block get weight 0 but must hold finite values
    (0 * NaN is NaN): the engine allocates its cache zeroed. The Triton kernel does not read them.
    options.sinks join each head's softmax denominator through apply_sinks.
    """
    plan = plan_decode(block_tables, context_lens, k_cache.shape[1], window=options.window)
    return decode_with_plan(q, k_cache, v_cache, plan, scale, out, options)


# ---- prefill ------------------------------------------------------------------------------------
def prefill_shared_blocks(starts: list[int], lens: list[int], block_tables: torch.Tensor, block_size: int) -> int:
    """Leading blocks every prefill sequence shares and is worth a cascade, else 0: only blocks
    before every sequence's first query (no causal cut inside). starts: cu_seqlens_q as a list."""
    first_query = min(c - (starts[b + 1] - starts[b]) for b, c in enumerate(lens))
    shared = _shared_blocks(block_tables, first_query // block_size)
    return shared if shared * block_size >= _MIN_SHARED_TOKENS else 0


def attend_shared_prefill(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, shared_ids: torch.Tensor, scale: float,
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Every prefill query q [T, Hq, D] over the same blocks (read once, one call) -> (out [T, Hkv,
    G, D], lse [T, Hkv, G]), to merge with the rest of each context."""
    total, num_kv_heads = q.shape[0], k_cache.shape[2]
    n = shared_ids.numel() * k_cache.shape[1]
    k = _gather(k_cache, shared_ids, 1, n)
    v = _gather(v_cache, shared_ids, 1, n)
    o, s = _attend(_fold_tokens(q, num_kv_heads), k, v, None, scale, softcap)
    return _unfold_tokens(o, total), _unfold_tokens(s[..., None], total)[..., 0]


def plan_prefill(
    cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, block_tables: torch.Tensor, block_size: int,
    group: int, window: int = 0,
) -> AttentionPlan:  # fmt: skip
    starts = cu_seqlens_q.tolist()
    lens = context_lens.tolist()
    device = block_tables.device
    q_lens = [starts[b + 1] - starts[b] for b in range(len(lens))]
    if window and max(lens, default=0) <= window:
        window = 0  # every key is inside every window: the plain plan (and its cascade)
    shared = 0 if window else prefill_shared_blocks(starts, lens, block_tables, block_size)
    parts = []
    for b, ctx in enumerate(lens):
        q_len = q_lens[b]
        if q_len == 0:
            continue
        # the first block any query of the chunk sees: the cascade's end, or the first window's start
        first = max(shared, max(0, ctx - q_len - window + 1) // block_size if window > 0 else 0)
        base = first * block_size
        ids = block_tables[b, first : -(-ctx // block_size)].long()
        if ctx == q_len and (not window or ctx <= window):  # plain causal, which the kernel computes half of
            parts.append(_Part(slice(starts[b], starts[b] + q_len), ids, 1, ctx, None))
            continue
        # Query rows are (g, i): head g of the group, token i at position ctx - q_len + i.
        q_pos = torch.arange(ctx - q_len, ctx, device=device).repeat(group)
        k_pos = torch.arange(base, ctx, device=device)
        mask = torch.zeros(group * q_len, ctx - base, device=device)
        outside = k_pos[None, :] > q_pos[:, None]
        if window:
            outside |= k_pos[None, :] <= q_pos[:, None] - window
        mask.masked_fill_(outside, float("-inf"))
        parts.append(_Part(slice(starts[b], starts[b] + q_len), ids, 1, ctx - base, mask[None, None]))
    shared_ids = block_tables[0, :shared].long() if shared else None
    return AttentionPlan(parts, shared_ids)


def _fold_tokens(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """[n, Hq, D] -> [1, Hkv, G*n, D]; query row g*n + i is head g of the group at token i."""
    n, hq, d = q.shape
    return q.view(n, num_kv_heads, hq // num_kv_heads, d).permute(1, 2, 0, 3).reshape(1, num_kv_heads, -1, d)


def _unfold_tokens(x: torch.Tensor, n: int) -> torch.Tensor:
    """[1, Hkv, G*n, E] -> [n, Hkv, G, E]."""
    hkv, e = x.shape[1], x.shape[-1]
    return x.view(hkv, -1, n, e).permute(2, 0, 1, 3)


def prefill_with_plan(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan, scale: float,
    out: torch.Tensor | None = None, options: AttentionOptions = FULL_ATTENTION,
) -> torch.Tensor:  # fmt: skip
    """prefill_attention with a prebuilt plan_prefill(...)."""
    total, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    res = torch.empty(total, num_kv_heads, group, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(total, num_kv_heads, group, dtype=torch.float32, device=q.device)
    for part in plan.parts:
        n = part.rows.stop - part.rows.start
        k = _gather(k_cache, part.block_ids, 1, part.num_keys)
        v = _gather(v_cache, part.block_ids, 1, part.num_keys)
        if part.mask is None:
            o, s = _attend_causal(q[part.rows], k, v, scale, softcap=options.softcap)
            res[part.rows], lse[part.rows] = o, s
            continue
        o, s = _attend(_fold_tokens(q[part.rows], num_kv_heads), k, v, part.mask, scale, options.softcap)
        res[part.rows] = _unfold_tokens(o, n)
        lse[part.rows] = _unfold_tokens(s[..., None], n)[..., 0]
    if plan.shared_ids is not None:
        o2, s2 = attend_shared_prefill(q, k_cache, v_cache, plan.shared_ids, scale, options.softcap)
        res, lse = merge_partials(res, lse, o2, s2), torch.logaddexp(lse, s2)
    if options.sinks is not None:
        apply_sinks(res, lse, options.sinks)
    out.copy_(res.view(total, num_heads, head_dim))
    return out


def prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor, block_tables: torch.Tensor, scale: float, out: torch.Tensor | None = None,
    options: AttentionOptions = FULL_ATTENTION,
) -> torch.Tensor:  # fmt: skip
    """Varlen causal attention for T new query tokens of B sequences; returns [T, Hq, D].

    Sequence b owns q rows cu_seqlens_q[b]:cu_seqlens_q[b+1]; its chunk's K/V are already in the
    cache; its query i sits at position context_lens[b] - q_len_b + i and sees keys 0..position
    (position - window + 1..position when options.window > 0).
    options.sinks join each head's softmax denominator through apply_sinks.
    """
    group = q.shape[1] // k_cache.shape[2]
    plan = plan_prefill(cu_seqlens_q, context_lens, block_tables, k_cache.shape[1], group, options.window)
    return prefill_with_plan(q, k_cache, v_cache, plan, scale, out, options)
