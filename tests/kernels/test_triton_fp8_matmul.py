"""FP8 (e4m3) matmul: the per-token quantizer kernel (Triton interpreter) bit for bit against the
torch reference, the wrapper (kernel + torch._scaled_mm, which torch also runs on CPU tensors)
against the reference, the CPU fast path's rounding, and the refusals: shapes, dtypes, GPUs older
than compute capability 8.9 (the capability query is simulated)."""

import pytest
import torch
from kernel_cases import assert_close, randn

from kernels.checks import check_fp8_capability
from kernels.reference import fp8_matmul as ref
from kernels.triton import fp8_matmul as tf

E4M3_VALUES = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
E4M3_VALUES = E4M3_VALUES[~E4M3_VALUES.isnan()]  # all 254 finite codes (+0 and -0 included)


def _awkward_rows(dtype: torch.dtype) -> torch.Tensor:
    """Magnitudes over 8 decades (fp16 holds 6e-8 .. 65504), a zero row, ties between e4m3 neighbours (normal and
    subnormal), values just below a power of two, -0 and fp32 subnormals."""
    x = randn(6, 700) * torch.logspace(-4, 4, 700)
    x[2] = 0
    specials = [1.0625, 1.1875, 3 * 2**-10, 5 * 2**-11, 126.7, -126.7, -0.0, 1e-42, 15.5, 447.9, -2.25]
    x[4, : len(specials)] = torch.tensor(specials)
    x[4, -1] = 448.0  # the row's scale is 1: the specials are rounded as they are
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantizer_kernel_is_bit_identical_to_the_reference(dtype: torch.dtype) -> None:
    x = _awkward_rows(dtype)
    q, s = tf.quantize_fp8_rows(x)
    q_ref, s_ref = ref.quantize_fp8_rows(x)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))  # -0 keeps its sign bit too
    assert s[2] == ref.MIN_SCALE and not q[2].float().any()


def test_every_e4m3_value_survives_quantization_exactly() -> None:
    x = torch.cat([E4M3_VALUES, torch.tensor([448.0])])[None, :]  # max 448: scale 1
    q, s = tf.quantize_fp8_rows(x)
    assert s.item() == 1.0
    assert torch.equal(q.float(), x)


def test_cpu_rounding_matches_the_float8_cast() -> None:
    """round_to_e4m3 (the CPU path's fp32 rounding) gives exactly torch's e4m3 cast."""
    v = torch.cat([E4M3_VALUES, (E4M3_VALUES[1:] + E4M3_VALUES[:-1]) / 2, torch.rand(20000) * 896 - 448])
    v = v.clamp(-448, 448)
    assert torch.equal(ref.round_to_e4m3(v.clone()), v.to(torch.float8_e4m3fn).float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matmul_matches_the_reference(dtype: torch.dtype) -> None:
    x = randn(5, 96, dtype=dtype)
    q, s = ref.quantize_fp8_rows(randn(48, 96, scale=0.05))
    got = tf.fp8_matmul(x, q, s)
    want = ref.fp8_matmul(x, q, s)
    assert got.dtype == dtype
    assert_close(got, want, atol=1e-2, rtol=1e-2)  # torch._scaled_mm hands back bf16
    # the CPU execution path (weights widened once, fp32 rounding): the reference's exact values
    assert torch.equal(ref.fp8_matmul_dequantized(x, q.float(), s), want)


def test_fp8_error_is_that_of_e4m3() -> None:
    """Against the unquantized product: a few percent, as 3 mantissa bits on both sides give."""
    x, w = randn(8, 256), randn(64, 256, scale=0.05)
    q, s = ref.quantize_fp8_rows(w)
    exact = x @ w.T
    err = (ref.fp8_matmul(x, q, s) - exact).norm() / exact.norm()
    assert 1e-3 < err < 6e-2


def test_wrapper_refuses_bad_arguments() -> None:
    x = randn(2, 64)
    q, s = ref.quantize_fp8_rows(randn(32, 64))
    with pytest.raises(ValueError, match="multiples of 16"):
        tf.fp8_matmul(randn(2, 40), *ref.quantize_fp8_rows(randn(32, 40)))
    with pytest.raises(ValueError, match="multiples of 16"):
        tf.fp8_matmul(x, *ref.quantize_fp8_rows(randn(24, 64)))
    with pytest.raises(ValueError, match="qweight must be float8_e4m3fn"):
        tf.fp8_matmul(x, q.float(), s)
    with pytest.raises(ValueError, match="scales must be float32"):
        tf.fp8_matmul(x, q, s.half())
    with pytest.raises(ValueError, match=r"qweight must have shape \[32, 64\]"):
        tf.fp8_matmul(x, q[:, :48], s)
    assert tf.fp8_matmul(randn(0, 64), q, s).shape == (0, 32)


def test_capability_below_8_9_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match=r"compute capability 8.9 or newer .* A100-SXM4-80GB \(cuda:0\) is 8.0"):
        check_fp8_capability(torch.device("cuda:0"))
    for capability in ((8, 9), (9, 0), (10, 0)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        check_fp8_capability(torch.device("cuda:0"))
    with pytest.raises(ValueError, match="need a CUDA GPU"):
        check_fp8_capability(torch.device("cpu"))
