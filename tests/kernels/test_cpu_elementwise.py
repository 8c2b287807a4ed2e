"""The C elementwise kernels (kernels/cpu/elementwise.c) against the torch references, and the CPU
backend's fallback to the references for tensors they don't take."""

from collections.abc import Iterator

import pytest
import torch
from kernel_cases import assert_close, randn
from torch_threads import torch_threads

from kernels import reference
from kernels.cpu.elementwise import NativeElementwise
from worker.engine.backends.cpu_backend import CpuBackend
from worker.engine.models.rotary import cos_sin_cache


@pytest.fixture(scope="module")
def native() -> NativeElementwise:
    return NativeElementwise()


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """Both the single-thread path and the row split over pthreads (the sizes below are big enough)."""
    with torch_threads(request.param):
        yield request.param


@pytest.mark.parametrize("n", [512, 70, 5])  # vector multiple, vector + tail, tail only
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(native, threads: int, n: int, with_residual: bool) -> None:
    rows = 300_000 // n + 3
    wide = randn(rows, n + 9)
    x = wide[:, 3 : 3 + n]  # rows of a wider tensor: the kernel takes a row stride
    residual = randn(rows, n) if with_residual else None
    weight = randn(n)
    out, summed = native.rms_norm(x, weight, 1e-5, residual)
    want_out, want_summed = reference.rms_norm(x, weight, 1e-5, residual)
    assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    assert_close(summed, want_summed, atol=0, rtol=0)  # x + residual: one rounding, the same one
    if residual is None:
        assert summed is x  # like the reference: the residual out is x itself


@pytest.mark.parametrize("inter", [1536, 37])
def test_silu_mul_matches_reference(native, threads: int, inter: int) -> None:
    rows = 200_000 // inter + 5
    gate_up = randn(rows, 2 * inter, scale=4.0)
    gate_up[0, :4] = torch.tensor([-200.0, -88.5, 90.0, 300.0])  # past the exp's clamps both ways
    got = native.silu_mul(gate_up)
    assert got.shape == (rows, inter)
    assert torch.isfinite(got).all()
    assert_close(got, reference.silu_mul(gate_up), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(8, 4, 64), (4, 2, 20), (2, 2, 128)])
