"""The CPU backend: the torch backend with decode and prefill attention and the elementwise layers
in C (kernels/cpu).

Decode attention is memory-bound: the torch path gathers every sequence's blocks into a copy and
runs the CPU flash kernel over it, moving each key and value three times; the C kernel reads them
once, straight from the paged cache. Prefill (compute-bound) reads its keys through the block
tables too, into register-tiled products (bench/cpu_prefill_attention.py: the C kernel against the
torch path on the benchmark model's shape). When a step's sequences share leading blocks (a common prompt prefix), those are attended
once for the whole batch by the torch cascade and merged with the kernels' result by log-sum-exp.
RMSNorm (with its residual add), SiLU * up and rotary run one C pass each instead of the
reference's chains of torch ops; any tensor the kernels don't take falls back to the reference.
Projections of at most 8 rows (decode at small batches, the logits of a few rows) are C GEMVs that
stream the weight once (torch's GEMM packs its operands per call, which a few rows do not repay), and
pure decode steps run
the whole decoder stack in one C call (cpu_decode_stack: packed register tiles at every row count;
the lm_head of a model bound to it likewise, through HeadCopies).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import structlog
import torch
import torch.nn.functional as F
from torch import nn

from kernels.attention_options import FULL_ATTENTION, AttentionOptions
from kernels.cpu.decode_stack import NativeDecodeStack
from kernels.cpu.elementwise import NativeElementwise
from kernels.cpu.gemv import NativeGemv
from kernels.cpu.paged_decode_attention import NativeDecodeAttention
from kernels.cpu.paged_prefill_attention import NativePrefillAttention
from kernels.reference.attention import (
    apply_sinks,
    attend_shared_blocks,
    attend_shared_prefill,
    decode_shared_blocks,
    merge_partials,
    prefill_shared_blocks,
)
from kernels.reference.fused_moe import expert_mlp, grouped_moe
from worker.engine.backends.base import AttentionMetadata
from worker.engine.backends.cpu_decode_stack import HeadCopies, ModelDecodeStack, ineligible
from worker.engine.backends.torch_backend import TorchBackend

log = structlog.get_logger(__name__)


class CpuBackend(TorchBackend):
    name = "cpu"

    def __init__(self) -> None:
        self.native = NativeDecodeAttention()  # compiles on first use; raises KernelBuildError
        self.prefill = NativePrefillAttention()
        self.elementwise = NativeElementwise()
        self.gemv = NativeGemv()
        self.stack = NativeDecodeStack()
        # whether the C kernel takes tensors of a (shapes, strides, dtypes) signature: checked once
        # per batch shape, not at each of the ~5 calls per layer
        self._fits: dict[tuple, bool] = {}
        # lm_head copies by id(module) (bound with a model's decode stack): see HeadCopies
        self._heads: dict[int, HeadCopies] = {}

    def _fit(self, key: tuple, check: Callable[[], bool]) -> bool:
        fits = self._fits.get(key)
        if fits is None:
            if len(self._fits) > 4096:  # one entry per batch shape and op; bounded anyway
                self._fits.clear()
            fits = self._fits[key] = check()
        return fits

    @classmethod
    def supports(cls, device: torch.device) -> bool:
        return device.type == "cpu"

    def project(self, linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Backend.project, with a plain fp32 nn.Linear on at most gemv.max_rows rows as a C GEMV (an
        lm_head with HeadCopies: its packed copy from stack.packed_rows rows, 1: every step)."""
        if type(linear) is nn.Linear and not (linear._forward_hooks or linear._forward_pre_hooks):
            w, b = linear.weight, linear.bias
            head = self.head_copies(linear)
            if head is not None and x.dim() == 2 and x.dtype == torch.float32 and x.stride(1) == 1 \
                    and x.device.type == "cpu" and x.shape[0] >= max(1, self.stack.packed_rows):  # fmt: skip
                return self.gemv.packed(x, head.packed, w.shape[0], b)
            if x.dim() == 2 and x.shape[0] <= self.gemv.max_rows:
                key = ("gemv", x.shape, x.stride(), x.dtype, w.shape, w.stride(), w.dtype, None if b is None else b.dtype)
                if self._fit(key, lambda: self.gemv.supports(x, w, b)):
                    return self.gemv(x, w, b, checked=True)  # type: ignore[return-value]
            return F.linear(x, w, b)
        return linear(x)

    def head_copies(self, head: nn.Module) -> HeadCopies | None:
        """The copies `decode_stack` made of this lm_head (None: it made none)."""
        copies = self._heads.get(id(head))
        return copies if copies is not None and copies.module is head else None

    def decode_stack(self, model: nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> ModelDecodeStack | None:
        """The whole-stack C decode for pure decode steps (cpu_decode_stack), or None (logged) when
        this model's layers cannot take it."""
        reason = ineligible(model, kv_caches, self.stack)
        if reason is not None:
            log.info("decode_stack_off", reason=reason)
            return None
        stack = ModelDecodeStack.for_engine(model, kv_caches, self.stack)
        if stack.head_copies is not None:  # its lm_head's copy, for the steps the stack does not take
            self._heads[id(stack.head_copies.module)] = stack.head_copies
        return stack

    def rms_norm(  # type: ignore[override]
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        key = (x.shape, x.stride(), x.dtype, weight.shape, weight.stride(), weight.dtype,
               None if residual is None else (residual.shape, residual.stride(), residual.dtype))  # fmt: skip
        if self._fit(key, lambda: self.elementwise.supports_rms_norm(x, weight, residual)):
            return self.elementwise.rms_norm(x, weight, eps, residual, checked=True)  # type: ignore[return-value]
        return super().rms_norm(x, weight, eps, residual)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if self._fit(("silu", gate_up.shape, gate_up.stride(), gate_up.dtype),
                     lambda: self.elementwise.supports_silu_mul(gate_up)):  # fmt: skip
            return self.elementwise.silu_mul(gate_up, checked=True)  # type: ignore[return-value]
        return super().silu_mul(gate_up)

    def fused_moe(  # type: ignore[override]
        self, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
        b13: torch.Tensor | None = None, b2: torch.Tensor | None = None,
        swiglu_limit: float | None = None, swiglu_alpha: float | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """The reference's grouped experts, with SiLU * up in one C pass per expert, and an expert's
        matmuls as C GEMVs when it got at most gemv.max_rows rows (decode: the expert's weights
        streamed once). Biases and the clamped SwiGLU (gpt-oss) as in the reference."""
        mlp = expert_mlp(w13, w2, b13, b2, swiglu_limit, swiglu_alpha, self.silu_mul, self._expert_linear)
        return grouped_moe(x, topk_weights, topk_ids, w13.shape[0], mlp)

    def _expert_linear(self, rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if rows.shape[0] <= self.gemv.max_rows and self.gemv.supports(rows, weight, None):
            return self.gemv(rows, weight, None, checked=True)  # type: ignore[return-value]
        return torch.mm(rows, weight.t())

    def apply_rotary(  # type: ignore[override]
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
    ) -> None:
        if not self.elementwise.apply_rotary(q, k, positions, cos_sin):
            super().apply_rotary(q, k, positions, cos_sin)

    def rotary_store(  # type: ignore[override]
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
        k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
    ) -> None:  # fmt: skip
        """Rotary and the K/V store in one C pass. Every layer of a step passes tensors of the same
        shapes, strides and dtypes, so the first layer's check holds for the step (meta.scratch)."""
        fits = meta.scratch.get("rotary_store")
        if fits is None:
            fits = self.elementwise.supports_rotary_store(q, k, v, positions, cos_sin, k_cache, v_cache,
                                                          meta.slot_mapping)  # fmt: skip
            meta.scratch["rotary_store"] = fits
        if not fits:
            super().rotary_store(q, k, v, positions, cos_sin, k_cache, v_cache, meta)
            return
        self.elementwise.rotary_store(q, k, v, positions, cos_sin, k_cache, v_cache, meta.slot_mapping, checked=True)

    def prefill_rows(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
        out: torch.Tensor, options: AttentionOptions = FULL_ATTENTION,
    ) -> None:  # fmt: skip
        """The C prefill kernel; attention sinks (gpt-oss) scale its output by its log-sum-exp."""
        if not (self.prefill.supports(q, k_cache) and out.is_contiguous()):
            super().prefill_rows(q, k_cache, v_cache, meta, scale, out, options)
            return
        shared = meta.scratch.get("prefill_shared")
        if shared is None:
            shared = prefill_shared_blocks(meta.prefill_cu_seqlens_q.tolist(), meta.prefill_context_lens.tolist(),
                                           meta.prefill_block_tables, k_cache.shape[1])  # fmt: skip
            meta.scratch["prefill_shared"] = shared
        if options.window:  # no cascade inside a window: the blocks it left may be another sequence's by now
            shared = 0
        args = (q, k_cache, v_cache, meta.prefill_cu_seqlens_q, meta.prefill_context_lens, meta.prefill_block_tables)
        kernel_options = _without_sinks(options)
        if not shared and options.sinks is None:
            self.prefill(*args, scale, out, options=kernel_options)
            return
        lse = torch.empty(q.shape[:2], dtype=torch.float32)
        self.prefill(*args, scale, out, start_block=shared, lse=lse, options=kernel_options)
        shared_ids = meta.prefill_block_tables[0, :shared].long()
        shared_part = attend_shared_prefill(q, k_cache, v_cache, shared_ids, scale, options.softcap) if shared else None
        _merge_shared(out, lse, shared_part, options.sinks)

    def decode_rows(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
        out: torch.Tensor, options: AttentionOptions = FULL_ATTENTION,
    ) -> None:  # fmt: skip
        plan = meta.scratch.get("native_decode")
        if plan is None:  # once per step: every layer passes tensors of the same shapes and dtypes
            plan = self._plan_decode(q, k_cache, v_cache, meta, out)
            meta.scratch["native_decode"] = plan
        if not plan:
            super().decode_rows(q, k_cache, v_cache, meta, scale, out, options)
            return
        tables, lens, shared = plan
        self._decode(q, k_cache, v_cache, tables, lens, scale, out, 0 if options.window else shared, options,
                     checked=True)  # fmt: skip

    def _plan_decode(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, out: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, int] | None:  # fmt: skip
        """(int32 tables with dense rows, int32 lens, shared leading blocks) for the C kernel, or None
        where it does not apply (the torch path then runs)."""
        if not (self.native.supports(q, k_cache) and v_cache.is_contiguous() and out.is_contiguous()
                and out.dtype == torch.float32):  # fmt: skip
            return None
        tables = meta.decode_block_tables.to(torch.int32)
        if tables.stride(1) != 1:
            tables = tables.contiguous()
        lens = meta.decode_context_lens.to(torch.int32).contiguous()
        return tables, lens, decode_shared_blocks(tables, lens.tolist(), k_cache.shape[1])

    def paged_decode_attention(  # type: ignore[override]
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
        context_lens: torch.Tensor, scale: float, out: torch.Tensor | None = None,
        options: AttentionOptions = FULL_ATTENTION,
    ) -> torch.Tensor:  # fmt: skip
        """kernels.reference.paged_decode_attention, through the C kernel where it applies."""
        if not self.native.supports(q, k_cache):
            return super().paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, out, options)
        result = out if out is not None and out.is_contiguous() else torch.empty(q.shape, dtype=q.dtype)
        shared = 0  # no cascade inside a window: the blocks it left may be another sequence's by now
        if q.shape[0] and not options.window:
            shared = decode_shared_blocks(block_tables, context_lens.tolist(), k_cache.shape[1])
        self._decode(q, k_cache, v_cache, block_tables, context_lens, scale, result, shared, options)
        if out is not None and result is not out:
            out.copy_(result)
        return result

    def _decode(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
        context_lens: torch.Tensor, scale: float, out: torch.Tensor, shared: int, options: AttentionOptions,
        checked: bool = False,
    ) -> None:  # fmt: skip
        """out [B, Hq, D] (contiguous) <- the kernel over blocks >= shared, merged with the cascade
        (shared is 0 with a window); scaled for the attention sinks, if any."""
        kernel_options = _without_sinks(options)
        if not shared and options.sinks is None:
            self.native(q, k_cache, v_cache, block_tables, context_lens, scale, out, options=kernel_options,
                        checked=checked)  # fmt: skip
            return
        batch, num_heads, head_dim = q.shape
        num_kv_heads = k_cache.shape[2]
        lse = torch.empty(batch, num_heads, dtype=torch.float32)
        self.native(q, k_cache, v_cache, block_tables, context_lens, scale, out, start_block=shared, lse=lse,
                    options=kernel_options, checked=checked)  # fmt: skip
        qf = q.view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
        shared_ids = block_tables[0, :shared].long()
        shared_part = attend_shared_blocks(qf, k_cache, v_cache, shared_ids, scale, options.softcap) if shared else None
        _merge_shared(out, lse, shared_part, options.sinks)


def _without_sinks(options: AttentionOptions) -> AttentionOptions:
    """What the C kernels apply of `options`: the sinks are applied after them, through their lse."""
    return options if options.sinks is None else replace(options, sinks=None)


def _merge_shared(
    out: torch.Tensor, lse: torch.Tensor, shared: tuple[torch.Tensor, torch.Tensor] | None, sinks: torch.Tensor | None
) -> None:
    """out [N, Hq, D] over each row's own keys (log-sum-exp lse [N, Hq]) <- merged in place with the
    shared blocks' (o [N, Hkv, G, D], log-sum-exp s [N, Hkv, G]) if any, then scaled for the
    attention sinks fp32 [Hq] if any (kernels.reference.attention.apply_sinks)."""
    rows, num_heads, head_dim = out.shape
    if shared is not None:
        o, s = shared
        group = o.shape[2]
        own, own_lse = out.view(rows, -1, group, head_dim), lse.view(rows, -1, group)
        merged = merge_partials(own, own_lse, o, s)
        if sinks is not None:
            apply_sinks(merged, torch.logaddexp(own_lse, s), sinks)
        out.copy_(merged.view(rows, num_heads, head_dim))
        return
    assert sinks is not None  # invariant: called with something to apply
    apply_sinks(out.view(rows, num_heads, 1, head_dim), lse.view(rows, num_heads, 1), sinks)
