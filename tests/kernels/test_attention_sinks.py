"""Attention sinks (gpt-oss: a per-head logit in each softmax's denominator, no value) in every
backend against a dense oracle written as transformers' eager gpt-oss attention computes it: the
torch references (plain, with a shared-prefix cascade), the C kernels (CpuBackend) and the Triton
kernels under the interpreter (decode with and without splits, prefill with a cached prefix)."""

import pytest
import torch
from kernel_cases import assert_close, randn
from paged_cases import random_cache

from kernels import reference
from kernels.attention_options import AttentionOptions
from kernels.triton.paged_decode_attention import DecodeConfig
from kernels.triton.paged_decode_attention import paged_decode_attention as triton_decode
from kernels.triton.prefill_attention import PrefillConfig
from kernels.triton.prefill_attention import prefill_attention as triton_prefill
from worker.engine.backends.base import AttentionMetadata

HQ, HKV, D, BS = 8, 2, 64, 16
SCALE = D**-0.5


def _oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, sinks: torch.Tensor):
    """q [n, Hq, D] at positions q_pos over one sequence's keys k/v [L, Hkv, D] (causal): concatenate
    the sink to each row's scores, softmax, drop the sink's column."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = torch.einsum("nhd,lhd->hnl", q, k) * SCALE
    s = s.masked_fill(torch.arange(k.shape[0])[None, None, :] > q_pos[None, :, None], float("-inf"))
    s = torch.cat([s, sinks[:, None, None].expand(-1, q.shape[0], 1)], dim=-1)
    p = torch.softmax(s, dim=-1)[..., :-1]
    return torch.einsum("hnl,lhd->nhd", p, v)


def _tables(lens: list[int], shared_blocks: int, num_blocks: int) -> torch.Tensor:
    """int32 [B, max_blocks]: every sequence starts with the same `shared_blocks` blocks (a cached
    prompt prefix), then blocks of its own."""
    need = [-(-n // BS) for n in lens]
    perm = torch.randperm(num_blocks).tolist()
    shared, perm = perm[:shared_blocks], perm[shared_blocks:]
    table = torch.full((len(lens), max(need)), -1, dtype=torch.int32)
    for b, n in enumerate(need):
        table[b, :n] = torch.tensor(shared + perm[: n - shared_blocks], dtype=torch.int32)
        perm = perm[n - shared_blocks :]
    return table


def _keys(cache: torch.Tensor, table: torch.Tensor, b: int, length: int) -> torch.Tensor:
    return cache[table[b, : -(-length // BS)].long()].reshape(-1, HKV, D)[:length]


@pytest.mark.parametrize("shared_blocks", [0, 5])  # 5 blocks = 80 tokens: the cascade path
def test_decode_with_sinks(shared_blocks: int) -> None:
    from worker.engine.backends.cpu_backend import CpuBackend

    lens = [1 + shared_blocks * BS, 37 + shared_blocks * BS, 90 + shared_blocks * BS, 150]
    if shared_blocks:
        lens[3] = 150 + shared_blocks * BS
    kc, vc = random_cache(40, BS, HKV, D, torch.float32)
    table = _tables(lens, shared_blocks, 40)
    ctx = torch.tensor(lens, dtype=torch.int32)
    q = randn(len(lens), HQ, D)
    sinks = 2 * randn(HQ)
    want = torch.cat([_oracle(q[b : b + 1], _keys(kc, table, b, n), _keys(vc, table, b, n),
                              torch.tensor([n - 1]), sinks) for b, n in enumerate(lens)])  # fmt: skip
    plain = reference.paged_decode_attention(q, kc, vc, table, ctx, SCALE)
    assert (plain - want).abs().max() > 1e-2  # the sinks change the result
    assert_close(reference.paged_decode_attention(q, kc, vc, table, ctx, SCALE, options=AttentionOptions(sinks)), want, atol=2e-5, rtol=1e-4)
    cpu = CpuBackend()
    assert_close(cpu.paged_decode_attention(q, kc, vc, table, ctx, SCALE, options=AttentionOptions(sinks)), want, atol=2e-5, rtol=1e-4)
    for splits in (1, 3):
        got = triton_decode(q, kc, vc, table, ctx, SCALE, None, AttentionOptions(sinks), config=DecodeConfig(block_n=16, num_splits=splits))
        assert_close(got, want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("shared_blocks", [0, 5])
def test_prefill_with_sinks(shared_blocks: int) -> None:
    """Three sequences: a whole prompt (plain causal), a chunk after a cached prefix, a one-token chunk."""
    from worker.engine.backends.cpu_backend import CpuBackend

    base = shared_blocks * BS
    lens, q_lens = [base + 40, base + 70, base + 20], [base + 40 if not shared_blocks else 40, 30, 1]
    kc, vc = random_cache(40, BS, HKV, D, torch.float32)
    table = _tables(lens, shared_blocks, 40)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    ctx = torch.tensor(lens, dtype=torch.int32)
    q = randn(int(cu[-1]), HQ, D)
    sinks = 2 * randn(HQ)
    want = torch.cat([
        _oracle(q[cu[b] : cu[b + 1]], _keys(kc, table, b, n), _keys(vc, table, b, n),
                torch.arange(n - q_lens[b], n), sinks)
        for b, n in enumerate(lens)
    ])  # fmt: skip
    got = reference.prefill_attention(q, kc, vc, cu, ctx, table, SCALE, options=AttentionOptions(sinks))
    assert_close(got, want, atol=2e-5, rtol=1e-4)
    meta = AttentionMetadata(slot_mapping=torch.zeros(0, dtype=torch.int64), num_prefill_tokens=q.shape[0],
                             prefill_cu_seqlens_q=cu, prefill_context_lens=ctx, prefill_block_tables=table)  # fmt: skip
    out = torch.empty_like(q)
    CpuBackend().prefill_rows(q, kc, vc, meta, SCALE, out, AttentionOptions(sinks))
    assert_close(out, want, atol=2e-5, rtol=1e-4)
    got = triton_prefill(q, kc, vc, cu, ctx, table, SCALE, None, AttentionOptions(sinks), config=PrefillConfig(block_m=16, block_n=16))
    assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_triton_refuses_sinks_of_the_wrong_shape() -> None:
    kc, vc = random_cache(4, BS, HKV, D, torch.float32)
    table = torch.tensor([[0]], dtype=torch.int32)
    with pytest.raises(ValueError, match="sinks"):
        triton_decode(randn(1, HQ, D), kc, vc, table, torch.tensor([3], dtype=torch.int32), SCALE, None,
                      AttentionOptions(randn(HKV)))


def test_c_kernels_refuse_sinks() -> None:
    """The C kernels return the log-sum-exp for their caller to apply the sinks with: given sinks, they refuse."""
    from kernels.cpu.paged_decode_attention import NativeDecodeAttention

    kc, vc = random_cache(4, BS, HKV, D, torch.float32)
    table, ctx = torch.tensor([[0]], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    with pytest.raises(ValueError, match="take no sinks"):
        NativeDecodeAttention()(randn(1, HQ, D), kc, vc, table, ctx, SCALE, options=AttentionOptions(randn(HQ)))
