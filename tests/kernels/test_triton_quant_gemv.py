"""The GEMV-shaped int8 / int4 kernels (M <= 16) vs the torch references, in Triton's interpreter:
M 1..16, odd N and K, groups 32 / 64 / 128, fp32 / fp16 / bf16 activations, K split on and off,
and the wrappers' choice between them and the tensor-core kernels."""

import pytest
import torch
from kernel_cases import assert_close, randn

from kernels.reference.quant_matmul import int4_matmul as ref_int4
from kernels.reference.quant_matmul import int8_matmul as ref_int8
from kernels.reference.quant_matmul import pack_int4
from kernels.triton import quant_gemv as tg
from kernels.triton import quant_matmul as tq

# fp32: the kernels sum in another order; half precision: one rounding of the output
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
GEMV = tg.GemvConfig(block_n=32, split_k=1, num_warps=1)
GEMV_SPLIT = tg.GemvConfig(block_n=64, split_k=3, num_warps=2)  # 2 rows per thread, 3 K splits


def _int8_weight(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randint(-128, 128, (n, k), dtype=torch.int8), torch.rand(n) * 0.02 + 0.005


def _int4_weight(n: int, k: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    return pack_int4(torch.randint(-8, 8, (n, k))), torch.rand(n, k // group) * 0.1 + 0.01


@pytest.mark.parametrize(
    ("m", "n", "k", "dtype", "cfg"),
    [
        (1, 37, 200, torch.float32, GEMV),
        (2, 70, 96, torch.float32, GEMV_SPLIT),
        (3, 33, 131, torch.float16, GEMV_SPLIT),  # K not a multiple of 16: element loads
        (5, 65, 256, torch.bfloat16, GEMV),
        (8, 29, 160, torch.float32, GEMV_SPLIT),
        (13, 40, 64, torch.bfloat16, GEMV_SPLIT),
        (16, 31, 48, torch.float16, GEMV),
    ],
)
def test_int8_gemv_matches_reference(m: int, n: int, k: int, dtype: torch.dtype, cfg: tg.GemvConfig) -> None:
    x = randn(m, k, dtype=dtype)
    q, s = _int8_weight(n, k)
    got = tq.int8_matmul(x, q, s, config=cfg)
    assert got.dtype == dtype
    assert_close(got, ref_int8(x, q, s), *TOL[dtype])


@pytest.mark.parametrize(
    ("m", "n", "k", "group", "dtype", "cfg"),
    [
        (1, 37, 256, 128, torch.float32, GEMV),
        (2, 45, 192, 64, torch.bfloat16, GEMV_SPLIT),
        (3, 33, 96, 32, torch.float32, GEMV_SPLIT),
        (4, 70, 128, 128, torch.float16, GEMV_SPLIT),
        (7, 19, 320, 64, torch.float32, GEMV),
        (11, 41, 64, 32, torch.bfloat16, GEMV),
        (16, 23, 384, 128, torch.float32, GEMV_SPLIT),
    ],
)
def test_int4_gemv_matches_reference(
    m: int, n: int, k: int, group: int, dtype: torch.dtype, cfg: tg.GemvConfig
) -> None:
    x = randn(m, k, dtype=dtype)
    q, s = _int4_weight(n, k, group)
    s = s.to(dtype)
    got = tq.int4_matmul(x, q, s, group, config=cfg)
    assert got.dtype == dtype
    assert_close(got, ref_int4(x, q, s, group), *TOL[dtype])


def test_split_k_is_the_same_sum() -> None:
    """One split or several: the same result up to fp32 summation order."""
    x = randn(4, 512)
    q, s = _int4_weight(50, 512, 64)
    whole = tq.int4_matmul(x, q, s, 64, config=GEMV)
    for splits in (2, 5, 16):  # 16 splits of 256 bytes: some splits get no chunk at all
        cfg = tg.GemvConfig(block_n=32, split_k=splits, num_warps=1)
        assert_close(tq.int4_matmul(x, q, s, 64, config=cfg), whole, atol=1e-4, rtol=1e-5)
    q8, s8 = _int8_weight(50, 500)
    x8 = randn(4, 500)
    whole8 = tq.int8_matmul(x8, q8, s8, config=GEMV)
    for splits in (2, 7):
        cfg = tg.GemvConfig(block_n=32, split_k=splits, num_warps=1)
        assert_close(tq.int8_matmul(x8, q8, s8, config=cfg), whole8, atol=1e-4, rtol=1e-5)


def test_extreme_codes_convert_exactly() -> None:
    """Every int8 code (-128 .. 127) and every nibble (q -8 .. 7) turns into its exact value:
    the bit tricks that replace the int-to-float convert leave nothing off by one."""
    x = torch.eye(16, 256)  # row i picks k = i
    q8 = torch.arange(-128, 128, dtype=torch.int8).repeat(3, 1)  # [3, 256]
    got = tq.int8_matmul(x, q8, torch.ones(3), config=GEMV)
    assert torch.equal(got, q8[:, :16].float().T)
    codes = torch.arange(-8, 8).repeat(3, 16)  # [3, 256], every nibble at even and odd k
    got4 = tq.int4_matmul(x, pack_int4(codes), torch.ones(3, 2), 128, config=GEMV)
    assert torch.equal(got4, codes[:, :16].float().T)


def test_wrappers_pick_the_gemv_for_small_m(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    for name in ("int8_gemv", "int4_gemv"):
        real = getattr(tq, name)
        monkeypatch.setattr(tq, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a))
    q, s = _int4_weight(40, 128, 64)
    q8, s8 = _int8_weight(40, 128)
    for m in (1, tg.INT4_GEMV_MAX_M, tg.INT4_GEMV_MAX_M + 1):
        tq.int4_matmul(randn(m, 128), q, s, 64)
    for m in (1, tg.INT8_GEMV_MAX_M, tg.INT8_GEMV_MAX_M + 1):
        tq.int8_matmul(randn(m, 128), q8, s8)
    assert calls == ["int4_gemv"] * 2 + ["int8_gemv"] * 2
    calls.clear()
    tq.int8_matmul(randn(2, 128), q8, s8, config=tq.MatmulConfig(16, 32, 32, 1, 4, 1))  # forced dot
    tq.int8_matmul(randn(16, 128), q8, s8, config=GEMV)  # forced GEMV
    assert calls == ["int8_gemv"]


def test_gemv_refuses_more_than_16_rows_and_bad_configs() -> None:
    q8, s8 = _int8_weight(8, 64)
    with pytest.raises(ValueError, match=r"1 <= M <= 16"):
        tq.int8_matmul(randn(17, 64), q8, s8, config=GEMV)
    with pytest.raises(ValueError, match="multiple of 32 \\* num_warps"):
        tg.GemvConfig(block_n=48, split_k=1, num_warps=1)
    with pytest.raises(ValueError, match="split_k >= 1"):
        tg.GemvConfig(block_n=64, split_k=0, num_warps=1)


def test_non_contiguous_inputs() -> None:
    x = randn(96, 3).T  # [3, 96] with strides (1, 3)
    q, s = _int4_weight(24, 96, 32)
    assert_close(tq.int4_matmul(x, q, s, 32, config=GEMV), ref_int4(x, q, s, 32), atol=1e-4, rtol=1e-4)
    wide = torch.randint(-128, 128, (24, 200), dtype=torch.int8)[:, :96]  # row stride 200
    s8 = s[:, 0].contiguous()
    assert_close(tq.int8_matmul(x, wide, s8, config=GEMV), ref_int8(x, wide, s8), atol=1e-4, rtol=1e-4)
