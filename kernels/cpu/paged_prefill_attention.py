"""prefill_attention in C for the CPU: varlen causal attention straight from the paged cache.

The torch reference gathers each sequence's blocks into a copy, expands the keys over the query
group and runs torch's CPU flash kernel per sequence (~35 GFLOP/s on the benchmark model's shape);
this kernel reads the keys through the block tables once per (sequence, KV head), transposes them
into a scratch buffer and runs register-tiled score and value products over them. Same signature
and result as kernels.reference.prefill_attention (fp32 caches), plus `start_block` and `lse` so a
caller can attend a shared prefix separately and merge.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from kernels.cpu.build import load_library

SOURCE = Path(__file__).with_suffix(".c")

_ptr, _i64 = ctypes.c_void_p, ctypes.c_int64
_ARGTYPES = [_ptr, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _i64, _i64, _i64, _i64, ctypes.c_float,
             _ptr, _ptr, _i64]  # fmt: skip


class NativePrefillAttention:
    """The compiled kernel, loaded once per instance (the build is cached on disk)."""

    def __init__(self) -> None:
        lib = load_library(SOURCE)
        fn = lib.paged_prefill_attention_f32
        fn.restype = ctypes.c_int
        fn.argtypes = _ARGTYPES
        fits = lib.paged_prefill_attention_supports
        fits.restype = ctypes.c_int
        fits.argtypes = [_i64, _i64, _i64, _i64]
        self._fn, self._fits = fn, fits

    def supports(self, q: torch.Tensor, k_cache: torch.Tensor) -> bool:
        """Whether these tensors fit the kernel: fp32 on the CPU, contiguous caches, head rows of q
        contiguous, head sizes it was compiled for (GQA groups up to 12). Otherwise use the torch
        reference."""
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
        cu_seqlens_q: torch.Tensor,
        context_lens: torch.Tensor,
        block_tables: torch.Tensor,
        scale: float,
        out: torch.Tensor | None = None,
        *,
        start_block: int = 0,
        lse: torch.Tensor | None = None,
        num_threads: int | None = None,
    ) -> torch.Tensor:
        """q [T, Hq, D]: sequence b owns rows cu_seqlens_q[b]:cu_seqlens_q[b+1], its query i at position
        context_lens[b] - q_len + i, attending keys start_block * block_size .. its position (at least
        one). Returns out [T, Hq, D] (fp32, contiguous). lse: an fp32 [T, Hq] tensor to receive each
        row's log-sum-exp."""
        total, num_heads, head_dim = q.shape
        if not self.supports(q, k_cache) or not v_cache.is_contiguous():
            raise ValueError("NativePrefillAttention needs fp32 CPU tensors with contiguous caches and head rows")
        if out is None:
            out = torch.empty(total, num_heads, head_dim, dtype=torch.float32)
        if not (out.is_contiguous() and out.dtype == torch.float32 and out.shape == q.shape):
            raise ValueError("out must be a contiguous fp32 tensor shaped like q")
        if lse is not None and not (lse.is_contiguous() and lse.dtype == torch.float32 and lse.numel() == total * num_heads):
            raise ValueError("lse must be a contiguous fp32 [T, Hq] tensor")
        batch = context_lens.shape[0]
        if total == 0 or batch == 0:
            return out
        cu = cu_seqlens_q.to(torch.int32).contiguous()
        lens = context_lens.to(torch.int32).contiguous()
        tables = block_tables.to(torch.int32).contiguous()
        if cu.shape[0] != batch + 1 or int(cu[-1]) != total:
            raise ValueError("cu_seqlens_q must hold B + 1 offsets ending at q's row count")
        status = self._fn(
            q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), cu.data_ptr(), lens.data_ptr(),
            tables.data_ptr(), tables.stride(0), batch, num_heads, k_cache.shape[2], head_dim, k_cache.shape[1],
            start_block, scale, out.data_ptr(), None if lse is None else lse.data_ptr(),
            num_threads or torch.get_num_threads(),
        )  # fmt: skip
        if status == -2:
            raise MemoryError("paged_prefill_attention_f32 could not allocate its scratch buffers")
        if status != 0:
            raise ValueError(f"paged_prefill_attention_f32 refused these sizes (status {status})")
        return out
