"""Rotary position embedding applied in place to q and k (Triton), rotate-half (Llama / GPT-NeoX)
style. Same signature as kernels.reference.apply_rotary; the rotation is computed in fp32."""

import torch
import triton
import triton.language as tl

from kernels.checks import (
    FLOAT_DTYPES,
    check_last_dim_contiguous,
    check_same_device,
    check_shape,
    check_tensor,
    check_writable,
)
from kernels.triton.launch import check_launchable


@triton.jit
def _rotate_heads(
    x_ptr, t, stride_t, stride_h, num_heads, cos, sin, half, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr
):
    # x [T, H, D]: token t's heads as a [BLOCK_H, BLOCK_HALF] tile per half, rotated and written back.
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h[:, None] < num_heads) & (offs_d[None, :] < half)
    ptr1 = x_ptr + t * stride_t + offs_h[:, None] * stride_h + offs_d[None, :]
    x1 = tl.load(ptr1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr1 + half, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptr1, (x1 * cos - x2 * sin).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(ptr1 + half, (x2 * cos + x1 * sin).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    pos_ptr,
    cs_ptr,  # q [T, Hq, D]; k [T, Hkv, D]; positions [T]; cos_sin [P, D]
    num_heads,
    num_kv_heads,
    half,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cs,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HKV: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    t = tl.program_id(0)
    pos = tl.load(pos_ptr + t)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < half
    cos = tl.load(cs_ptr + pos * stride_cs + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(cs_ptr + pos * stride_cs + half + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    _rotate_heads(q_ptr, t, stride_qt, stride_qh, num_heads, cos, sin, half, BLOCK_HQ, BLOCK_HALF)
    _rotate_heads(k_ptr, t, stride_kt, stride_kh, num_kv_heads, cos, sin, half, BLOCK_HKV, BLOCK_HALF)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, *, checked: bool = False
) -> None:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] in place at positions int64 [T];
    cos_sin_cache [max_pos, D]: row p = cat(cos[p, :D/2], sin[p, :D/2]). Positions must be
    < max_pos (not checked on the device: that would cost a sync per call).
    checked=True skips the argument checks (for a caller that saw them pass for the same shapes,
    strides, dtypes and devices)."""
    if checked:  # the caller saw the checks below pass for the same shapes, strides, dtypes
        tokens, num_heads, head_dim = q.shape
    else:
        check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
        check_tensor("k", k, ndim=3, dtypes=FLOAT_DTYPES)
        tokens, num_heads, head_dim = q.shape
        if head_dim % 2:
            raise ValueError(f"rotary needs an even head_dim, got {head_dim}")
        check_shape("k", k, (tokens, None, head_dim))
        check_tensor("positions", positions, ndim=1, dtypes=(torch.int64,))
        check_shape("positions", positions, (tokens,))
        check_tensor("cos_sin_cache", cos_sin_cache, ndim=2, dtypes=FLOAT_DTYPES)
        check_shape("cos_sin_cache", cos_sin_cache, (None, head_dim))
        for name, t in (("q", q), ("k", k), ("cos_sin_cache", cos_sin_cache), ("positions", positions)):
            check_last_dim_contiguous(name, t)
        check_writable("q", q)
        check_writable("k", k)
        device = check_same_device(q=q, k=k, positions=positions, cos_sin_cache=cos_sin_cache)
        check_launchable(_rotary_kernel, device)
    if tokens == 0:
        return
    _rotary_kernel[(tokens,)](
        q,
        k,
        positions,
        cos_sin_cache,
        num_heads,
        k.shape[1],
        head_dim // 2,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos_sin_cache.stride(0),
        BLOCK_HQ=triton.next_power_of_2(num_heads),
        BLOCK_HKV=triton.next_power_of_2(k.shape[1]),
        BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
    )
