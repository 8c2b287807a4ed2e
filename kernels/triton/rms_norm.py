"""RMSNorm with a fused residual add (Triton). Same signature and rounding as
kernels.reference.rms_norm: x = x + residual in x's dtype, statistics in fp32, the normalised value
cast back to x's dtype before the weight multiply. Arithmetic is spelled out in fp32 with one
rounding per op, which is what torch does for half types (and all the Triton interpreter gets
right: it computes bf16 arithmetic on the raw bits)."""

import torch
import triton
import triton.language as tl

from kernels.checks import (
    FLOAT_DTYPES,
    check_last_dim_contiguous,
    check_positive,
    check_same_device,
    check_shape,
    check_tensor,
)
from kernels.triton.launch import check_launchable


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    out_ptr,
    rout_ptr,  # x, residual, out, residual_out [T, H]; w [H]
    hidden,
    eps,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    # One program per row; the whole row sits in registers (H <= 16k).
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_H)
    mask = offs < hidden
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + row * stride_r + offs, mask=mask, other=0.0)
        # fp32 add, one rounding to x's dtype: what torch does for x + residual in bf16/fp16
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(rout_ptr + row * stride_ro + offs, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / hidden + eps)
    normed = (xf * inv_rms).to(x_ptr.dtype.element_ty)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    out = normed.to(tl.float32) * w.to(tl.float32)  # the product rounded once, as in torch
    tl.store(out_ptr + row * stride_o + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None, *, checked: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H], weight [H] -> (normed [T, H], residual_out [T, H]); with a residual, x + residual
    is normalised and returned as residual_out, otherwise residual_out is x itself.
    checked=True skips the argument checks (for a caller that saw them pass for the same shapes,
    strides, dtypes and devices)."""
    if checked:  # the caller saw the checks below pass for the same shapes, strides, dtypes
        tokens, hidden = x.shape
    else:
        check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
        tokens, hidden = x.shape
        check_tensor("weight", weight, ndim=1, dtypes=FLOAT_DTYPES)
        check_shape("weight", weight, (hidden,))
        check_positive("eps", eps)
        tensors = {"x": x, "weight": weight}
        if residual is not None:
            check_tensor("residual", residual, ndim=2, dtypes=(x.dtype,))
            check_shape("residual", residual, (tokens, hidden))
            tensors["residual"] = residual
        for name, t in tensors.items():
            check_last_dim_contiguous(name, t)
        check_launchable(_rms_norm_kernel, check_same_device(**tensors))
    out = torch.empty((tokens, hidden), device=x.device, dtype=torch.promote_types(x.dtype, weight.dtype))
    residual_out = torch.empty_like(x) if residual is not None else x
    if tokens == 0:
        return out, residual_out
    block = triton.next_power_of_2(hidden)
    _rms_norm_kernel[(tokens,)](
        x,
        residual if residual is not None else x,
        weight,
        out,
        residual_out,
        hidden,
        float(eps),
        x.stride(0),
        (residual if residual is not None else x).stride(0),
        out.stride(0),
        residual_out.stride(0),
        HAS_RESIDUAL=residual is not None,
        BLOCK_H=block,
        num_warps=min(16, max(1, block // 256)),
    )
    return out, residual_out
