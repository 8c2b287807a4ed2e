"""Write one step's keys and values into the paged KV cache (Triton). Same signature as
kernels.reference.store_kv_cache: slot = block_id * block_size + offset, slot -1 = skip."""

import torch
import triton
import triton.language as tl

from kernels.checks import (
    FLOAT_DTYPES,
    check_kv_cache,
    check_last_dim_contiguous,
    check_same_device,
    check_shape,
    check_tensor,
    check_writable,
)
from kernels.triton.launch import check_launchable


@triton.jit
def _store_kv_cache_kernel(
    k_ptr,
    v_ptr,
    kc_ptr,
    vc_ptr,
    slot_ptr,  # k, v [T, Hkv, D]; caches [NB, BS, Hkv, D]; slots [T]
    num_kv_heads,
    head_dim,
    block_size,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_cd,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One program per token: all its KV heads at once, [BLOCK_H, BLOCK_D].
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t)
    block = slot // block_size
    offset = slot % block_size
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    keep = tl.full((BLOCK_H, BLOCK_D), slot, tl.int64) >= 0  # slot -1: store nothing
    mask = (offs_h[:, None] < num_kv_heads) & (offs_d[None, :] < head_dim) & keep
    k = tl.load(k_ptr + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :] * stride_kd, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :] * stride_vd, mask=mask)
    dst = block * stride_cb + offset * stride_cs + offs_h[:, None] * stride_ch + offs_d[None, :] * stride_cd
    tl.store(kc_ptr + dst, k.to(kc_ptr.dtype.element_ty), mask=mask)
    tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty), mask=mask)


def store_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    checked: bool = False,
) -> None:
    """Scatter k, v [T, Hkv, D] into k_cache, v_cache [num_blocks, block_size, Hkv, D] by slot_mapping
    int64 [T]. The caches must share strides (they are allocated together).
    checked=True skips the argument checks (for a caller that saw them pass for the same shapes,
    strides, dtypes and devices)."""
    if checked:  # the caller saw the checks below pass for the same shapes, strides, dtypes
        num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
        tokens = k.shape[0]
    else:
        num_blocks, block_size, num_kv_heads, head_dim = check_kv_cache(k_cache, v_cache)
        check_tensor("k", k, ndim=3, dtypes=FLOAT_DTYPES)
        check_tensor("v", v, ndim=3, dtypes=FLOAT_DTYPES)
        tokens = k.shape[0]
        check_shape("k", k, (tokens, num_kv_heads, head_dim))
        check_shape("v", v, (tokens, num_kv_heads, head_dim))
        check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=(torch.int64,))
        check_shape("slot_mapping", slot_mapping, (tokens,))
        if k_cache.stride() != v_cache.stride():
            raise ValueError(
                f"k_cache and v_cache must share strides, got {k_cache.stride()} and {v_cache.stride()}"
            )
        check_writable("k_cache", k_cache)
        check_last_dim_contiguous("slot_mapping", slot_mapping)
        device = check_same_device(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
        check_launchable(_store_kv_cache_kernel, device)
    if tokens == 0:
        return
    _store_kv_cache_kernel[(tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        num_kv_heads,
        head_dim,
        block_size,
        *k.stride(),
        *v.stride(),
        *k_cache.stride(),
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