def test_rotary_matches_reference(native, threads: int, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    tokens = 3000
    cos_sin = cos_sin_cache(head_dim, 4096, 10000.0, None)
    positions = torch.randint(0, 4096, (tokens,))
    qkv = randn(tokens, (num_heads + 2 * num_kv_heads) * head_dim)  # q and k as views of the qkv rows
    q = qkv[:, : num_heads * head_dim].view(tokens, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(tokens, num_kv_heads, head_dim)
    v_before = qkv[:, (num_heads + num_kv_heads) * head_dim :].clone()
    want_q, want_k = q.clone(), k.clone()
    reference.apply_rotary(want_q, want_k, positions, cos_sin)
    native.apply_rotary(q, k, positions, cos_sin)
    assert_close(q, want_q, atol=1e-5, rtol=1e-5)
    assert_close(k, want_k, atol=1e-5, rtol=1e-5)
    assert torch.equal(qkv[:, (num_heads + num_kv_heads) * head_dim :], v_before)  # v untouched


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(8, 4, 64), (4, 2, 20), (4, 2, 16)])
def test_rotary_store_matches_rotary_then_store(native, threads: int, num_heads: int, num_kv_heads: int,
                                                head_dim: int) -> None:  # fmt: skip
    """The fused pass equals the references' rotary followed by store_kv_cache, slot -1 skipped, bit
    for bit in the cache (a copy of the same rotated k)."""
    tokens, num_blocks, bs = 3000, 400, 16
    cos_sin = cos_sin_cache(head_dim, 4096, 10000.0, None)
    positions = torch.randint(0, 4096, (tokens,))
    slots = torch.randperm(num_blocks * bs)[:tokens]
    slots[::7] = -1  # shared cached blocks: not written
    qkv = randn(tokens, (num_heads + 2 * num_kv_heads) * head_dim)
    q = qkv[:, : num_heads * head_dim].view(tokens, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(tokens, num_kv_heads, head_dim)
    v = qkv[:, (num_heads + num_kv_heads) * head_dim :].view(tokens, num_kv_heads, head_dim)
    k_cache, v_cache = randn(num_blocks, bs, num_kv_heads, head_dim), randn(num_blocks, bs, num_kv_heads, head_dim)
    want_q, want_k = q.clone(), k.clone()
    want_kc, want_vc = k_cache.clone(), v_cache.clone()
    reference.apply_rotary(want_q, want_k, positions, cos_sin)
    reference.store_kv_cache(want_k, v.clone(), want_kc, want_vc, slots)
    assert native.supports_rotary_store(q, k, v, positions, cos_sin, k_cache, v_cache, slots)
    assert native.rotary_store(q, k, v, positions, cos_sin, k_cache, v_cache, slots)
    assert_close(q, want_q, atol=1e-5, rtol=1e-5)
    assert_close(k, want_k, atol=1e-5, rtol=1e-5)
    kept = slots[slots >= 0]
    assert torch.equal(k_cache.flatten(0, 1)[kept], k[slots >= 0])  # the rotated k itself
    assert torch.equal(v_cache.flatten(0, 1)[kept], v[slots >= 0])
    assert_close(k_cache, want_kc, atol=1e-5, rtol=1e-5)
    untouched = torch.ones(num_blocks * bs, dtype=torch.bool)
    untouched[kept] = False
    assert torch.equal(v_cache.flatten(0, 1)[untouched], want_vc.flatten(0, 1)[untouched])


def test_rotary_store_refuses_slots_and_positions_out_of_range(native) -> None:
    cos_sin = cos_sin_cache(16, 32, 10000.0, None)
    q, k, v = randn(2, 2, 16), randn(2, 1, 16), randn(2, 1, 16)
    kc, vc = randn(4, 4, 1, 16), randn(4, 4, 1, 16)
    before = kc.clone()
    with pytest.raises(IndexError, match="slot outside"):
        native.rotary_store(q, k, v, torch.tensor([0, 1]), cos_sin, kc, vc, torch.tensor([3, 16]))
    with pytest.raises(IndexError, match="rotary cache"):
        native.rotary_store(q, k, v, torch.tensor([0, 32]), cos_sin, kc, vc, torch.tensor([3, 4]))
    assert torch.equal(kc, before)  # refused before anything was written
    assert not native.supports_rotary_store(q, k, v, torch.tensor([0, 1]), cos_sin, kc, vc, torch.tensor([3, 4], dtype=torch.int32))


def test_rotary_refuses_positions_outside_the_cache(native) -> None:
    cos_sin = cos_sin_cache(16, 32, 10000.0, None)
    q, k = randn(2, 2, 16), randn(2, 1, 16)
    with pytest.raises(IndexError, match="outside the rotary cache"):
        native.apply_rotary(q, k, torch.tensor([3, 32]), cos_sin)


def test_unsupported_tensors_are_refused_and_the_backend_falls_back(native) -> None:
    x16 = randn(4, 64, dtype=torch.bfloat16)
    w16 = randn(64, dtype=torch.bfloat16)
    assert not native.supports_rms_norm(x16, w16, None)
    assert not native.supports_silu_mul(randn(4, 64).t())  # columns, not rows, contiguous
    assert not native.supports_silu_mul(randn(4, 63))  # odd width: no gate/up halves
    assert native.rms_norm(x16, w16, 1e-5) is None  # refused: nothing computed, the caller falls back
    assert native.silu_mul(randn(4, 63)) is None
    q16, k16 = randn(2, 2, 16, dtype=torch.bfloat16), randn(2, 1, 16, dtype=torch.bfloat16)
    q16_before = q16.clone()
    assert native.apply_rotary(q16, k16, torch.tensor([0, 1]), cos_sin_cache(16, 4, 10000.0, None)) is False
    assert torch.equal(q16, q16_before)
    backend = CpuBackend()
    out, _ = backend.rms_norm(x16, w16, 1e-5)  # the reference, in bf16
    assert out.dtype == torch.bfloat16
    assert_close(out, reference.rms_norm(x16, w16, 1e-5)[0], atol=0, rtol=0)
    gate_up = randn(4, 64, dtype=torch.bfloat16)
    assert_close(backend.silu_mul(gate_up), reference.silu_mul(gate_up), atol=0, rtol=0)
