"""paged_decode_attention in C for the CPU: reads each sequence's K/V through its block table.

The torch reference gathers every sequence's blocks into a copy and runs the CPU flash kernel over
it, so decode attention moves each key and value three times; this kernel reads them once from the
cache. Same signature and result as kernels.reference.paged_decode_attention (fp32 caches), plus
`start_block` and `lse` so a caller can attend a shared prefix separately and merge.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from kernels.cpu.build import load_library

SOURCE = Path(__file__).with_suffix(".c")

_ptr, _i64 = ctypes.c_void_p, ctypes.c_int64
_ARGTYPES = [_ptr, _i64, _ptr, _ptr, _ptr, _i64, _ptr, _i64, _i64, _i64, _i64, _i64, _i64, ctypes.c_float, _ptr,
             _ptr, _i64]  # fmt: skip


class NativeDecodeAttention:
    """The compiled kernel, loaded once per instance (the build is cached on disk)."""

    def __init__(self) -> None:
        lib = load_library(SOURCE)
        fn = lib.paged_decode_attention_f32
        fn.restype = ctypes.c_int
        fn.argtypes = _ARGTYPES
        fits = lib.paged_decode_attention_supports
        fits.restype = ctypes.c_int
        fits.argtypes = [_i64, _i64, _i64, _i64]
        self._fn, self._fits = fn, fits

    def supports(self, q: torch.Tensor, k_cache: torch.Tensor) -> bool:
        """Whether these tensors fit the kernel: fp32 on the CPU, contiguous caches, head rows of q
        contiguous, head sizes it was compiled for. Otherwise use the torch reference."""
        num_heads, head_dim = q.shape[1], q.shape[2]
        return (
            q.device.type == "cpu"
            and q.dtype == k_cache.dtype == torch.float32
            and k_cache.is_contiguous()
            and q.stride(2) == 1
            and q.stride(1) == head_dim
            and bool(self._fits(num_heads, k_cache.shape[2], head_dim, k_cache.shape[1]))
        )

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
        out: torch.Tensor | None = None,
        *,
        start_block: int = 0,
        lse: torch.Tensor | None = None,
        num_threads: int | None = None,
    ) -> torch.Tensor:
        """q [B, Hq, D] attends keys start_block * block_size .. context_lens[b] - 1; returns out
        [B, Hq, D] (fp32, contiguous). lse: an fp32 [B, Hq] tensor to receive each head's log-sum-exp.
        Every sequence must have at least one key past start_block."""
        batch, num_heads, head_dim = q.shape
        if not self.supports(q, k_cache) or not v_cache.is_contiguous():
            raise ValueError("NativeDecodeAttention needs fp32 CPU tensors with contiguous caches and head rows")
        if out is None:
            out = torch.empty(batch, num_heads, head_dim, dtype=torch.float32)
        if not (out.is_contiguous() and out.dtype == torch.float32 and out.shape == q.shape):
            raise ValueError("out must be a contiguous fp32 tensor shaped like q")
        if lse is not None and not (lse.is_contiguous() and lse.dtype == torch.float32 and lse.numel() == batch * num_heads):
            raise ValueError("lse must be a contiguous fp32 [B, Hq] tensor")
        if batch == 0:
            return out
        tables = block_tables.to(torch.int32).contiguous()
        lens = context_lens.to(torch.int32).contiguous()
        status = self._fn(
            q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), tables.stride(0),
            lens.data_ptr(), batch, num_heads, k_cache.shape[2], head_dim, k_cache.shape[1], start_block, scale,
            out.data_ptr(), None if lse is None else lse.data_ptr(), num_threads or torch.get_num_threads(),
        )  # fmt: skip
        if status != 0:
            raise ValueError(f"paged_decode_attention_f32 refused these sizes (status {status})")
        return out
