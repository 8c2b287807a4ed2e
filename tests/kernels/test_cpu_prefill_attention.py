"""The C prefill-attention kernel (kernels/cpu) against the torch reference, and the cpu backend's use of it."""

import pytest
import torch
from kernel_cases import assert_close, poisoned, randn
from paged_cases import block_tables_for, random_cache

from kernels.cpu.paged_prefill_attention import NativePrefillAttention
from kernels.reference import prefill_attention
from kernels.reference.attention import _attend_math
from worker.engine.backends.base import AttentionMetadata
from worker.engine.backends.cpu_backend import CpuBackend


@pytest.fixture(scope="module")
def native() -> NativePrefillAttention:
    return NativePrefillAttention()


def _case(q_lens: list[int], ctxs: list[int], hq: int, hkv: int, d: int, bs: int, num_blocks: int = 256):
    """Sequence b computes its last q_lens[b] tokens of ctxs[b] (its earlier ones are in cache)."""
    k_cache, v_cache = random_cache(num_blocks, bs, hkv, d, torch.float32)
    tables = block_tables_for(ctxs, bs, num_blocks)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return randn(sum(q_lens), hq, d), k_cache, v_cache, cu, torch.tensor(ctxs, dtype=torch.int32), tables


@pytest.mark.parametrize(
    ("hq", "hkv", "d", "bs", "q_lens", "ctxs"),
    [
        (4, 2, 16, 16, [1, 15, 16, 17, 40], [1, 15, 16, 17, 40]),  # the engine tests' shape; fresh prompts
        (8, 4, 64, 16, [300, 17, 1, 64, 33], [300, 40, 100, 64, 200]),  # the bench model; chunked prefill
        (8, 8, 32, 4, [5, 9, 1, 12], [5, 20, 3, 12]),  # no GQA (tiles of 12 tokens), small blocks
        (14, 2, 128, 16, [50, 3], [120, 3]),  # a group of 7 (Qwen2-0.5B's): one token per tile
        (16, 16, 64, 8, [13], [29]),  # blocks smaller than a vector on AVX-512
        (2, 1, 256, 32, [70, 33], [70, 90]),  # the largest compiled head_dim, large blocks
    ],
)
def test_matches_reference(native, hq, hkv, d, bs, q_lens, ctxs) -> None:
    q, k_cache, v_cache, cu, cl, tables = _case(q_lens, ctxs, hq, hkv, d, bs)
    expected = prefill_attention(q, k_cache, v_cache, cu, cl, tables, d**-0.5)
    out = poisoned(sum(q_lens), hq, d)
    assert native.supports(q, k_cache)
    native(q, k_cache, v_cache, cu, cl, tables, d**-0.5, out)
    assert_close(out, expected, atol=2e-5, rtol=1e-5)


