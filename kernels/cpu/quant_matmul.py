"""Quantized Linears on the CPU in integers (quant.h): y = x W^T (+ bias) with W int8 per output channel
or int4 group-wise, x fp32 quantized per row block to int8 at each call.

`pack_int8` / `pack_int4` turn freight's layouts (kernels/reference/quant_matmul.py) into the packed
tiles the kernel streams, once; `NativeQuantMatmul` multiplies any number of rows with them. The result
is kernels.reference.quant_matmul.int8_dynamic_matmul / int4_dynamic_matmul to fp32 rounding (the
activations' int8 rounding is part of the result; against the weight-only reference it is within
dynamic_rounding_bound).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels.cpu.build import load_library
from kernels.reference.quant_matmul import INT8_ACT_BLOCK, unpack_int4

SOURCE = Path(__file__).with_suffix(".c")
PACK_WIDTH = 64  # output rows per packed tile (quant.h's QNB), the same on every instruction set
ISAS = {3: "avx512-vnni", 2: "avx-vnni", 1: "avx2", 0: "portable C"}

_ptr, _i64 = ctypes.c_void_p, ctypes.c_int64


@dataclass(frozen=True)
class QuantWeight:
    """A quantized weight [n, k] packed for quant.h: data uint8 (int8: [ceil(n / 64), ceil(k / 4), 64, 4],
    int4: [ceil(n / 64), k / 8, 64, 4]), scales (int8: fp32 [ceil(n / 64) * 64]; int4: fp32 or fp16
    [ceil(n / 64), k / group, 64])."""

    bits: int
    n: int
    k: int
    group: int  # int4's group size; 0 for int8
    data: torch.Tensor
    scales: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.data.numel() + self.scales.numel() * self.scales.element_size()

    @functools.cached_property
    def args(self) -> tuple[int, int, int, int, int]:
        """(data pointer, scales pointer, bits, group, fp16 scales): quant_matmul_f32's first arguments."""
        return (self.data.data_ptr(), self.scales.data_ptr(), self.bits, self.group,
                int(self.scales.dtype == torch.float16))  # fmt: skip


