"""The Triton backend: kernels.triton on CUDA (or on the CPU when kernels.triton was imported under
TRITON_INTERPRET=1, which is how the tests run it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kernels import reference
from kernels.attention_options import FULL_ATTENTION, AttentionOptions
from kernels.triton import lora
from kernels.triton import prefill_attention as _prefill_module
from kernels.triton.fused_moe import fused_moe
from kernels.triton.launch import is_interpreted
from kernels.triton.paged_decode_attention import paged_decode_attention
from kernels.triton.prefill_attention import prefill_attention
from kernels.triton.quant_matmul import int4_matmul, int8_matmul
from kernels.triton.rms_norm import rms_norm
from kernels.triton.rotary import apply_rotary
from kernels.triton.store_kv_cache import store_kv_cache
from worker.engine.backends.base import Backend


def _signature(arg: object) -> object:
    """What a kernel wrapper's argument checks depend on: a tensor's shape, strides, dtype and device
    (an AttentionOptions' sinks' too)."""
    if isinstance(arg, torch.Tensor):
        return arg.shape, arg.stride(), arg.dtype, arg.device
    if isinstance(arg, AttentionOptions):
        return _signature(arg.sinks), arg.window, arg.softcap
    return arg


class TritonBackend(Backend):
    name = "triton"
    silu_mul = staticmethod(reference.silu_mul)  # torch ops on CUDA: no Triton kernel yet
    gelu_tanh_mul = staticmethod(reference.gelu_tanh_mul)
    int8_matmul = staticmethod(int8_matmul)
    int4_matmul = staticmethod(int4_matmul)
    select_experts = staticmethod(reference.select_experts)  # softmax + top-k: torch ops on CUDA
    plan_lora = staticmethod(lora.plan_slots)
    lora_shrink = staticmethod(lora.lora_shrink)
    lora_expand = staticmethod(lora.lora_expand)

    def __init__(self) -> None:
        # argument signatures whose checks passed: each wrapper checks once per batch shape, not at
        # every layer (the checks cost more host time than a small kernel's launch)
        self._checked: set[tuple] = set()

    @classmethod
    def supports(cls, device: torch.device) -> bool:
        # looked up at call time: a module re-imported under the interpreter replaces its kernels
        if is_interpreted(_prefill_module._prefill_kernel):
            return device.type == "cpu"
        return device.type == "cuda"

    def _launch(self, wrapper: Callable[..., Any], *args: object) -> Any:
        key = (wrapper, *map(_signature, args))
        if key in self._checked:
            return wrapper(*args, checked=True)
        result = wrapper(*args)  # checks; raises ValueError on a bad argument
        if len(self._checked) > 4096:  # one entry per wrapper and batch shape; bounded anyway
            self._checked.clear()
        self._checked.add(key)
        return result

    def store_kv_cache(self, k, v, k_cache, v_cache, slot_mapping) -> None:  # type: ignore[override]
        self._launch(store_kv_cache, k, v, k_cache, v_cache, slot_mapping)

    def paged_decode_attention(self, q, k_cache, v_cache, block_tables, context_lens, scale, out=None,  # type: ignore[override]
                               options=FULL_ATTENTION):  # fmt: skip
        return self._launch(paged_decode_attention, q, k_cache, v_cache, block_tables, context_lens, scale, out,
                            options)  # fmt: skip

    def prefill_attention(self, q, k_cache, v_cache, cu_seqlens_q, context_lens, block_tables, scale, out=None,  # type: ignore[override]
                          options=FULL_ATTENTION):  # fmt: skip
        return self._launch(prefill_attention, q, k_cache, v_cache, cu_seqlens_q, context_lens, block_tables, scale,
                            out, options)  # fmt: skip

    def rms_norm(self, x, weight, eps, residual=None):  # type: ignore[override]
        return self._launch(rms_norm, x, weight, eps, residual)

    def apply_rotary(self, q, k, positions, cos_sin) -> None:  # type: ignore[override]
        self._launch(apply_rotary, q, k, positions, cos_sin)

    def fused_moe(self, x, w13, w2, topk_weights, topk_ids, b13=None, b2=None,  # type: ignore[override]
                  swiglu_limit=None, swiglu_alpha=None):  # fmt: skip
        return self._launch(fused_moe, x, w13, w2, topk_weights, topk_ids, b13, b2, swiglu_limit, swiglu_alpha,
                            None)  # fmt: skip
