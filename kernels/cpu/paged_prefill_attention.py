"""prefill_attention in C for the CPU: varlen causal attention straight from the paged cache.

The torch reference gathers each sequence's blocks into a copy, expands the keys over the query
group and runs torch's CPU flash kernel per sequence (~35 GFLOP/s on the benchmark model's shape);
this kernel reads the keys through the block tables once per (sequence, KV head), transposes them
into a scratch buffer and runs register-tiled score and value products over them. Same signature
and result as kernels.reference.prefill_attention (fp32 caches), plus `start_block` and `lse` so a
caller can attend a shared prefix separately and merge.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kernels.attention_options import FULL_ATTENTION, AttentionOptions
from kernels.cpu.paged_kernel import F32, I64, PTR, PagedAttentionKernel, reject_sinks


class NativePrefillAttention(PagedAttentionKernel):
    """paged_prefill_attention.c (GQA groups up to 12), loaded once per instance (the build is cached
    on disk)."""

    source = Path(__file__).with_suffix(".c")
    argtypes = [PTR, I64, PTR, PTR, PTR, PTR, PTR, I64, I64, I64, I64, I64, I64, I64, F32, PTR, PTR, I64, I64, F32]

    def __call__(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
        context_lens: torch.Tensor, block_tables: torch.Tensor, scale: float, out: torch.Tensor | None = None,
        *, start_block: int = 0, lse: torch.Tensor | None = None, num_threads: int | None = None,
        options: AttentionOptions = FULL_ATTENTION,
    ) -> torch.Tensor:  # fmt: skip
        """q [T, Hq, D]: sequence b owns rows cu_seqlens_q[b]:cu_seqlens_q[b+1], its query i at position
        context_lens[b] - q_len + i, attending keys start_block * block_size .. its position (at least
        one; only the last `options.window` positions, scores soft-capped by `options.softcap`).
        Returns out [T, Hq, D] (fp32, contiguous). lse: an fp32 [T, Hq] tensor to receive each row's
        log-sum-exp, from which the caller applies `options.sinks` (reject_sinks)."""
        reject_sinks(options)
        total, num_heads, head_dim = q.shape
        out = self._outputs(q, k_cache, v_cache, out, lse)
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
            num_threads or torch.get_num_threads(), options.window, options.softcap,
        )  # fmt: skip
        self._check(status)
        return out
