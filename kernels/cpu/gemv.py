"""nn.Linear for a few rows of activations in C on the CPU (decode at small batches): y = x W^T + b.

At M <= 8 rows a linear layer is a stream over its weight; the C kernel (gemv.h) reads it once with
all M rows in registers and prefetches ahead in each weight row. Same result as F.linear to fp32
rounding (a different summation order). Larger M is compute-bound: `packed` multiplies any number of
rows with a weight packed once (kernels.cpu.decode_stack.pack_rows) in gemm.h's register tiles.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import torch

from kernels.cpu.build import load_library

SOURCE = Path(__file__).with_suffix(".c")

_ptr, _i64 = ctypes.c_void_p, ctypes.c_int64


class NativeGemv:
    """The compiled kernel, loaded once per instance (the build is cached on disk)."""

    def __init__(self) -> None:
        lib = load_library(SOURCE)
        self._fn, self._fn_h = lib.gemv_f32, lib.gemv_f16
        for fn in (self._fn, self._fn_h):
            fn.argtypes = [_ptr, _ptr, _i64, _i64, _ptr, _i64, _i64, _ptr, _i64, _i64]
            fn.restype = ctypes.c_int
        self.max_rows: int = lib.gemv_max_rows()
        self.pack_width: int = lib.gemm_pack_width()  # the width pack_rows must be given
        self._packed = lib.gemm_packed_f32
        self._packed.argtypes = [_ptr, _i64, _ptr, _i64, _i64, _ptr, _i64, _i64, _ptr, _i64, _i64]
        self._packed.restype = ctypes.c_int
        self._top1 = lib.top1_f32
        self._top1.argtypes, self._top1.restype = [_ptr, _i64, _i64, _ptr, _ptr], None
        self._read = lib.stream_read_f32
        self._read.argtypes, self._read.restype = [_ptr, _i64], ctypes.c_float

    def supports(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
        """x [M, K] fp32 CPU rows (last dim dense) with 1 <= M <= max_rows, a contiguous fp32 or fp16
        weight [N, K] (fp16: widened exactly, the products of its fp32 copy) and a contiguous fp32 bias
        [N] or None."""
        return (
            x.device.type == weight.device.type == "cpu" and x.dtype == torch.float32
            and weight.dtype in (torch.float32, torch.float16)
            and x.dim() == 2 and x.stride(1) == 1 and 1 <= x.shape[0] <= self.max_rows
            and weight.dim() == 2 and weight.is_contiguous() and weight.shape[1] == x.shape[1]
            and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()
                                  and bias.shape == (weight.shape[0],)))
        )  # fmt: skip

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, checked: bool = False
    ) -> torch.Tensor | None:
        """F.linear(x, weight, bias) -> [M, N] fp32; None (nothing done) unless supports(x, weight,
        bias). checked=True: the caller has seen supports hold for tensors of these shapes and dtypes."""
        if not checked and not self.supports(x, weight, bias):
            return None
        rows, k = x.shape
        n = weight.shape[0]
        out = torch.empty(rows, n, dtype=torch.float32)
        fn = self._fn_h if weight.dtype == torch.float16 else self._fn
        fn(weight.data_ptr(), None if bias is None else bias.data_ptr(), n, k, x.data_ptr(), x.stride(0), rows,
                 out.data_ptr(), n, torch.get_num_threads())  # fmt: skip
        return out

    def packed(self, x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None = None) -> torch.Tensor:
        """F.linear(x, w, bias) -> [M, n] fp32 for any M >= 1, with w [n, K] given as pack_rows(w,
        pack_width) (fp32, or fp16: widened exactly). x [M, K] fp32 CPU with a dense last dim; bias
        contiguous fp32 [n] or None. Raises ValueError otherwise."""
        rows, k = x.shape
        if not (x.dtype == torch.float32 and x.device.type == packed.device.type == "cpu" and x.stride(1) == 1
                and rows >= 1 and packed.dtype in (torch.float32, torch.float16) and packed.is_contiguous()
                and packed.shape == (-(-n // self.pack_width), k, self.pack_width)
                and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous() and bias.shape == (n,)))):  # fmt: skip
            raise ValueError(f"packed takes fp32 rows [M, K] and a weight packed as [ceil(n / {self.pack_width}), K, "
                             f"{self.pack_width}], got {tuple(x.shape)} and {tuple(packed.shape)} {packed.dtype}")  # fmt: skip
        out = torch.empty(rows, n, dtype=torch.float32)
        self._packed(packed.data_ptr(), int(packed.dtype == torch.float16), None if bias is None else bias.data_ptr(),
                     n, k, x.data_ptr(), x.stride(0), rows, out.data_ptr(), n, torch.get_num_threads())  # fmt: skip
        return out

    def top1(self, logits: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """(argmax int64 [R], its softmax probability fp32 [R]) of contiguous fp32 CPU logits [R, V]
        (the first of equal maxima, as argmax), as numpy arrays."""
        if not (logits.dtype == torch.float32 and logits.device.type == "cpu" and logits.is_contiguous()
                and logits.dim() == 2):  # fmt: skip
            raise ValueError("top1 takes contiguous fp32 CPU logits [rows, vocab]")
        rows, n = logits.shape
        token, prob = np.empty(rows, np.int64), np.empty(rows, np.float32)
        self._top1(logits.data_ptr(), rows, n, token.ctypes.data, prob.ctypes.data)
        return token, prob

    def stream_read(self, t: torch.Tensor) -> float:
        """Reads a contiguous fp32 CPU tensor once in order (its sum): what a GEMV over it cannot beat."""
        if not (t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous()):
            raise ValueError("stream_read takes a contiguous fp32 CPU tensor")
        return float(self._read(t.data_ptr(), t.numel()))
