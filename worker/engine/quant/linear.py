"""Weight-only quantized replacements for nn.Linear, with freight's int8 / int4 layouts.

State-dict names are `qweight`, `scales` (and `bias` when the Linear had one), so a module swapped in
at `<name>` loads `<name>.qweight` / `<name>.scales` straight from a freight checkpoint. They are
frozen nn.Parameters (requires_grad False), found by get_parameter / named_parameters like weights.

Execution (x [..., K] -> [..., N] in x's dtype):
- CUDA: the Triton kernels (kernels/triton/quant_matmul.py).
- CPU (`cpu_path`):
  - "kernel" (the default): the integer kernels of kernels/cpu/quant.h. Each row of x is quantized
    to int8 per block (128 k for int8 weights, the group for int4), the products are integer dot
    products (AVX-512 VNNI / AVX-VNNI vpdpbusd, AVX2 vpmaddubsw), the scales are applied per block
    in fp32. The weight is packed once into the kernel's tiles (`cpu_weight`: the quantized bytes
    once more, kept beside the parameters, not in the state dict, repacked when qweight or scales
    change); the CPU backend's decode stack multiplies with the same packed copy.
  - "dynamic": the same math in torch (kernels/reference/quant_matmul.py int8_dynamic_matmul /
    int4_dynamic_matmul, in float64): the reference the kernel path is tested against.
  - "weight_only": dequantize, one fp32 matmul: the quantized weights' exact product.
  Tensors the kernel does not take (integer x) and machines where it does not build run
  "weight_only".
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import structlog
import torch
from torch import nn

from kernels.reference import quant_matmul as reference
from worker.engine.quant.formats import check_group_size, quantize_int4, quantize_int8

if TYPE_CHECKING:
    from kernels.cpu.quant_matmul import NativeQuantMatmul, QuantWeight

log = structlog.get_logger(__name__)
CPU_PATHS = ("kernel", "dynamic", "weight_only")


def frozen_parameter(t: torch.Tensor) -> nn.Parameter:
    """Parameters (not buffers) so loaders that look weights up with get_parameter find them."""
    return nn.Parameter(t, requires_grad=False)


def _version(t: torch.Tensor) -> int:
    """In-place write counter; inference tensors (made under torch.inference_mode) have none."""
    return 0 if t.is_inference() else t._version


def _triton():
    from kernels.triton import quant_matmul

    return quant_matmul


@functools.cache
def native_quant_matmul() -> NativeQuantMatmul | None:
    """The CPU integer kernel, compiled once per process (cached on disk), or None where it cannot
    be built (no C compiler): the modules then run the weight-only reference, said once in the log."""
    from kernels.cpu.build import KernelBuildError
    from kernels.cpu.quant_matmul import NativeQuantMatmul

    try:
        return NativeQuantMatmul()
    except KernelBuildError as exc:
        log.warning("quant_kernel_unavailable", reason=str(exc)[:500],
                    detail="quantized Linears on the CPU run the dequantize-and-matmul reference")  # fmt: skip
        return None


class QuantLinear(nn.Module):
    """What Int8Linear and Int4Linear share: the forward dispatch (module docstring) and the packed
    copy the CPU kernels read. Subclasses define the format's parameters and its four products."""

    in_features: int
    out_features: int
    qweight: nn.Parameter
    scales: nn.Parameter
    bias: nn.Parameter | None

    def __init__(self) -> None:
        super().__init__()
        self.cpu_path = "kernel"  # see the module docstring; tests and benches switch it
        self._cpu_pack: tuple[tuple, QuantWeight, torch.Tensor | None] | None = None

    def cpu_weight(self) -> tuple[QuantWeight, torch.Tensor | None]:
        """(the weight packed for kernels/cpu/quant.h, the bias in fp32 or None), made on first use
        and again after qweight, scales or bias change (a loader writing in place)."""
        parts = (self.qweight, self.scales) + (() if self.bias is None else (self.bias,))
        key = tuple((p.data_ptr(), _version(p)) for p in parts)
        if self._cpu_pack is None or self._cpu_pack[0] != key:
            bias = None if self.bias is None else self.bias.detach().float().contiguous()
            with torch.no_grad():
                self._cpu_pack = (key, self._pack(), bias)
        return self._cpu_pack[1], self._cpu_pack[2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        floating = x2.dtype.is_floating_point
        if not x2.is_cuda and floating and x2.shape[0] and self.cpu_path == "kernel" and (native := native_quant_matmul()):
            weight, bias = self.cpu_weight()
            xf = x2.float()  # fp32 rows with a dense last dim (x2 is 2-D): what the kernel takes
            y = native(xf if xf.stride(-1) == 1 else xf.contiguous(), weight, bias, checked=True)
            y = y if x2.dtype == torch.float32 else y.to(x2.dtype)
        elif not x2.is_cuda and floating and self.cpu_path == "dynamic":
            bias = None if self.bias is None else self.bias.float()
            y = self._dynamic(x2.float(), bias).to(x2.dtype)
        else:
            y = self._cuda(x2.contiguous()) if x2.is_cuda else self._weight_only(x2)
            if self.bias is not None:
                y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def _load(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        """Copy a quantized weight, its scales and the float bias (None: the module has none) in."""
        self.qweight.copy_(qweight)
        self.scales.copy_(scales)
        if bias is not None:
            self.bias.data.copy_(bias.detach())

    def _pack(self) -> QuantWeight:
        raise NotImplementedError

    def _cuda(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _dynamic(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def _weight_only(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class Int8Linear(QuantLinear):
    """y = x @ (qweight * scales[:, None]).T + bias; qweight int8 [N, K], scales [N]."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.qweight = frozen_parameter(
            torch.zeros(out_features, in_features, dtype=torch.int8, device=device)
        )
        self.scales = frozen_parameter(torch.ones(out_features, dtype=dtype, device=device))
        self.bias = frozen_parameter(torch.zeros(out_features, dtype=dtype, device=device)) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        w = linear.weight.detach()
        mod = cls(linear.in_features, linear.out_features, linear.bias is not None, w.dtype, w.device)
        mod._load(*quantize_int8(w), linear.bias)
        return mod

    def _pack(self) -> QuantWeight:
        from kernels.cpu.quant_matmul import pack_int8

        return pack_int8(self.qweight.detach().cpu(), self.scales.detach().cpu())

    def _cuda(self, x: torch.Tensor) -> torch.Tensor:
        return _triton().int8_matmul(x, self.qweight, self.scales)

    def _dynamic(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return reference.int8_dynamic_matmul(x, self.qweight, self.scales, bias)

    def _weight_only(self, x: torch.Tensor) -> torch.Tensor:
        return reference.int8_matmul(x, self.qweight, self.scales)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per channel"


class Int4Linear(QuantLinear):
    """y = x @ dequant(qweight uint8 [N, K // 2], scales [N, K // G]).T + bias (symmetric int4)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        group_size: int = 128,
        bias: bool = False,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        check_group_size(in_features, group_size)
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.qweight = frozen_parameter(
            torch.full((out_features, in_features // 2), 0x88, dtype=torch.uint8, device=device)
        )
        self.scales = frozen_parameter(
            torch.ones(out_features, in_features // group_size, dtype=dtype, device=device)
        )
        self.bias = frozen_parameter(torch.zeros(out_features, dtype=dtype, device=device)) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 128) -> Int4Linear:
        w = linear.weight.detach()
        mod = cls(
            linear.in_features, linear.out_features, group_size, linear.bias is not None, w.dtype, w.device
        )
        mod._load(*quantize_int4(w, group_size), linear.bias)
        return mod

    def _pack(self) -> QuantWeight:
        from kernels.cpu.quant_matmul import pack_int4

        return pack_int4(self.qweight.detach().cpu(), self.scales.detach().cpu(), self.group_size)

    def _cuda(self, x: torch.Tensor) -> torch.Tensor:
        return _triton().int4_matmul(x, self.qweight, self.scales, self.group_size)

    def _dynamic(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return reference.int4_dynamic_matmul(x, self.qweight, self.scales, self.group_size, bias)

    def _weight_only(self, x: torch.Tensor) -> torch.Tensor:
        return reference.int4_matmul(x, self.qweight, self.scales, self.group_size)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"int4 group_size={self.group_size}"
        )
