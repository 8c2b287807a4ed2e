"""Triton paged decode attention (flash-decoding) vs the torch reference, in Triton's interpreter."""

import pytest
import torch
from kernel_cases import assert_close, poisoned, randn
from paged_cases import block_tables_for, random_cache

from kernels import reference
from kernels.triton.paged_decode_attention import DecodeConfig, paged_decode_attention


def _case(lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
          dtype: torch.dtype = torch.float32, spare_blocks: int = 3):
    num_blocks = sum(-(-n // block_size) for n in lens) + spare_blocks
    k_cache, v_cache = random_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype)
    tables = block_tables_for(lens, block_size, num_blocks)
    q = randn(len(lens), num_heads, head_dim, dtype=dtype)
    return q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "splits"),
    [(2, 2, 64, 1), (8, 2, 128, 1), (8, 1, 64, 3), (4, 1, 128, 4), (6, 2, 80, 2)],  # GQA 1, 4, 8, 4, 3; D 80
)
def test_decode_matches_reference(num_heads: int, num_kv_heads: int, head_dim: int, splits: int) -> None:
    # lengths: 1 token, not multiples of the tile (16) nor of the block (5), one over many blocks
    lens = [1, 23, 70, 5]
    q, kc, vc, tables, ctx = _case(lens, num_heads, num_kv_heads, head_dim, block_size=5)
    out = poisoned(*q.shape)
    cfg = DecodeConfig(block_n=16, num_splits=splits)
    got = paged_decode_attention(q, kc, vc, tables, ctx, head_dim**-0.5, out, config=cfg)
    assert got is out
    ref = reference.paged_decode_attention(q, kc, vc, tables, ctx, head_dim**-0.5)
    assert_close(out, ref, atol=2e-5, rtol=1e-4)


def test_decode_bf16_default_config() -> None:
    lens = [300, 17, 129]  # split heuristic: 300-token tables give one split on the interpreter's 4 "SMs"
    q, kc, vc, tables, ctx = _case(lens, 8, 1, 64, block_size=16, dtype=torch.bfloat16)
    got = paged_decode_attention(q, kc, vc, tables, ctx, 0.125)
    ref = reference.paged_decode_attention(q, kc, vc, tables, ctx, 0.125)
    assert got.dtype == torch.bfloat16
    assert_close(got, ref, atol=2e-2, rtol=2e-2)


def test_decode_many_splits_some_empty() -> None:
    """More splits than a short sequence has tokens: its empty splits must weigh nothing."""
    lens = [3, 96]
    q, kc, vc, tables, ctx = _case(lens, 4, 4, 64, block_size=8)
    cfg = DecodeConfig(block_n=16, num_splits=6)
    got = paged_decode_attention(q, kc, vc, tables, ctx, 0.2, config=cfg)
    assert_close(got, reference.paged_decode_attention(q, kc, vc, tables, ctx, 0.2), atol=2e-5, rtol=1e-4)


