"""Torch references of every kernel: the contract the Triton kernels are tested against, and the
engine's fast path on the CPU. Signatures follow docs/ARCHITECTURE.md ("Kernel contract")."""

from kernels.reference.activation import gelu_tanh_mul, silu_mul
from kernels.reference.attention import paged_decode_attention, prefill_attention
from kernels.reference.fused_moe import fused_moe, select_experts
from kernels.reference.kv_cache import store_kv_cache
from kernels.reference.norm import rms_norm
from kernels.reference.rotary import apply_rotary
from kernels.reference.token_bitmask import apply_token_bitmask_

__all__ = [
    "apply_token_bitmask_",
    "apply_rotary",
    "fused_moe",
    "gelu_tanh_mul",
    "paged_decode_attention",
    "prefill_attention",
    "rms_norm",
    "select_experts",
    "silu_mul",
    "store_kv_cache",
]
