"""FP8 (e4m3) matmul on CUDA: x quantized per token by a Triton kernel, then torch._scaled_mm.

Same signatures as kernels/reference/fp8_matmul.py. The weight (float8_e4m3fn [N, K], one fp32
scale per output channel) was quantized once; each call quantizes x row by row (scale = max |x| /
448) in one launch and hands both to torch._scaled_mm with row-wise scales (cuBLASLt / CUTLASS
e4m3 tensor-core GEMM, fp32 accumulation, bf16 out), which needs compute capability >= 8.9 and K,
N multiples of 16.

The kernel rounds to the e4m3 grid itself, in fp32 (nearest, ties to even; a power-of-two
"magic" add per element) before the cast, so the cast is exact and the quantized x is
bit-identical to the reference's torch cast on any hardware, and in Triton 3.9's interpreter,
whose float8 cast rounds values just below a power of two down (126.7 -> 64, not 128).
"""

import torch
import triton
import triton.language as tl

from kernels.checks import (
    FLOAT_DTYPES,
    check_fp8_capability,
    check_row_scaled_weight,
    check_same_device,
    check_tensor,
)
from kernels.reference.fp8_matmul import FP8_DTYPE, FP8_MAX, MIN_SCALE
from kernels.triton.launch import check_launchable, is_interpreted


@triton.jit
def _round_to_e4m3(v):
    """fp32 v with |v| <= 448 -> the nearest e4m3 value (ties to even), still fp32. For |v| in
    [2^e, 2^(e+1)), adding c = 2^(e+20) leaves 3 fraction bits, so (|v| + c) - c rounds to e4m3's
    spacing 2^(e-3); below e4m3's smallest normal 2^-6, c = 2^14 gives the subnormal spacing 2^-9."""
    bits = v.to(tl.int32, bitcast=True)
    a = tl.abs(v)
    power = (bits & 0x7F800000).to(tl.float32, bitcast=True)  # 2^e (0 for 0 and fp32 subnormals)
    c = tl.maximum(power * 1048576.0, 16384.0)
    r = (a + c) - c
    return (r.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)  # v's sign


@triton.jit
def _quantize_rows_kernel(
    x_ptr,
    q_ptr,
    s_ptr,  # x [M, K]; q float8_e4m3fn [M, K]; s fp32 [M]
    K,
    stride_xm,
    stride_xk,
    stride_qm,
    FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_K)
    x_row = x_ptr + row * stride_xm
    amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # pass 1: the row's largest magnitude
        x = tl.load(x_row + (k0 + offs) * stride_xk, mask=k0 + offs < K, other=0.0)
        amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
    # IEEE division as torch does it (Triton's "/" on fp32 is an approximation)
    scale = tl.maximum(tl.math.div_rn(tl.max(amax, axis=0), FP8_MAX), MIN_SCALE)
    tl.store(s_ptr + row, scale)
    for k0 in range(0, K, BLOCK_K):  # pass 2: scale, round, store (the row is in L2 by now)
        mask = k0 + offs < K
        x = tl.load(x_row + (k0 + offs) * stride_xk, mask=mask, other=0.0).to(tl.float32)
        v = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -FP8_MAX), FP8_MAX)
        tl.store(q_ptr + row * stride_qm + k0 + offs, _round_to_e4m3(v).to(q_ptr.dtype.element_ty), mask=mask)


def quantize_fp8_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, K] float -> (float8_e4m3fn [R, K], fp32 scales [R]), bit-identical to the reference."""
    check_tensor("t", t, ndim=2, dtypes=FLOAT_DTYPES)
    check_launchable(_quantize_rows_kernel, t.device)
    rows, k = t.shape
    q = torch.empty((rows, k), dtype=FP8_DTYPE, device=t.device)
    scales = torch.empty(rows, dtype=torch.float32, device=t.device)
    if rows and k:
        _quantize_rows_kernel[(rows,)](
            t, q, scales, k, t.stride(0), t.stride(1), q.stride(0),
            FP8_MAX=FP8_MAX, MIN_SCALE=MIN_SCALE, BLOCK_K=min(1024, triton.next_power_of_2(k)), num_warps=4,
        )  # fmt: skip
    elif rows:
        scales.fill_(MIN_SCALE)
    return q, scales


def fp8_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ (qweight e4m3 [N, K] * scales [N, None]).T with x quantized to e4m3 per row
    -> [M, N] in x's dtype."""
    m, k, n = check_row_scaled_weight(x, qweight, FP8_DTYPE, scales, (torch.float32,))
    if qweight.stride(1) != 1:
        raise ValueError("qweight must be row-major [N, K] (stride 1 along K) for torch._scaled_mm; call .contiguous()")
    device = check_same_device(x=x, qweight=qweight, scales=scales)
    check_launchable(_quantize_rows_kernel, device)
    if not is_interpreted(_quantize_rows_kernel):
        check_fp8_capability(device)
    if k % 16 or n % 16:
        raise ValueError(
            f"torch._scaled_mm needs K and N multiples of 16, got K={k}, N={n}; use int8 weights for this layer"
        )
    if m == 0 or n == 0 or k == 0:
        return x.new_zeros((m, n))
    x8, x_scales = quantize_fp8_rows(x)
    out = torch._scaled_mm(
        x8, qweight.t(), scale_a=x_scales[:, None], scale_b=scales[None, :], out_dtype=torch.bfloat16
    )
    return out.to(x.dtype)
