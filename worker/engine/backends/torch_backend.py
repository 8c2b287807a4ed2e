"""The torch backend: kernels.reference, on any device (the CPU fast path)."""

from __future__ import annotations

import torch

from kernels import reference
from kernels.attention_options import FULL_ATTENTION, AttentionOptions
from kernels.reference import lora
from kernels.reference.attention import decode_with_plan, plan_decode, plan_prefill, prefill_with_plan
from worker.engine.backends.base import AttentionMetadata, Backend


class TorchBackend(Backend):
    name = "torch"
    store_kv_cache = staticmethod(reference.store_kv_cache)
    paged_decode_attention = staticmethod(reference.paged_decode_attention)
    prefill_attention = staticmethod(reference.prefill_attention)
    rms_norm = staticmethod(reference.rms_norm)
    apply_rotary = staticmethod(reference.apply_rotary)
    silu_mul = staticmethod(reference.silu_mul)
    gelu_tanh_mul = staticmethod(reference.gelu_tanh_mul)
    select_experts = staticmethod(reference.select_experts)
    fused_moe = staticmethod(reference.fused_moe)
    # per adapter present: one matmul over its gathered rows (the CPU path; no Python per token)
    plan_lora = staticmethod(lora.plan_slots)
    lora_shrink = staticmethod(lora.lora_shrink)
    lora_expand = staticmethod(lora.lora_expand)

    @classmethod
    def supports(cls, device: torch.device) -> bool:
        return True

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
        options: AttentionOptions = FULL_ATTENTION,
    ) -> torch.Tensor:  # fmt: skip
        """Backend.attend, with the gather plans built once per step and reused by every layer."""
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        p = meta.num_prefill_tokens
        if p:
            self.prefill_rows(q[:p], k_cache, v_cache, meta, scale, out[:p], options)
        if p < q.shape[0]:
            self.decode_rows(q[p:], k_cache, v_cache, meta, scale, out[p:], options)
        return out

    def prefill_rows(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
        out: torch.Tensor, options: AttentionOptions = FULL_ATTENTION,
    ) -> None:  # fmt: skip
        """The step's prefill rows q [P, Hq, D] -> out, through a plan shared by every layer with the
        same window (a model mixing local and global layers builds two)."""
        window = options.window
        key = ("prefill", window) if window else "prefill"
        plan = meta.scratch.get(key)
        if plan is None:
            group = q.shape[1] // k_cache.shape[2]
            plan = plan_prefill(meta.prefill_cu_seqlens_q, meta.prefill_context_lens,
                                meta.prefill_block_tables, k_cache.shape[1], group, window)  # fmt: skip
            meta.scratch[key] = plan
        prefill_with_plan(q, k_cache, v_cache, plan, scale, out, options)

    def decode_rows(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
        out: torch.Tensor, options: AttentionOptions = FULL_ATTENTION,
    ) -> None:  # fmt: skip
        """The step's decode rows q [B, Hq, D] -> out, through a plan shared by every layer with the
        same window."""
        window = options.window
        key = ("decode", window) if window else "decode"
        plan = meta.scratch.get(key)
        if plan is None:
            plan = plan_decode(meta.decode_block_tables, meta.decode_context_lens, k_cache.shape[1], window=window)
            meta.scratch[key] = plan
        decode_with_plan(q, k_cache, v_cache, plan, scale, out, options)
