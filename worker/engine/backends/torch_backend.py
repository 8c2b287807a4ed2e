"""The torch backend: kernels.reference, on any device (the CPU fast path)."""

from __future__ import annotations

import torch

from kernels import reference
from worker.engine.backends.base import Backend


class TorchBackend(Backend):
    name = "torch"
    store_kv_cache = staticmethod(reference.store_kv_cache)
    paged_decode_attention = staticmethod(reference.paged_decode_attention)
    prefill_attention = staticmethod(reference.prefill_attention)
    rms_norm = staticmethod(reference.rms_norm)
    apply_rotary = staticmethod(reference.apply_rotary)

    @classmethod
    def supports(cls, device: torch.device) -> bool:
        return True
