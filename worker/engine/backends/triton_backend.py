"""The Triton backend: kernels.triton on CUDA (or on the CPU when kernels.triton was imported under
TRITON_INTERPRET=1, which is how the tests run it)."""

from __future__ import annotations

import torch

from kernels import reference
from kernels.triton import prefill_attention as _prefill_module
from kernels.triton.launch import is_interpreted
from kernels.triton.paged_decode_attention import paged_decode_attention
from kernels.triton.prefill_attention import prefill_attention
from kernels.triton.quant_matmul import int4_matmul, int8_matmul
from kernels.triton.rms_norm import rms_norm
from kernels.triton.rotary import apply_rotary
from kernels.triton.store_kv_cache import store_kv_cache
from worker.engine.backends.base import Backend


class TritonBackend(Backend):
    name = "triton"
    store_kv_cache = staticmethod(store_kv_cache)
    paged_decode_attention = staticmethod(paged_decode_attention)
    prefill_attention = staticmethod(prefill_attention)
    rms_norm = staticmethod(rms_norm)
    apply_rotary = staticmethod(apply_rotary)
    silu_mul = staticmethod(reference.silu_mul)  # torch ops on CUDA: no Triton kernel yet
    int8_matmul = staticmethod(int8_matmul)
    int4_matmul = staticmethod(int4_matmul)

    @classmethod
    def supports(cls, device: torch.device) -> bool:
        # looked up at call time: a module re-imported under the interpreter replaces its kernels
        if is_interpreted(_prefill_module._prefill_kernel):
            return device.type == "cpu"
        return device.type == "cuda"
