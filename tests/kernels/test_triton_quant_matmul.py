"""Triton int8 / int4 weight-only matmuls vs the torch references, in Triton's interpreter."""

import pytest
import torch
from kernel_cases import assert_close, randn

from kernels.reference.quant_matmul import int4_matmul as ref_int4
from kernels.reference.quant_matmul import int8_matmul as ref_int8
from kernels.reference.quant_matmul import pack_int4, unpack_int4
from kernels.triton import quant_matmul as tq


def _int8_weight(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    return q, torch.rand(n) * 0.02 + 0.005


def _int4_weight(n: int, k: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.randint(-8, 8, (n, k))
    return pack_int4(q), torch.rand(n, k // group) * 0.1 + 0.01


def test_pack_unpack_roundtrip_and_nibble_order() -> None:
    q = torch.randint(-8, 8, (3, 10))
    packed = pack_int4(q)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 5)
    assert torch.equal(unpack_int4(packed), q.to(torch.int8))
    # byte 0 of row 0 holds k=0 in its low nibble, k=1 in its high one, each as q + 8
    assert int(packed[0, 0]) == (int(q[0, 0]) + 8) | ((int(q[0, 1]) + 8) << 4)


@pytest.mark.parametrize("m", [1, 5, 70])
def test_int8_matches_reference(m: int) -> None:
    n, k = 72, 200  # N and K not multiples of any block
    x = randn(m, k)
    q, s = _int8_weight(n, k)
    assert_close(tq.int8_matmul(x, q, s), ref_int8(x, q, s), atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize(("m", "group", "k"), [(1, 32, 96), (3, 64, 192), (9, 128, 256), (70, 32, 64)])
def test_int4_matches_reference(m: int, group: int, k: int) -> None:
    n = 40
    x = randn(m, k)
    q, s = _int4_weight(n, k, group)
    assert_close(tq.int4_matmul(x, q, s, group), ref_int4(x, q, s, group), atol=1e-3, rtol=1e-4)


def test_int4_group_edges_use_their_own_scale() -> None:
    """Scale only the last group of one row: only that row's output may change, by the right amount."""
    m, n, k, group = 2, 24, 128, 32
    x = randn(m, k)
    q, s = _int4_weight(n, k, group)
    base = tq.int4_matmul(x, q, s, group)
    s2 = s.clone()
    s2[5, -1] *= 3.0
    moved = tq.int4_matmul(x, q, s2, group)
    assert_close(moved, ref_int4(x, q, s2, group), atol=1e-3, rtol=1e-4)
    delta = moved - base
    assert torch.count_nonzero(delta[:, [c for c in range(n) if c != 5]]) == 0
    w_last = unpack_int4(q)[5, -group:].float() * s[5, -1]
    assert_close(delta[:, 5], 2.0 * x[:, -group:] @ w_last, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("split_k", [2, 3])
def test_split_k_sums_partials(split_k: int) -> None:
    m, n, k, group = 4, 40, 256, 32
    x = randn(m, k)
    cfg = tq.MatmulConfig(block_m=16, block_n=32, block_k=32, split_k=split_k, num_warps=4, num_stages=2)
    q, s = _int4_weight(n, k, group)
    assert_close(tq.int4_matmul(x, q, s, group, config=cfg), ref_int4(x, q, s, group), atol=1e-3, rtol=1e-4)
    q8, s8 = _int8_weight(n, k - 20)
    x8 = x[:, : k - 20]
    assert_close(tq.int8_matmul(x8, q8, s8, config=cfg), ref_int8(x8, q8, s8), atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(dtype: torch.dtype) -> None:
    m, n, k, group = 3, 48, 128, 64
    x = randn(m, k, dtype=dtype)
    q, s = _int4_weight(n, k, group)
    s = s.to(dtype)
    out = tq.int4_matmul(x, q, s, group)
    assert out.dtype == dtype
    assert_close(out, ref_int4(x, q, s, group), atol=2e-2, rtol=2e-2)


def test_non_contiguous_x() -> None:
    x = randn(64, 3).T  # [3, 64] with strides (1, 3)
    assert x.stride(1) != 1
    q, s = _int8_weight(16, 64)
    assert_close(tq.int8_matmul(x, q, s), ref_int8(x, q, s), atol=1e-3, rtol=1e-4)


def test_wrapper_rejects_bad_arguments() -> None:
    x = randn(2, 64)
    q, s = _int4_weight(8, 64, 32)
    with pytest.raises(ValueError, match="multiple of group_size"):
        tq.int4_matmul(randn(2, 48), pack_int4(torch.randint(-8, 8, (8, 48))), torch.rand(8, 1), 32)
    with pytest.raises(ValueError, match="qweight must be uint8"):
        tq.int4_matmul(x, q.to(torch.int8), s, 32)
    with pytest.raises(ValueError, match=r"scales must have shape \[8, 2\]"):
        tq.int4_matmul(x, q, s[:, :1], 32)
    with pytest.raises(ValueError, match="power of two"):
        tq.int4_matmul(x, q, s, 24)
    with pytest.raises(ValueError, match=r"power of two >= 32"):
        tq.int4_matmul(randn(2, 64), pack_int4(torch.randint(-8, 8, (8, 64))), torch.rand(8, 4), 16)
    with pytest.raises(ValueError, match=r"qweight must have shape \[8, 64\]"):
        tq.int8_matmul(x, torch.zeros(8, 32, dtype=torch.int8), torch.rand(8))
    with pytest.raises(ValueError, match="x must be float16 or bfloat16 or float32"):
        tq.int8_matmul(x.to(torch.float64), torch.zeros(8, 64, dtype=torch.int8), torch.rand(8))
    with pytest.raises(ValueError, match="meta"):
        tq.int8_matmul(x.to("meta"), torch.zeros(8, 64, dtype=torch.int8), torch.rand(8))


def test_empty_k_gives_zeros_like_the_reference() -> None:
    x = randn(3, 0)
    got8 = tq.int8_matmul(x, torch.zeros(5, 0, dtype=torch.int8), torch.rand(5))
    assert torch.equal(got8, ref_int8(x, torch.zeros(5, 0, dtype=torch.int8), torch.rand(5)))
    assert got8.shape == (3, 5) and not got8.any()


@pytest.mark.parametrize("group", [32, 128])
def test_consumes_the_engine_quantizers_layout(group: int) -> None:
    """What worker/engine/quant writes (RTN int4 / int8) is what the kernels read."""
    from worker.engine.quant.formats import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8

    w = randn(24, 256, scale=0.05)
    x = randn(3, 256)
    q4, s4 = quantize_int4(w, group)
    assert_close(tq.int4_matmul(x, q4, s4, group), x @ dequantize_int4(q4, s4, group).T, atol=1e-4, rtol=1e-4)
    q8, s8 = quantize_int8(w)
    assert_close(tq.int8_matmul(x, q8, s8), x @ dequantize_int8(q8, s8).T, atol=1e-4, rtol=1e-4)
