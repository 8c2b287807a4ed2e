"""The torch reference kernels against plain dense attention / textbook formulas."""

import itertools

import pytest
import torch

from kernels.reference import (
    apply_rotary,
    paged_decode_attention,
    prefill_attention,
    rms_norm,
    store_kv_cache,
)

BLOCK = 4
HQ, HKV, D = 4, 2, 8


def _dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offset: int) -> torch.Tensor:
    """q [Q, Hq, D], k/v [K, Hkv, D]; query i sits at position offset + i (causal)."""
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1).transpose(0, 1)
    v = v.repeat_interleave(rep, dim=1).transpose(0, 1)
    scores = q.transpose(0, 1) @ k.transpose(1, 2) / D**0.5  # [H, Q, K]
    mask = torch.arange(k.shape[1])[None, :] > (offset + torch.arange(q.shape[0]))[:, None]
    scores = scores.masked_fill(mask, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(0, 1)


def _paged(lengths: list[int], shared_blocks: int = 0, seed: int = 0, num_blocks: int = 64):
    """Random sequences stored in a shuffled paged cache; the first shared_blocks blocks are common."""
    gen = torch.Generator().manual_seed(seed)
    k_cache = torch.zeros(num_blocks, BLOCK, HKV, D)
    v_cache = torch.zeros(num_blocks, BLOCK, HKV, D)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    shared_ids = [free.pop() for _ in range(shared_blocks)]
    shared_k = torch.randn(shared_blocks * BLOCK, HKV, D, generator=gen)
    shared_v = torch.randn(shared_blocks * BLOCK, HKV, D, generator=gen)
    tables, keys, values = [], [], []
    for n in lengths:
        own = -(-n // BLOCK) - shared_blocks
        ids = shared_ids + [free.pop() for _ in range(own)]
        k = torch.cat([shared_k, torch.randn(n - shared_blocks * BLOCK, HKV, D, generator=gen)])
        v = torch.cat([shared_v, torch.randn(n - shared_blocks * BLOCK, HKV, D, generator=gen)])
        slots = torch.tensor([ids[i // BLOCK] * BLOCK + i % BLOCK for i in range(n)])
        store_kv_cache(k, v, k_cache, v_cache, slots)
        tables.append(ids)
        keys.append(k)
        values.append(v)
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32)
    return k_cache, v_cache, block_tables, keys, values


def test_store_kv_cache_skips_slot_minus_one() -> None:
    k_cache = torch.zeros(2, BLOCK, HKV, D)
    v_cache = torch.zeros(2, BLOCK, HKV, D)
    k = torch.randn(3, HKV, D)
    store_kv_cache(k, -k, k_cache, v_cache, torch.tensor([5, -1, 0]))
    assert torch.equal(k_cache[1, 1], k[0]) and torch.equal(k_cache[0, 0], k[2])
    assert torch.equal(v_cache[1, 1], -k[0])
    assert int((k_cache != 0).any(-1).any(-1).sum()) == 2


def _check_decode(lengths: list[int], into_out: bool = False, **paged: int) -> None:
    """paged_decode_attention of one query per sequence against dense attention over its keys;
    `into_out`: the result written into a given out tensor."""
    k_cache, v_cache, tables, keys, values = _paged(lengths, **paged)
    q = torch.randn(len(lengths), HQ, D)
    out = torch.empty_like(q) if into_out else None
    got = paged_decode_attention(q, k_cache, v_cache, tables, torch.tensor(lengths, dtype=torch.int32), D**-0.5, out)
    got = out if out is not None else got
    for b, n in enumerate(lengths):
        want = _dense_attention(q[b : b + 1], keys[b], values[b], n - 1)
        torch.testing.assert_close(got[b : b + 1], want, rtol=1e-5, atol=1e-5)


def _check_prefill(lengths: list[int], q_lens: list[int], **paged: int) -> None:
    """prefill_attention of each sequence's last q_lens tokens against dense causal attention."""
    k_cache, v_cache, tables, keys, values = _paged(lengths, **paged)
    q = torch.randn(sum(q_lens), HQ, D)
    cu = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32)
    got = prefill_attention(q, k_cache, v_cache, cu, torch.tensor(lengths, dtype=torch.int32), tables, D**-0.5)
    for b, (n, ql) in enumerate(zip(lengths, q_lens, strict=True)):
        lo = int(cu[b])
        want = _dense_attention(q[lo : lo + ql], keys[b], values[b], n - ql)
        torch.testing.assert_close(got[lo : lo + ql], want, rtol=1e-5, atol=1e-5)


def test_paged_decode_matches_dense() -> None:
    _check_decode([1, 5, 17, 9])


def test_paged_decode_shared_prefix_path_matches_dense() -> None:
    _check_decode([70, 81, 73], into_out=True, shared_blocks=17, seed=1)  # 68 shared tokens >= the cascade threshold


def test_paged_decode_many_sequences_shared_prefix() -> None:
    _check_decode([70 + 3 * i for i in range(20)], shared_blocks=17, seed=3, num_blocks=400)  # > one decode group


def test_prefill_shared_prefix_cascade() -> None:
    _check_prefill([80, 75, 90], [12, 7, 20], shared_blocks=17, seed=4)  # every query after the 68 shared tokens


def test_math_path_matches_cpu_flash_path() -> None:
    from kernels.reference.attention import _attend, _attend_math

    q, k, v = torch.randn(2, 3, 5, D), torch.randn(2, 3, 9, D), torch.randn(2, 3, 9, D)
    mask = torch.zeros(2, 1, 5, 9).masked_fill_(torch.rand(2, 1, 5, 9) < 0.3, float("-inf"))
    mask[..., 0] = 0.0
    for a, b in zip(_attend(q, k, v, mask, 0.3), _attend_math(q, k, v, mask, 0.3), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_prefill_varlen_causal_with_cached_context() -> None:
    _check_prefill([6, 13, 1], [6, 4, 1], seed=2)  # the second sequence has 9 tokens already cached


def test_rms_norm_with_residual() -> None:
    x, res, w = torch.randn(3, 16), torch.randn(3, 16), torch.randn(16)
    out, res_out = rms_norm(x, w, 1e-6, res)
    s = x + res
    torch.testing.assert_close(res_out, s)
    torch.testing.assert_close(out, s / torch.sqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w)
    out2, res2 = rms_norm(x, w, 1e-6)
    assert res2 is x
    torch.testing.assert_close(out2, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w)


def test_apply_rotary_rotate_half() -> None:
    positions = torch.tensor([0, 3, 7])
    inv_freq = 1.0 / 10000 ** (torch.arange(0, D, 2).float() / D)
    freqs = torch.outer(torch.arange(16).float(), inv_freq)  # [16, D/2]
    cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    q, k = torch.randn(3, HQ, D), torch.randn(3, HKV, D)
    q0, k0 = q.clone(), k.clone()
    apply_rotary(q, k, positions, cache)
    cos = torch.cat([freqs.cos(), freqs.cos()], -1)[positions][:, None]
    sin = torch.cat([freqs.sin(), freqs.sin()], -1)[positions][:, None]

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([-x[..., D // 2 :], x[..., : D // 2]], -1)

    torch.testing.assert_close(q, q0 * cos + rotate_half(q0) * sin)
    torch.testing.assert_close(k, k0 * cos + rotate_half(k0) * sin)
    assert torch.equal(q[0], q0[0])  # position 0 is the identity


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_fast_path_matches_math_path(dtype: torch.dtype) -> None:
    """The math path is what CUDA runs: it must take bf16 caches too (fp32 out either way)."""
    from kernels.reference.attention import _attend_causal

    q, k, v = (torch.randn(shape).to(dtype) for shape in [(7, HQ, D), (1, HKV, 7, D), (1, HKV, 7, D)])
    for a, b in zip(_attend_causal(q, k, v, 0.3), _attend_causal(q, k, v, 0.3, flash=False), strict=True):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
