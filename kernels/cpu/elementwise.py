"""RMSNorm (with the residual add), SiLU * up, rotary (alone, or fused with the KV-cache store) in C
for the CPU, one pass each.

Same results as kernels.reference's rms_norm, silu_mul and apply_rotary (fp32, to rounding), without
the reference's chain of torch ops and their activation-sized temporaries. Each method checks its
tensors once (`supports_*`) and returns None (apply_rotary: False) when they don't fit, so the CPU
backend falls back to the reference without checking twice on the hot path.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from kernels.cpu.build import load_library

SOURCE = Path(__file__).with_suffix(".c")

_ptr, _i64, _f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


def _rows_fp32(x: torch.Tensor) -> bool:
    """A 2-D fp32 CPU tensor whose rows are contiguous."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1


def _heads_fp32(x: torch.Tensor) -> bool:
    """[T, H, D] fp32 on the CPU with each token's heads contiguous (a view of a qkv row is)."""
    return (
        x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 3 and x.stride(2) == 1
        and x.stride(1) == x.shape[2]
    )  # fmt: skip


class NativeElementwise:
    """The compiled kernels, loaded once per instance (the build is cached on disk)."""

    def __init__(self) -> None:
        lib = load_library(SOURCE)
        self._rms = lib.rms_norm_f32
        self._rms.argtypes = [_ptr, _i64, _ptr, _i64, _ptr, _f32, _i64, _i64, _ptr, _ptr, _i64]
        self._silu = lib.silu_mul_f32
        self._silu.argtypes = [_ptr, _i64, _i64, _i64, _ptr, _i64]
        self._rotary = lib.rotary_f32
        self._rotary.argtypes = [_ptr, _i64, _i64, _ptr, _i64, _i64, _i64, _ptr, _ptr, _i64, _i64]
        for fn in (self._rms, self._silu, self._rotary):
            fn.restype = None
        self._rotary_store = lib.rotary_store_f32
        self._rotary_store.argtypes = [_ptr, _i64, _i64, _ptr, _i64, _ptr, _i64, _i64, _i64, _ptr, _ptr, _i64, _ptr,
                                       _ptr, _ptr, _i64, _i64, _i64]  # fmt: skip
        self._rotary_store.restype = ctypes.c_int

    def supports_rms_norm(self, x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> bool:
        return (
            _rows_fp32(x) and weight.dtype == torch.float32 and weight.is_contiguous()
            and weight.shape == (x.shape[1],)
            and (residual is None or (_rows_fp32(residual) and residual.shape == x.shape))
        )  # fmt: skip

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
        *, checked: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:  # fmt: skip
        """kernels.reference.rms_norm: (normed * weight, the normed input: x + residual, or x); None
        unless x (and residual) are 2-D fp32 CPU rows with a matching fp32 weight. checked=True: the
        caller has seen supports_rms_norm hold for tensors of these shapes, strides and dtypes."""
        if not checked and not self.supports_rms_norm(x, weight, residual):
            return None
        rows, n = x.shape
        out = torch.empty(rows, n, dtype=torch.float32)
        summed = x if residual is None else torch.empty(rows, n, dtype=torch.float32)
        if rows:
            self._rms(
                x.data_ptr(), x.stride(0), None if residual is None else residual.data_ptr(),
                0 if residual is None else residual.stride(0), weight.data_ptr(), eps, rows, n, out.data_ptr(),
                None if residual is None else summed.data_ptr(), torch.get_num_threads(),
            )  # fmt: skip
        return out, summed

    def supports_silu_mul(self, gate_up: torch.Tensor) -> bool:
        return _rows_fp32(gate_up) and gate_up.shape[1] % 2 == 0

    def silu_mul(self, gate_up: torch.Tensor, *, checked: bool = False) -> torch.Tensor | None:
        """kernels.reference.silu_mul: [rows, 2 * I] -> silu(gate) * up [rows, I]; None unless gate_up
        is 2-D fp32 CPU rows of even width (checked=True: known to be)."""
        if not checked and not self.supports_silu_mul(gate_up):
            return None
        rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty(rows, inter, dtype=torch.float32)
        if rows:
            self._silu(gate_up.data_ptr(), gate_up.stride(0), rows, inter, out.data_ptr(), torch.get_num_threads())
        return out

    def supports_rotary(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> bool:
        return (
            _heads_fp32(q) and _heads_fp32(k) and q.shape[0] == k.shape[0] == positions.numel()
            and q.shape[2] == k.shape[2] == cos_sin.shape[-1] and q.shape[2] % 2 == 0
            and cos_sin.dtype == torch.float32 and cos_sin.dim() == 2 and cos_sin.is_contiguous()
            and positions.device.type == "cpu"
        )  # fmt: skip

    def apply_rotary(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> bool:
        """kernels.reference.apply_rotary: q [T, Hq, D] and k [T, Hkv, D] rotated in place; False (and
        nothing done) unless q and k are fp32 CPU tensors with contiguous heads."""
        if not self.supports_rotary(q, k, positions, cos_sin):
            return False
        tokens = q.shape[0]
        if not tokens:
            return True
        pos = positions.to(torch.int64).contiguous()
        lo, hi = pos.aminmax()
        if int(lo) < 0 or int(hi) >= cos_sin.shape[0]:  # the reference's index_select raises here too
            raise IndexError(f"positions {int(lo)}..{int(hi)} outside the rotary cache's {cos_sin.shape[0]} rows")
        self._rotary(
            q.data_ptr(), q.stride(0), q.shape[1], k.data_ptr(), k.stride(0), k.shape[1], q.shape[2], pos.data_ptr(),
            cos_sin.data_ptr(), tokens, torch.get_num_threads(),
        )  # fmt: skip
        return True

    def supports_rotary_store(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
        k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
    ) -> bool:  # fmt: skip
        """q, k as supports_rotary; v like k; int64 contiguous positions and slots; contiguous fp32 caches
        [num_blocks, block_size, Hkv, D] matching k's heads."""
        return (
            self.supports_rotary(q, k, positions, cos_sin) and _heads_fp32(v) and v.shape == k.shape
            and positions.dtype == torch.int64 and positions.is_contiguous()
            and slot_mapping.dtype == torch.int64 and slot_mapping.is_contiguous()
            and slot_mapping.device.type == "cpu" and slot_mapping.numel() == q.shape[0]
            and k_cache.dtype == v_cache.dtype == torch.float32 and k_cache.is_contiguous() and v_cache.is_contiguous()
            and k_cache.shape == v_cache.shape and k_cache.dim() == 4 and k_cache.shape[2:] == k.shape[1:]
        )  # fmt: skip

    def rotary_store(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
        k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, *, checked: bool = False,
    ) -> bool:  # fmt: skip
        """kernels.reference.apply_rotary then store_kv_cache, in one pass; False (nothing done) unless
        supports_rotary_store. checked=True: the caller has already seen supports_rotary_store hold for
        tensors of these shapes, strides and dtypes (the engine checks once per step, not per layer)."""
        if not checked and not self.supports_rotary_store(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping):
            return False
        tokens = q.shape[0]
        status = self._rotary_store(
            q.data_ptr(), q.stride(0), q.shape[1], k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), k.shape[1],
            q.shape[2], positions.data_ptr(), cos_sin.data_ptr(), cos_sin.shape[0], slot_mapping.data_ptr(),
            k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[0] * k_cache.shape[1], tokens,
            torch.get_num_threads(),
        )  # fmt: skip
        if status:  # the reference's index_select / index_copy_ raise here too
            raise IndexError(f"a position outside the rotary cache's {cos_sin.shape[0]} rows or a slot outside the "
                             f"cache's {k_cache.shape[0] * k_cache.shape[1]}")  # fmt: skip
        return True