def pack_int8(qweight: torch.Tensor, scales: torch.Tensor) -> QuantWeight:
    """freight int8 (qweight int8 [N, K], scales [N]) -> the packed tiles (weights + 128, unsigned)."""
    n, k = qweight.shape
    tiles, steps = -(-n // PACK_WIDTH), -(-k // 4)
    u = torch.full((tiles * PACK_WIDTH, steps * 4), 128, dtype=torch.uint8)
    u[:n, :k] = (qweight.to(torch.int16) + 128).to(torch.uint8)
    data = u.view(tiles, PACK_WIDTH, steps, 4).transpose(1, 2).contiguous()
    s = torch.zeros(tiles * PACK_WIDTH, dtype=torch.float32)
    s[:n] = scales.float()
    return QuantWeight(8, n, k, 0, data, s)


def pack_int4(qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> QuantWeight:
    """freight int4 (qweight uint8 [N, K // 2], scales [N, K // G]) -> the packed tiles: nibbles q + 8,
    k-step s of 8 k in one 4-byte word per output (k = 8s + j low, 8s + 4 + j high). Scales fp16 when
    every one is an fp16 value (a checkpoint's), else fp32."""
    n, k = qweight.shape[0], qweight.shape[1] * 2
    if group_size % 8 or k % group_size:
        raise ValueError(f"int4 packing needs a group size that is a multiple of 8 and divides K={k}, got {group_size}")
    tiles = -(-n // PACK_WIDTH)
    u = torch.full((tiles * PACK_WIDTH, k), 8, dtype=torch.uint8)
    u[:n] = (unpack_int4(qweight).to(torch.int16) + 8).to(torch.uint8)
    u = u.view(tiles, PACK_WIDTH, k // 8, 2, 4)
    data = (u[:, :, :, 0] | (u[:, :, :, 1] << 4)).transpose(1, 2).contiguous()  # [T, K / 8, 64, 4]
    s32 = scales.float()
    half = bool(torch.equal(s32.half().float(), s32))
    s = torch.zeros(tiles * PACK_WIDTH, k // group_size, dtype=torch.float16 if half else torch.float32)
    s[:n] = s32.to(s.dtype)
    return QuantWeight(4, n, k, group_size, data, s.view(tiles, PACK_WIDTH, -1).transpose(1, 2).contiguous())


class NativeQuantMatmul:
    """The compiled kernel, loaded once per instance (the build is cached on disk). extra_flags: compiler
    flags after -march=native (tests build the narrower instruction sets' paths with them)."""

    def __init__(self, extra_flags: tuple[str, ...] = ()) -> None:
        lib = load_library(SOURCE, extra_flags)
        if lib.quant_pack_width() != PACK_WIDTH or lib.quant_int8_block() != INT8_ACT_BLOCK:
            raise RuntimeError("kernels/cpu/quant.h and quant_matmul.py disagree on the packed layout")
        self.isa: str = ISAS[lib.quant_isa()]
        self._fn = lib.quant_matmul_f32
        self._fn.argtypes = [_ptr, _ptr, _i64, _i64, _i64, _ptr, _i64, _i64, _ptr, _i64, _i64, _ptr, _i64, _i64]
        self._fn.restype = ctypes.c_int
        self._rows = lib.quant_rows_f32
        self._rows.argtypes = [_ptr, _i64, _i64, _i64, _i64, _ptr, _ptr, _ptr]
        self._rows.restype = ctypes.c_int

    @staticmethod
    def supports(x: torch.Tensor) -> bool:
        """x [M, K] fp32 CPU rows with a dense last dimension, M >= 1."""
        return x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1 and x.shape[0] >= 1

    def __call__(self, x: torch.Tensor, weight: QuantWeight, bias: torch.Tensor | None = None,
                 out: torch.Tensor | None = None, checked: bool = False) -> torch.Tensor:  # fmt: skip
        """x [M, K] (supports(x)) times the packed weight -> fp32 [M, N] (+ bias fp32 [N], contiguous), into
        out (contiguous fp32 [M, N]) when given. Raises ValueError for tensors it does not take; checked:
        the caller has checked them (a Linear that checks x's layout itself and its bias once)."""
        if not checked:
            if not self.supports(x) or x.shape[1] != weight.k:
                raise ValueError(f"the quantized matmul takes fp32 CPU rows [M, {weight.k}] with a dense last dim, "
                                 f"got {x.dtype} {tuple(x.shape)} on {x.device}")  # fmt: skip
            if bias is not None and not (bias.dtype == torch.float32 and bias.is_contiguous()
                                         and bias.shape == (weight.n,)):  # fmt: skip
                raise ValueError(f"bias must be a contiguous fp32 tensor of shape ({weight.n},)")
        rows = x.shape[0]
        if out is None:
            out = torch.empty(rows, weight.n, dtype=torch.float32)
        status = self._fn(*weight.args, None if bias is None else bias.data_ptr(), weight.n, weight.k, x.data_ptr(),
                          x.stride(0), rows, out.data_ptr(), out.stride(0), torch.get_num_threads())  # fmt: skip
        if status == -2:
            raise MemoryError("quant_matmul_f32 could not allocate the quantized rows")
        if status:
            raise ValueError(f"quant_matmul_f32 refused {weight.bits}-bit weights of group {weight.group} for K={weight.k}")
        return out

    def quantize_rows(self, x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The kernel's activation quantization of x [M, K] (supports(x)): (q int8 [M, K], scales fp32
        [M, nb], sums int32 [M, nb]) per block of `block` k, nb = ceil(K / block)."""
        if not self.supports(x):
            raise ValueError("quantize_rows takes fp32 CPU rows [M, K] with a dense last dim")
        rows, k = x.shape
        nb = -(-k // block)
        q = torch.empty(rows, k, dtype=torch.int8)
        scale = torch.empty(rows, nb, dtype=torch.float32)
        total = torch.empty(rows, nb, dtype=torch.int32)
        if self._rows(x.data_ptr(), x.stride(0), rows, k, block, q.data_ptr(), scale.data_ptr(), total.data_ptr()):
            raise MemoryError("quant_rows_f32 could not allocate its buffer")
        return q, scale, total
