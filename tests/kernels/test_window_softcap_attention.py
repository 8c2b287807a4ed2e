"""Sliding windows and attention soft-capping: the torch references against dense attention with
Hugging Face's mask (key j visible from position p iff p - window < j <= p; scores capped as
softcap * tanh(s / softcap) before the mask), then the Triton kernels (interpreted) against the
references. Blocks wholly outside every window are poisoned with NaN: no implementation may read
them (the block manager recycles them)."""

import pytest
import torch
from kernel_cases import assert_close, poisoned, randn
from paged_cases import block_tables_for, random_cache

from kernels import reference
from kernels.attention_options import AttentionOptions
from kernels.cpu.paged_decode_attention import NativeDecodeAttention
from kernels.cpu.paged_prefill_attention import NativePrefillAttention
from kernels.triton.paged_decode_attention import DecodeConfig
from kernels.triton.paged_decode_attention import paged_decode_attention as triton_decode
from kernels.triton.prefill_attention import PrefillConfig
from kernels.triton.prefill_attention import prefill_attention as triton_prefill

BS = 4  # tokens per block
OPTIONS = [(0, 0.0), (7, 0.0), (0, 2.0), (9, 1.5), (1, 0.0)]  # (window, softcap)


def _dense(q, keys, values, q_pos, scale, window, softcap):
    """q [M, Hq, D] at positions q_pos [M]; keys/values [L, Hkv, D] at positions 0..L-1."""
    group = q.shape[1] // keys.shape[1]
    k = keys.repeat_interleave(group, dim=1).float()
    v = values.repeat_interleave(group, dim=1).float()
    s = torch.einsum("mhd,lhd->hml", q.float(), k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    j = torch.arange(keys.shape[0])
    visible = j[None, :] <= q_pos[:, None]
    if window:
        visible &= j[None, :] > q_pos[:, None] - window
    s = s.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hml,lhd->mhd", torch.softmax(s, dim=-1), v)


def _contiguous_keys(cache, table, ctx):
    return torch.cat([cache[b] for b in table[: -(-ctx // BS)].tolist()])[:ctx]


def _poison_outside(kc, vc, tables, first_query, window):
    """NaN into every block wholly before each sequence's first visible key."""
    if not window:
        return
    for b, first in enumerate(first_query):
        for i in range(max(0, first - window + 1) // BS):
            kc[tables[b, i]] = float("nan")
            vc[tables[b, i]] = float("nan")


@pytest.mark.parametrize(("window", "softcap"), OPTIONS)
def test_decode_window_softcap(window: int, softcap: float) -> None:
    lens = [1, 6, 23, 40]
    num_blocks = sum(-(-n // BS) for n in lens) + 2
    kc, vc = random_cache(num_blocks, BS, 2, 32, torch.float32)
    tables = block_tables_for(lens, BS, num_blocks)
    q = randn(len(lens), 8, 32)
    ctx = torch.tensor(lens, dtype=torch.int32)
    dense = torch.stack([
        _dense(q[b : b + 1], _contiguous_keys(kc, tables[b], n), _contiguous_keys(vc, tables[b], n),
               torch.tensor([n - 1]), 0.3, window, softcap)[0]
        for b, n in enumerate(lens)
    ])  # fmt: skip
    _poison_outside(kc, vc, tables, [n - 1 for n in lens], window)
    ref = reference.paged_decode_attention(q, kc, vc, tables, ctx, 0.3, options=AttentionOptions(window=window, softcap=softcap))
    assert_close(ref, dense, atol=2e-5, rtol=1e-4)
    for splits in (1, 3):
        out = poisoned(*q.shape)
        triton_decode(q, kc, vc, tables, ctx, 0.3, out, options=AttentionOptions(window=window, softcap=softcap), config=DecodeConfig(block_n=16, num_splits=splits))
        assert_close(out, ref, atol=2e-5, rtol=1e-4)
    native = NativeDecodeAttention()  # the C kernel (cpu backend), when it builds here
    out = poisoned(*q.shape)
    native(q, kc, vc, tables.clamp_min(0), ctx, 0.3, out, options=AttentionOptions(window=window, softcap=softcap))
    assert_close(out, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(("window", "softcap"), OPTIONS)
def test_prefill_window_softcap(window: int, softcap: float) -> None:
    q_lens, prefixes = [19, 7, 1, 37], [0, 29, 12, 3]  # fresh, chunk after a long prefix, one token, long chunk
    lens = [p + n for p, n in zip(prefixes, q_lens, strict=True)]
    num_blocks = sum(-(-n // BS) for n in lens) + 2
    kc, vc = random_cache(num_blocks, BS, 1, 32, torch.float32)
    tables = block_tables_for(lens, BS, num_blocks)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = randn(sum(q_lens), 4, 32)
    ctx = torch.tensor(lens, dtype=torch.int32)
    dense = torch.cat([
        _dense(q[cu[b] : cu[b + 1]], _contiguous_keys(kc, tables[b], n), _contiguous_keys(vc, tables[b], n),
               torch.arange(p, n), 0.25, window, softcap)
        for b, (p, n) in enumerate(zip(prefixes, lens, strict=True))
    ])  # fmt: skip
    _poison_outside(kc, vc, tables, prefixes, window)
    ref = reference.prefill_attention(q, kc, vc, cu, ctx, tables, 0.25, options=AttentionOptions(window=window, softcap=softcap))
    assert_close(ref, dense, atol=2e-5, rtol=1e-4)
    out = poisoned(*q.shape)
    cfg = PrefillConfig(block_m=16, block_n=16, num_warps=4, num_stages=1)
    triton_prefill(q, kc, vc, cu, ctx, tables, 0.25, out, options=AttentionOptions(window=window, softcap=softcap), config=cfg)
    assert_close(out, ref, atol=2e-5, rtol=1e-4)
    out = poisoned(*q.shape)  # the C kernel (cpu backend)
    NativePrefillAttention()(q, kc, vc, cu, ctx, tables.clamp_min(0), 0.25, out, options=AttentionOptions(window=window, softcap=softcap))
    assert_close(out, ref, atol=2e-5, rtol=1e-4)
