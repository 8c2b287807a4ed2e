"""The backend seam: the kernels a model calls, and the per-step attention metadata they read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from kernels.attention_options import FULL_ATTENTION, AttentionOptions


@dataclass(frozen=True)
class AttentionMetadata:
    """Where one step's tokens go in the paged KV cache and what they attend to.

    The step's T tokens are laid out prefill-first: rows [0, num_prefill_tokens) are chunks of
    sequences that are prefilling or were just admitted, any length (prefill_attention); the
    remaining rows are one token per decoding sequence (paged_decode_attention). Tensors live on
    the model's device; block tables may be row-strided views (last dim dense).
    """

    slot_mapping: torch.Tensor  # int64 [T]; -1: do not store (the slot already holds this K/V)
    num_prefill_tokens: int
    prefill_cu_seqlens_q: torch.Tensor | None = None  # int32 [Bp + 1]
    prefill_context_lens: torch.Tensor | None = None  # int32 [Bp], tokens in cache after this step
    prefill_block_tables: torch.Tensor | None = None  # int32 [Bp, max_blocks]
    decode_context_lens: torch.Tensor | None = None  # int32 [Bd]
    decode_block_tables: torch.Tensor | None = None  # int32 [Bd, max_blocks]
    # Rows whose final hidden state the step needs (logits), when fewer than all T: the last layer
    # then stores every row's K/V but attends and runs its MLP for these rows only. None: all rows.
    output_rows: torch.Tensor | None = None  # int64 [N]
    output_context_lens: torch.Tensor | None = None  # int32 [N]: position of the row + 1
    output_block_tables: torch.Tensor | None = None  # int32 [N, max_blocks]
    # Per-step memo a backend may fill with work shared by every layer (e.g. gather plans).
    scratch: dict[Any, Any] = field(default_factory=dict, compare=False)
    # A model with two KV cache groups (worker/engine/kv_groups.py): its local (windowed) layers read
    # this instead, the same step over their own pool (slot_mapping and block tables; the rest shared).
    local: AttentionMetadata | None = None


class Backend:
    """Kernels with the signatures of docs/ARCHITECTURE.md ("Kernel contract").

    A subclass binds the six functions as static attributes (or methods); `supports(device)` says
    whether it can run there. Models receive a Backend instance explicitly; nothing global is read.
    """

    name: ClassVar[str] = "base"
    store_kv_cache = None
    paged_decode_attention = None
    prefill_attention = None
    rms_norm = None
    apply_rotary = None
    silu_mul = None
    gelu_tanh_mul = None  # GeGLU (Gemma): gelu(gate, tanh approximation) * up
    # mixture of experts (kernels/reference/fused_moe.py's signatures)
    select_experts = None
    fused_moe = None
    # LoRA adapters batched by slot (kernels/reference/lora.py's signatures); plan_lora is the
    # implementation's plan_slots, made once per step (worker/engine/lora/step.py)
    plan_lora = None
    lora_shrink = None
    lora_expand = None

    @classmethod
    def supports(cls, device: torch.device) -> bool:
        raise NotImplementedError

    def project(self, linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """linear(x) for a projection module. A plain nn.Linear without hooks of its own is applied
        directly (F.linear: nn.Module.__call__'s hook bookkeeping, paid some 30 times a step, is
        host time the step waits on; bench/step_overhead.py measures a step's host cost);
        anything else (quantized replacements, modules with hooks) is called as a module. Global
        module hooks (torch.nn.modules.module.register_module_forward_hook) do not see the former."""
        if type(linear) is nn.Linear and not (linear._forward_hooks or linear._forward_pre_hooks):
            return F.linear(x, linear.weight, linear.bias)
        return linear(x)

    def decode_stack(self, model: nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        """A fused whole-stack decode path for this model over these caches, or None (the default: the
        layers run op by op). The result has `takes(input_ids, meta, kv_caches) -> bool` and is called
        as `stack(input_ids, positions, meta) -> final-normed hidden states`; CausalLM.forward uses it
        for the steps it takes."""
        return None

    def rotary_store(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
        k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
    ) -> None:  # fmt: skip
        """apply_rotary on q and k in place, then store_kv_cache of k and v at meta.slot_mapping: what
        every layer does before attending. A backend may fuse the two (one pass, one launch)."""
        self.apply_rotary(q, k, positions, cos_sin)
        self.store_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)

    def attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        meta: AttentionMetadata, scale: float, options: AttentionOptions = FULL_ATTENTION, *, rows_only: bool = False,
    ) -> torch.Tensor:  # fmt: skip
        """q [T, Hq, D], k/v [T, Hkv, D] of one layer -> attention output [T, Hq, D], or with
        `rows_only` [N, Hq, D] for meta.output_rows only (`attend_rows`).

        Stores every row's k/v at meta.slot_mapping first, so each token sees itself and the step's
        earlier tokens. `options`: the layer's sinks, sliding window and soft-cap
        (kernels/attention_options.py).
        """
        self.store_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        attend = self.attend_rows if rows_only else self.attend
        return attend(q, k_cache, v_cache, meta, scale, options)

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
        options: AttentionOptions = FULL_ATTENTION,
    ) -> torch.Tensor:  # fmt: skip
        """`attention` once the step's K/V are in the cache (see rotary_store)."""
        out = torch.empty_like(q)
        p = meta.num_prefill_tokens
        if p:
            self.prefill_attention(
                q[:p], k_cache, v_cache, meta.prefill_cu_seqlens_q, meta.prefill_context_lens,
                meta.prefill_block_tables, scale, out[:p], options,
            )  # fmt: skip
        if p < q.shape[0]:
            self.paged_decode_attention(
                q[p:], k_cache, v_cache, meta.decode_block_tables, meta.decode_context_lens, scale, out[p:], options,
            )  # fmt: skip
        return out

    def attend_rows(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
        options: AttentionOptions = FULL_ATTENTION,
    ) -> torch.Tensor:  # fmt: skip
        """`attention(rows_only=True)` once the step's K/V are in the cache: each kept row is one
        query over its sequence's cache up to its own position."""
        assert meta.output_rows is not None  # invariant: only called when the step keeps a subset
        rows = meta.output_rows
        if rows.numel() == 0:
            return q.new_empty((0, *q.shape[1:]))
        return self.paged_decode_attention(
            q.index_select(0, rows), k_cache, v_cache, meta.output_block_tables, meta.output_context_lens, scale,
            None, options,
        )  # fmt: skip