def test_strided_queries_and_threads(native) -> None:
    """q as a view into a wider qkv row (as the model passes it); 1, 2 and 3 threads agree exactly."""
    q_lens, ctxs = [37, 5, 90, 16, 1, 64], [37, 50, 90, 40, 1, 200]
    _, k_cache, v_cache, cu, cl, tables = _case(q_lens, ctxs, 8, 4, 64, 16)
    qkv = randn(sum(q_lens), 8 * 64 + 2 * 4 * 64)
    q = qkv[:, : 8 * 64].view(-1, 8, 64)
    assert not q.is_contiguous()
    expected = prefill_attention(q.contiguous(), k_cache, v_cache, cu, cl, tables, 0.125)
    outs = [native(q, k_cache, v_cache, cu, cl, tables, 0.125, num_threads=n) for n in (1, 2, 3)]
    assert_close(outs[0], expected, atol=2e-5, rtol=1e-5)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_start_block_and_lse(native) -> None:
    """Keys from start_block on only, with each row's log-sum-exp, against plain math on those keys."""
    q_lens, ctxs, bs, start = [6, 20], [30, 40], 8, 2
    q, k_cache, v_cache, cu, cl, tables = _case(q_lens, ctxs, 4, 2, 16, bs)
    lse = poisoned(sum(q_lens), 4)
    out = native(q, k_cache, v_cache, cu, cl, tables, 0.25, start_block=start, lse=lse)
    for b, (n, ctx) in enumerate(zip(q_lens, ctxs, strict=True)):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        slots = torch.tensor([int(tables[b, i // bs]) * bs + i % bs for i in range(start * bs, ctx)])
        k = k_cache.view(-1, 2, 16)[slots].transpose(0, 1)[None]  # [1, Hkv, L, D]
        v = v_cache.view(-1, 2, 16)[slots].transpose(0, 1)[None]
        qb = q[rows].view(n, 2, 2, 16).permute(1, 2, 0, 3).reshape(1, 2, 2 * n, 16)  # [1, Hkv, G*n, D]
        pos = torch.arange(ctx - n, ctx).repeat(2)
        mask = torch.where(torch.arange(start * bs, ctx)[None, :] > pos[:, None], float("-inf"), 0.0)
        o, s = _attend_math(qb, k, v, mask[None, None], 0.25)
        assert_close(out[rows], o.view(2, 2, n, 16).permute(2, 0, 1, 3).reshape(n, 4, 16), atol=2e-5, rtol=1e-5)
        assert_close(lse[rows], s.view(2, 2, n).permute(2, 0, 1).reshape(n, 4), atol=2e-5, rtol=1e-5)


def test_unsupported_sizes_are_refused(native) -> None:
    q, k_cache, v_cache, cu, cl, tables = _case([10], [10], 4, 2, 24, 16)  # head_dim 24: no compiled kernel
    assert not native.supports(q, k_cache)
    with pytest.raises(ValueError, match="fp32 CPU tensors"):
        native(q, k_cache, v_cache, cu, cl, tables, 0.2)
    q, k_cache, *_ = _case([10], [10], 32, 2, 16, 16)  # a group of 16: more than a tile holds
    assert not native.supports(q, k_cache)
    assert not native.supports(q.double(), k_cache.double())


def _prefill_meta(cu: torch.Tensor, cl: torch.Tensor, tables: torch.Tensor) -> AttentionMetadata:
    return AttentionMetadata(
        slot_mapping=torch.empty(0, dtype=torch.int64), num_prefill_tokens=int(cu[-1]), prefill_cu_seqlens_q=cu,
        prefill_context_lens=cl, prefill_block_tables=tables, decode_context_lens=None, decode_block_tables=None,
    )  # fmt: skip


@pytest.mark.parametrize("head_dim", [64, 24])  # the C kernel, and the torch fallback it hands off to
def test_backend_cascade_over_shared_prefix(head_dim: int) -> None:
    """Sequences sharing 8 cached leading blocks: the backend attends those once for every query
    (torch cascade), the rest in C, and merges; equal to the reference (which also cascades)."""
    bs, shared = 16, 8
    q_lens = [1, 20, 47, 3]
    ctxs = [shared * bs + n for n in q_lens]
    q, k_cache, v_cache, cu, cl, tables = _case(q_lens, ctxs, 8, 4, head_dim, bs)
    tables[:, :shared] = tables[0, :shared]  # every sequence starts with the same blocks
    expected = prefill_attention(q, k_cache, v_cache, cu, cl, tables, 0.125)
    meta = _prefill_meta(cu, cl, tables)
    out = poisoned(sum(q_lens), 8, head_dim)
    CpuBackend().prefill_rows(q, k_cache, v_cache, meta, 0.125, out)
    if head_dim == 64:
        assert meta.scratch["prefill_shared"] == shared
    else:  # the torch path's plan, cascade included
        assert meta.scratch["prefill"].shared_ids.tolist() == tables[0, :shared].tolist()
    assert_close(out, expected, atol=2e-5, rtol=1e-5)


def test_bad_out_lse_and_offsets_are_refused(native) -> None:
    """The caller's out / lse / cu_seqlens are checked before the kernel writes anything."""
    q, k_cache, v_cache, cu, cl, tables = _case([5, 3], [5, 9], 4, 2, 16, 16)
    with pytest.raises(ValueError, match="out must be a contiguous fp32 tensor shaped like q"):
        native(q, k_cache, v_cache, cu, cl, tables, 0.25, torch.empty(8, 4, 16).transpose(0, 1).contiguous())
    with pytest.raises(ValueError, match=r"lse must be a contiguous fp32 \[8, 4\] tensor"):
        native(q, k_cache, v_cache, cu, cl, tables, 0.25, lse=torch.empty(8, 3))
    with pytest.raises(ValueError, match="cu_seqlens_q must hold B \\+ 1 offsets"):
        native(q, k_cache, v_cache, torch.tensor([0, 5, 7], dtype=torch.int32), cl, tables, 0.25)
