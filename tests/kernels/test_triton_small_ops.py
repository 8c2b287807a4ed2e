"""Triton store_kv_cache, rms_norm and apply_rotary vs the torch references, in Triton's interpreter."""

import pytest
import torch
from kernel_cases import assert_close, poisoned, randn

from kernels import reference
from kernels.triton.rms_norm import rms_norm
from kernels.triton.rotary import apply_rotary
from kernels.triton.store_kv_cache import store_kv_cache


@pytest.mark.parametrize(("num_kv_heads", "head_dim"), [(1, 64), (3, 128)])
def test_store_kv_cache_matches_reference(num_kv_heads: int, head_dim: int) -> None:
    num_blocks, block_size, tokens = 6, 5, 13  # block size not a power of two
    k = randn(tokens, num_kv_heads, head_dim, dtype=torch.bfloat16)
    v = randn(tokens, num_kv_heads, head_dim, dtype=torch.bfloat16)
    slots = torch.randperm(num_blocks * block_size)[:tokens]
    slots[[2, 7]] = -1  # "do not store"
    caches = [poisoned(num_blocks, block_size, num_kv_heads, head_dim, dtype=torch.bfloat16) for _ in range(4)]
    store_kv_cache(k, v, caches[0], caches[1], slots)
    reference.store_kv_cache(k, v, caches[2], caches[3], slots)
    # untouched slots stay NaN in both; written ones must be bit-equal
    assert torch.equal(caches[0].isnan(), caches[2].isnan())
    assert torch.equal(caches[0].nan_to_num(), caches[2].nan_to_num())
    assert torch.equal(caches[1].nan_to_num(), caches[3].nan_to_num())
    assert int((~caches[0].isnan()).sum()) == (tokens - 2) * num_kv_heads * head_dim


def test_store_kv_cache_strided_k_v() -> None:
    """k and v as views of one fused qkv projection (non-contiguous token stride)."""
    tokens, hkv, d = 7, 2, 64
    qkv = randn(tokens, 4 * hkv * d)
    k = qkv[:, 2 * hkv * d : 3 * hkv * d].view(tokens, hkv, d)
    v = qkv[:, 3 * hkv * d :].view(tokens, hkv, d)
    slots = torch.arange(tokens, dtype=torch.int64) * 2
    kc, vc = poisoned(4, 4, hkv, d), poisoned(4, 4, hkv, d)
    store_kv_cache(k, v, kc, vc, slots)
    assert torch.equal(kc.view(16, hkv, d)[slots], k)
    assert torch.equal(vc.view(16, hkv, d)[slots], v)


def test_store_kv_cache_rejects_bad_arguments() -> None:
    kc = vc = torch.zeros(2, 4, 2, 64)
    k = randn(3, 2, 64)
    with pytest.raises(ValueError, match="slot_mapping must be int64"):
        store_kv_cache(k, k, kc, vc, torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"k must have shape \[3, 2, 64\]"):
        store_kv_cache(randn(3, 1, 64), k, kc, vc, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="same shape"):
        store_kv_cache(k, k, kc, torch.zeros(2, 4, 2, 32), torch.zeros(3, dtype=torch.int64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(dtype: torch.dtype, with_residual: bool) -> None:
    tokens, hidden = 5, 200  # hidden not a power of two
    x = randn(tokens, hidden, dtype=dtype)
    w = randn(hidden, dtype=dtype)
    res = randn(tokens, hidden, dtype=dtype) if with_residual else None
    out, res_out = rms_norm(x, w, 1e-6, res)
    ref_out, ref_res = reference.rms_norm(x, w, 1e-6, res)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert out.dtype == ref_out.dtype
    assert_close(out, ref_out, atol=tol, rtol=tol)
    if dtype == torch.float32:
        assert torch.equal(res_out, ref_res)
    else:  # Triton 3.9's interpreter rounds fp32 -> bf16 toward zero (the GPU rounds to nearest): 1 ulp
        assert_close(res_out, ref_res, atol=0.0, rtol=2**-7)


def test_rms_norm_rejects_bad_arguments() -> None:
    x = randn(2, 8)
    with pytest.raises(ValueError, match=r"weight must have shape \[8\]"):
        rms_norm(x, randn(7), 1e-6)
    with pytest.raises(ValueError, match="eps must be a finite positive"):
        rms_norm(x, randn(8), 0.0)
    with pytest.raises(ValueError, match="residual must be float32"):
        rms_norm(x, randn(8), 1e-6, randn(2, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="contiguous in its last dimension"):
        rms_norm(randn(8, 2).T, randn(8), 1e-6)


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(4, 4, 64), (8, 1, 128), (6, 2, 64)])
def test_rotary_matches_reference(num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    tokens, max_pos = 9, 50
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.arange(max_pos).float()[:, None] * inv_freq[None, :]
    cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    positions = torch.randint(0, max_pos, (tokens,))
    # q as a view of a fused projection, like the model passes it
    qk = randn(tokens, (num_heads + num_kv_heads) * head_dim, dtype=torch.bfloat16)
    q = qk[:, : num_heads * head_dim].view(tokens, num_heads, head_dim)
    k = qk[:, num_heads * head_dim :].view(tokens, num_kv_heads, head_dim)
    q_ref, k_ref = q.clone(), k.clone()
    apply_rotary(q, k, positions, cos_sin)
    reference.apply_rotary(q_ref, k_ref, positions, cos_sin)
    assert_close(q, q_ref, atol=1e-2, rtol=1e-2)
    assert_close(k, k_ref, atol=1e-2, rtol=1e-2)
    assert not torch.equal(q, qk[:, : num_heads * head_dim].view(tokens, num_heads, head_dim).clone() * 0)


def test_rotary_rejects_bad_arguments() -> None:
    q, k = randn(3, 2, 64), randn(3, 1, 64)
    cs = randn(10, 64)
    with pytest.raises(ValueError, match="positions must be int64"):
        apply_rotary(q, k, torch.zeros(3, dtype=torch.int32), cs)
    with pytest.raises(ValueError, match=r"cos_sin_cache must have shape \[\*, 64\]"):
        apply_rotary(q, k, torch.zeros(3, dtype=torch.int64), randn(10, 32))
    with pytest.raises(ValueError, match="expanded view"):
        apply_rotary(randn(1, 2, 64).expand(3, 2, 64), k, torch.zeros(3, dtype=torch.int64), cs)
