"""Triton varlen causal prefill attention over the paged cache vs the torch reference, in Triton's
interpreter: empty and long cached prefixes, GQA 1/4/8, head dims 64/128, awkward lengths."""

import pytest
import torch
from kernel_cases import assert_close, poisoned, randn
from paged_cases import block_tables_for, random_cache

from kernels import reference
from kernels.triton.prefill_attention import PrefillConfig, prefill_attention

_SMALL = PrefillConfig(block_m=16, block_n=16, num_warps=4, num_stages=1)


def _case(q_lens: list[int], prefixes: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
          block_size: int, dtype: torch.dtype = torch.float32):
    ctx = [p + n for p, n in zip(prefixes, q_lens, strict=True)]
    num_blocks = sum(-(-n // block_size) for n in ctx) + 2
    k_cache, v_cache = random_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype)
    tables = block_tables_for(ctx, block_size, num_blocks)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = randn(sum(q_lens), num_heads, head_dim, dtype=dtype)
    return q, k_cache, v_cache, cu, torch.tensor(ctx, dtype=torch.int32), tables


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"), [(2, 2, 64), (4, 1, 128), (8, 1, 64), (3, 1, 80)]  # GQA 1,4,8,3
)
def test_prefill_matches_reference(num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    # empty prefix, long prefix over many blocks, a one-token chunk, an empty chunk, a prefix that
    # ends mid-block and a chunk longer than two query tiles
    q_lens = [19, 7, 1, 0, 37]
    prefixes = [0, 61, 12, 4, 3]
    q, kc, vc, cu, ctx, tables = _case(q_lens, prefixes, num_heads, num_kv_heads, head_dim, block_size=5)
    out = poisoned(*q.shape)
    got = prefill_attention(q, kc, vc, cu, ctx, tables, head_dim**-0.5, out, config=_SMALL)
    assert got is out
    ref = reference.prefill_attention(q, kc, vc, cu, ctx, tables, head_dim**-0.5)
    assert_close(out, ref, atol=2e-5, rtol=1e-4)


def test_prefill_bf16_default_config() -> None:
    q, kc, vc, cu, ctx, tables = _case([130, 9], [0, 40], 4, 2, 64, block_size=16, dtype=torch.bfloat16)
    got = prefill_attention(q, kc, vc, cu, ctx, tables, 0.125)
    ref = reference.prefill_attention(q, kc, vc, cu, ctx, tables, 0.125)
    assert_close(got, ref, atol=2e-2, rtol=2e-2)


def test_prefill_one_token_chunks_equal_decode() -> None:
    """A chunk of one token is a decode step: both kernels must agree."""
    from kernels.triton.paged_decode_attention import paged_decode_attention

    q, kc, vc, cu, ctx, tables = _case([1, 1, 1], [0, 33, 8], 8, 2, 64, block_size=8)
    pre = prefill_attention(q, kc, vc, cu, ctx, tables, 0.125, config=_SMALL)
    dec = paged_decode_attention(q, kc, vc, tables, ctx, 0.125)
    assert_close(pre, dec, atol=2e-5, rtol=1e-4)


def test_prefill_rejects_bad_arguments() -> None:
    q, kc, vc, cu, ctx, tables = _case([3, 2], [0, 1], 4, 2, 64, block_size=4)
    with pytest.raises(ValueError, match="cu_seqlens_q must be int32"):
        prefill_attention(q, kc, vc, cu.long(), ctx, tables, 0.1)
    with pytest.raises(ValueError, match=r"context_lens must have shape \[2\]"):
        prefill_attention(q, kc, vc, cu, ctx[:1], tables, 0.1)
    with pytest.raises(ValueError, match=r"block_tables must have shape \[2, \*\]"):
        prefill_attention(q, kc, vc, cu, ctx, tables[:1], 0.1)
    with pytest.raises(ValueError, match="must have the same shape"):
        prefill_attention(q, kc, vc[:, :2], cu, ctx, tables, 0.1)
    with pytest.raises(ValueError, match="must rise from 0 to the number of query rows"):
        prefill_attention(q, kc, vc, torch.tensor([0, 3, 4], dtype=torch.int32), ctx, tables, 0.1)
    with pytest.raises(ValueError, match="must be >= the chunk length"):
        prefill_attention(q, kc, vc, cu, torch.tensor([2, 3], dtype=torch.int32), tables, 0.1)
    with pytest.raises(ValueError, match="does not fit the block tables"):
        prefill_attention(q, kc, vc, cu, torch.tensor([3, 40], dtype=torch.int32), tables, 0.1)
    with pytest.raises(ValueError, match="expanded view"):
        prefill_attention(q, kc, vc, cu, ctx, tables, 0.1, torch.empty(1, 4, 64).expand(5, 4, 64))


def test_prefill_chunks_after_a_shared_cached_prefix() -> None:
    """Two sequences hit the same cached prefix blocks (80 tokens) and prefill their own chunks."""
    bs, shared_blocks = 16, 5
    q_lens = [21, 40]
    ctx = [shared_blocks * bs + n for n in q_lens]
    own = [-(-n // bs) for n in q_lens]
    num_blocks = shared_blocks + sum(own)
    kc, vc = random_cache(num_blocks, bs, 1, 64, torch.float32)
    tables = torch.zeros(2, shared_blocks + max(own), dtype=torch.int32)
    tables[:, :shared_blocks] = torch.arange(shared_blocks, dtype=torch.int32).flip(0)
    tables[0, shared_blocks : shared_blocks + own[0]] = torch.arange(shared_blocks, shared_blocks + own[0])
    tables[1, shared_blocks : shared_blocks + own[1]] = torch.arange(shared_blocks + own[0], num_blocks)
    cu = torch.tensor([0, q_lens[0], sum(q_lens)], dtype=torch.int32)
    lens = torch.tensor(ctx, dtype=torch.int32)
    q = randn(sum(q_lens), 4, 64)
    got = prefill_attention(q, kc, vc, cu, lens, tables, 0.125, poisoned(*q.shape), config=_SMALL)
    assert_close(got, reference.prefill_attention(q, kc, vc, cu, lens, tables, 0.125), atol=2e-5, rtol=1e-4)
