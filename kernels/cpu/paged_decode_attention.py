"""paged_decode_attention in C for the CPU: reads each sequence's K/V through its block table.

The torch reference gathers every sequence's blocks into a copy and runs the CPU flash kernel over
it, so decode attention moves each key and value three times; this kernel reads them once from the
cache. Same signature and result as kernels.reference.paged_decode_attention (fp32 caches), plus
`start_block` and `lse` so a caller can attend a shared prefix separately and merge.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kernels.attention_options import FULL_ATTENTION, AttentionOptions
from kernels.cpu.paged_kernel import F32, I64, PTR, PagedAttentionKernel, reject_sinks


class NativeDecodeAttention(PagedAttentionKernel):
    """paged_decode_attention.c, loaded once per instance (the build is cached on disk)."""

    source = Path(__file__).with_suffix(".c")
    argtypes = [PTR, I64, PTR, PTR, PTR, I64, PTR, I64, I64, I64, I64, I64, I64, F32, PTR, PTR, I64, I64, F32]

    def __call__(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
        context_lens: torch.Tensor, scale: float, out: torch.Tensor | None = None, *, start_block: int = 0,
        lse: torch.Tensor | None = None, num_threads: int | None = None,
        options: AttentionOptions = FULL_ATTENTION, checked: bool = False,
    ) -> torch.Tensor:  # fmt: skip
        """q [B, Hq, D] attends keys start_block * block_size .. context_lens[b] - 1 (the last
        `options.window` of them, scores soft-capped by `options.softcap`); returns out [B, Hq, D]
        (fp32, contiguous). lse: an fp32 [B, Hq] tensor to receive each head's log-sum-exp, from which
        the caller applies `options.sinks` (reject_sinks).
        Every sequence must have at least one key past start_block. checked=True skips the checks and
        conversions: the caller passes tensors it has already seen pass them this step (out given,
        int32 tables with dense rows, int32 contiguous lens), as the engine's layers do."""
        reject_sinks(options)
        batch, num_heads, head_dim = q.shape
        if checked:
            tables, lens = block_tables, context_lens
        else:
            out = self._outputs(q, k_cache, v_cache, out, lse)
            tables = block_tables.to(torch.int32)
            if tables.stride(1) != 1:  # rows may be strided (a view of a wider table): read in place
                tables = tables.contiguous()
            lens = context_lens.to(torch.int32).contiguous()
        if batch == 0:
            return out
        status = self._fn(
            q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), tables.stride(0),
            lens.data_ptr(), batch, num_heads, k_cache.shape[2], head_dim, k_cache.shape[1], start_block, scale,
            out.data_ptr(), None if lse is None else lse.data_ptr(), num_threads or torch.get_num_threads(),
            options.window, options.softcap,
        )  # fmt: skip
        self._check(status)
        return out