def test_decode_reads_only_its_own_blocks() -> None:
    """Poison every cache block no sequence owns: the result must not change (nor turn NaN)."""
    lens = [9, 14]
    q, kc, vc, tables, ctx = _case(lens, 4, 2, 64, block_size=4, spare_blocks=4)
    owned = set(tables[tables >= 0].tolist())
    for blk in range(kc.shape[0]):
        if blk not in owned:
            kc[blk] = float("nan")
            vc[blk] = float("nan")
    # slots past each context inside owned blocks are garbage too
    for b, n in enumerate(lens):
        last = int(tables[b, (n - 1) // 4])
        kc[last, (n - 1) % 4 + 1 :] = float("nan")
        vc[last, (n - 1) % 4 + 1 :] = float("nan")
    got = paged_decode_attention(q, kc, vc, tables, ctx, 0.125, config=DecodeConfig(block_n=16, num_splits=2))
    ref = reference.paged_decode_attention(q, kc.nan_to_num(), vc.nan_to_num(), tables, ctx, 0.125)
    assert_close(got, ref, atol=2e-5, rtol=1e-4)


def test_decode_rejects_bad_arguments() -> None:
    q, kc, vc, tables, ctx = _case([5, 6], 4, 2, 64, block_size=4)
    with pytest.raises(ValueError, match="multiple of the number of KV heads"):
        paged_decode_attention(randn(2, 3, 64), kc, vc, tables, ctx, 0.1)
    with pytest.raises(ValueError, match="block_tables must be int32"):
        paged_decode_attention(q, kc, vc, tables.long(), ctx, 0.1)
    with pytest.raises(ValueError, match=r"context_lens must have shape \[2\]"):
        paged_decode_attention(q, kc, vc, tables, ctx[:1], 0.1)
    with pytest.raises(ValueError, match="share one dtype"):
        paged_decode_attention(q.to(torch.bfloat16), kc, vc, tables, ctx, 0.1)
    with pytest.raises(ValueError, match=r"out must have shape \[2, 4, 64\]"):
        paged_decode_attention(q, kc, vc, tables, ctx, 0.1, torch.empty(2, 4, 32))
    with pytest.raises(ValueError, match="context_lens must be contiguous in its last dimension"):
        paged_decode_attention(q, kc, vc, tables, torch.tensor([5, 0, 6, 0], dtype=torch.int32)[::2], 0.1)
    with pytest.raises(ValueError, match="out must be contiguous in its last dimension"):
        paged_decode_attention(q, kc, vc, tables, ctx, 0.1, torch.empty(2, 4, 128)[..., ::2])
    with pytest.raises(ValueError, match="block_tables has no columns"):
        paged_decode_attention(q, kc, vc, tables[:, :0], ctx, 0.1)
    with pytest.raises(ValueError, match="scale must be a finite positive"):
        paged_decode_attention(q, kc, vc, tables, ctx, float("nan"))


def test_decode_ignores_slots_past_the_context() -> None:
    """Slots past a sequence's context get weight 0. The reference's contract needs them finite (the
    engine allocates its cache zeroed); the Triton kernel never reads them, so even NaN stays out."""
    q, kc, vc, tables, ctx = _case([6], 1, 1, 8, block_size=4, spare_blocks=0)
    last = int(tables[0, 1])
    clean = reference.paged_decode_attention(q, kc, vc, tables, ctx, 0.3)
    kc[last, 2:], vc[last, 2:] = 1e4, -1e4  # finite garbage: the reference must ignore it
    assert_close(reference.paged_decode_attention(q, kc, vc, tables, ctx, 0.3), clean, atol=2e-5, rtol=1e-4)
    kc[last, 2:], vc[last, 2:] = float("nan"), float("nan")
    assert_close(paged_decode_attention(q, kc, vc, tables, ctx, 0.3), clean, atol=2e-5, rtol=1e-4)


def test_decode_shared_prefix_blocks() -> None:
    """Sequences whose tables start with the same physical blocks (a prefix-cache hit), long enough
    for the reference's cascade path (>= 64 shared tokens)."""
    bs, shared_blocks = 16, 5
    lens = [shared_blocks * bs + 7, shared_blocks * bs + 30, shared_blocks * bs + 1]
    own = [-(-(n - shared_blocks * bs) // bs) for n in lens]
    num_blocks = shared_blocks + sum(own) + 1
    kc, vc = random_cache(num_blocks, bs, 2, 64, torch.float32)
    perm = torch.randperm(num_blocks).tolist()
    tables = torch.zeros(len(lens), shared_blocks + max(own), dtype=torch.int32)
    tables[:, :shared_blocks] = torch.tensor(perm[:shared_blocks], dtype=torch.int32)
    nxt = shared_blocks
    for b, n in enumerate(own):
        tables[b, shared_blocks : shared_blocks + n] = torch.tensor(perm[nxt : nxt + n], dtype=torch.int32)
        nxt += n
    q = randn(len(lens), 8, 64)
    ctx = torch.tensor(lens, dtype=torch.int32)
    got = paged_decode_attention(q, kc, vc, tables, ctx, 0.125, config=DecodeConfig(block_n=32, num_splits=2))
    assert_close(got, reference.paged_decode_attention(q, kc, vc, tables, ctx, 0.125), atol=2e-5, rtol=1e-4)


def test_decode_context_past_the_table_is_cut_not_read() -> None:
    """A context_lens entry larger than the block table holds reads only the table's blocks."""
    q, kc, vc, tables, ctx = _case([8, 12], 4, 2, 64, block_size=4, spare_blocks=0)
    too_long = torch.tensor([8, 12 + 40], dtype=torch.int32)
    got = paged_decode_attention(q, kc, vc, tables, too_long, 0.125, config=DecodeConfig(block_n=16, num_splits=1))
    assert_close(got, reference.paged_decode_attention(q, kc, vc, tables, ctx, 0.125), atol=2e-5, rtol=1e-4)
