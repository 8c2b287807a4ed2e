"""Heavier randomized sweeps of the Triton kernels against the references (interpreter; slow)."""

import random

import pytest
import torch
from kernel_cases import assert_close, poisoned, randn
from paged_cases import block_tables_for, random_cache

from kernels import reference
from kernels.reference import quant_matmul as ref_quant
from kernels.triton import quant_matmul as tq
from kernels.triton.paged_decode_attention import DecodeConfig, paged_decode_attention
from kernels.triton.prefill_attention import PrefillConfig, prefill_attention

pytestmark = pytest.mark.slow
TOL = {torch.float32: (2e-5, 1e-4), torch.float16: (5e-3, 5e-3), torch.bfloat16: (3e-2, 3e-2)}
HEADS = [(4, 4, 64), (8, 2, 128), (8, 1, 128), (16, 2, 64)]  # GQA 1, 4, 8, 8


@pytest.mark.parametrize("seed", range(6))
def test_attention_random_batches(seed: int) -> None:
    rng = random.Random(seed)
    dtype = [torch.float32, torch.float16, torch.bfloat16][seed % 3]
    hq, hkv, d = HEADS[seed % len(HEADS)]
    block_size = rng.choice([8, 16, 32])
    q_lens = [rng.randint(0 if b else 1, 50) for b in range(rng.randint(1, 4))]
    prefixes = [rng.choice([0, rng.randint(1, 120)]) for _ in q_lens]
    ctx = [p + n for p, n in zip(prefixes, q_lens, strict=True)]
    num_blocks = sum(-(-max(n, 1) // block_size) for n in ctx) + 2
    kc, vc = random_cache(num_blocks, block_size, hkv, d, dtype)
    tables = block_tables_for(ctx, block_size, num_blocks)
    lens = torch.tensor(ctx, dtype=torch.int32)
    atol, rtol = TOL[dtype]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = randn(sum(q_lens), hq, d, dtype=dtype)
    cfg = PrefillConfig(block_m=rng.choice([16, 32]), block_n=rng.choice([16, 32]), num_warps=4, num_stages=1)
    got = prefill_attention(q, kc, vc, cu, lens, tables, d**-0.5, poisoned(*q.shape, dtype=dtype), config=cfg)
    assert_close(got, reference.prefill_attention(q, kc, vc, cu, lens, tables, d**-0.5), atol=atol, rtol=rtol)
    live = [b for b, n in enumerate(ctx) if n > 0]
    qd = randn(len(live), hq, d, dtype=dtype)
    dcfg = DecodeConfig(block_n=rng.choice([16, 32]), num_splits=rng.choice([None, 1, 2, 5]))
    args = (qd, kc, vc, tables[live].contiguous(), lens[live].contiguous(), d**-0.5)
    got = paged_decode_attention(*args, poisoned(*qd.shape, dtype=dtype), config=dcfg)
    assert_close(got, reference.paged_decode_attention(*args), atol=atol, rtol=rtol)


@pytest.mark.parametrize("seed", range(6))
def test_quant_matmul_random_shapes(seed: int) -> None:
    rng = random.Random(100 + seed)
    dtype = [torch.float32, torch.float16, torch.bfloat16][seed % 3]
    group = [32, 64, 128][seed % 3]
    m, n, k = rng.randint(1, 150), rng.randint(1, 130), group * rng.randint(1, 4)
    x = randn(m, k, dtype=dtype)
    q4 = ref_quant.pack_int4(torch.randint(-8, 8, (n, k)))
    s4 = (torch.rand(n, k // group) * 0.1 + 0.01).to(dtype)
    q8 = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    s8 = (torch.rand(n) * 0.02 + 0.005).to(dtype)
    atol, rtol = TOL[dtype]
    scale = 1.0 if dtype == torch.float32 else 4.0  # half outputs of size ~k carry ~k ulps of rounding
    assert_close(tq.int4_matmul(x, q4, s4, group), ref_quant.int4_matmul(x, q4, s4, group),
                 atol=atol * scale * k / 32, rtol=rtol)
    assert_close(tq.int8_matmul(x, q8, s8), ref_quant.int8_matmul(x, q8, s8), atol=atol * scale * k / 32, rtol=rtol)


@pytest.mark.parametrize("seed", range(6))
def test_small_ops_random_shapes(seed: int) -> None:
    from kernels.triton.rms_norm import rms_norm
    from kernels.triton.rotary import apply_rotary
    from kernels.triton.store_kv_cache import store_kv_cache

    rng = random.Random(200 + seed)
    dtype = [torch.float32, torch.float16, torch.bfloat16][seed % 3]
    atol, rtol = TOL[dtype]
    tokens, hidden = rng.randint(1, 40), rng.choice([1, 7, 96, 1000, 4096])
    x, r, w = randn(tokens, hidden, dtype=dtype), randn(tokens, hidden, dtype=dtype), randn(hidden, dtype=dtype)
    for res in (None, r):
        got, want = rms_norm(x, w, 1e-5, res), reference.rms_norm(x, w, 1e-5, res)
        assert_close(got[0], want[0], atol=atol, rtol=rtol)
        assert_close(got[1], want[1], atol=atol, rtol=rtol)
    hq, hkv, d = HEADS[seed % len(HEADS)]
    cos_sin = randn(64, d)
    positions = torch.randint(0, 64, (tokens,))
    q, k = randn(tokens, hq, d, dtype=dtype), randn(tokens, hkv, d, dtype=dtype)
    q2, k2 = q.clone(), k.clone()
    apply_rotary(q, k, positions, cos_sin)
    reference.apply_rotary(q2, k2, positions, cos_sin)
    assert_close(q, q2, atol=atol * 4, rtol=rtol)
    assert_close(k, k2, atol=atol * 4, rtol=rtol)
    block_size = rng.choice([1, 3, 16])
    num_blocks = -(-tokens // block_size) + 2
    slots = torch.randperm(num_blocks * block_size)[:tokens]
    slots[torch.rand(tokens) < 0.2] = -1
    caches = [poisoned(num_blocks, block_size, hkv, d, dtype=dtype) for _ in range(4)]
    store_kv_cache(k, q[:, :hkv], caches[0], caches[1], slots)
    reference.store_kv_cache(k, q[:, :hkv], caches[2], caches[3], slots)
    for a, b in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
