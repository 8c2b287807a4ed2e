"""Weight-only quantized replacements for nn.Linear, with freight's int8 / int4 layouts.

State-dict names are `qweight`, `scales` (and `bias` when the Linear had one), so a module swapped in
at `<name>` loads `<name>.qweight` / `<name>.scales` straight from a freight checkpoint. They are
frozen nn.Parameters (requires_grad False), found by get_parameter / named_parameters like weights.

Execution (x [..., K] -> [..., N] in x's dtype):
- CUDA: the Triton kernels (kernels/triton/quant_matmul.py).
- CPU int8: torch._weight_int8pack_mm (int8 weights read directly), scales applied after in fp32.
- CPU int4: torch._weight_int4pack_mm_for_cpu on a weight repacked once into its tiled layout (kept
  beside the parameters, not in the state dict, rebuilt when qweight/scales change).
  torch 2.13's CPU kernels are fast only for bf16 activations (4096x4096, one row, one thread:
  int8 1.0 ms and int4 0.9 ms in bf16 against 14 ms and 29 ms in fp32, fp32 dense 4.0 ms), so fp32
  and fp16 activations go through them in bf16 and come back in x's dtype (`cpu_bf16=True`).
- `cpu_bf16=False`, or anything else: the torch references (dequantize, one fp32 matmul): the exact
  path tests compare against.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.reference import quant_matmul as reference
from worker.engine.quant.formats import check_group_size, quantize_int4, quantize_int8, unpack_int4


def frozen_parameter(t: torch.Tensor) -> nn.Parameter:
    """Parameters (not buffers) so loaders that look weights up with get_parameter find them."""
    return nn.Parameter(t, requires_grad=False)


def _version(t: torch.Tensor) -> int:
    """In-place write counter; inference tensors (made under torch.inference_mode) have none."""
    return 0 if t.is_inference() else t._version


def _triton():
    from kernels.triton import quant_matmul

    return quant_matmul


class Int8Linear(nn.Module):
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
        self.cpu_bf16 = True  # CPU: run torch's packed kernel in bf16 (fast) rather than the reference
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
        q, s = quantize_int8(w)
        mod.qweight.copy_(q)
        mod.scales.copy_(s)
        if linear.bias is not None:
            mod.bias.data.copy_(linear.bias.detach())
        return mod

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        if x2.is_cuda:
            y = _triton().int8_matmul(x2.contiguous(), self.qweight, self.scales)
        elif self.cpu_bf16 and x2.dtype.is_floating_point:
            # unit scales: the real ones are applied below, in fp32
            y = torch._weight_int8pack_mm(x2.to(torch.bfloat16).contiguous(), self.qweight, self._unit_scales())
            y = (y.float() * self.scales.float()).to(x2.dtype)
        else:
            y = reference.int8_matmul(x2, self.qweight, self.scales)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def _unit_scales(self) -> torch.Tensor:
        """bf16 ones [N], made once (not on every call of every layer at every step)."""
        ones = getattr(self, "_ones_bf16", None)
        if ones is None:
            ones = self._ones_bf16 = torch.ones(self.out_features, dtype=torch.bfloat16)
        return ones

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per channel"


class Int4Linear(nn.Module):
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
        self.cpu_bf16 = True  # CPU: run torch's packed kernel in bf16 (fast) rather than the reference
        self.qweight = frozen_parameter(
            torch.full((out_features, in_features // 2), 0x88, dtype=torch.uint8, device=device)
        )
        self.scales = frozen_parameter(
            torch.ones(out_features, in_features // group_size, dtype=dtype, device=device)
        )
        self.bias = frozen_parameter(torch.zeros(out_features, dtype=dtype, device=device)) if bias else None
        self._cpu_pack: tuple[tuple, torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 128) -> Int4Linear:
        w = linear.weight.detach()
        mod = cls(
            linear.in_features, linear.out_features, group_size, linear.bias is not None, w.dtype, w.device
        )
        q, s = quantize_int4(w, group_size)
        mod.qweight.copy_(q)
        mod.scales.copy_(s)
        if linear.bias is not None:
            mod.bias.data.copy_(linear.bias.detach())
        return mod

    def _cpu_packed(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(tiled int4 weight, scale-and-zero [K // G, N, 2]) for torch's CPU int4 kernel, cached."""
        key = (self.qweight.data_ptr(), _version(self.qweight), self.scales.data_ptr(), _version(self.scales), dtype)
        if self._cpu_pack is None or self._cpu_pack[0] != key:
            biased = unpack_int4(self.qweight).to(torch.int32) + 8  # [N, K] in [0, 15]
            packed = torch._convert_weight_to_int4pack_for_cpu(biased, 1)
            # the kernel computes (u - 8) * scale + zero; symmetric int4 has zero = 0
            scale_zero = torch.stack([self.scales.T, torch.zeros_like(self.scales.T)], dim=-1)
            self._cpu_pack = (key, packed, scale_zero.to(dtype).contiguous())
        return self._cpu_pack[1], self._cpu_pack[2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        if x2.is_cuda:
            y = _triton().int4_matmul(x2.contiguous(), self.qweight, self.scales, self.group_size)
        elif self.cpu_bf16 and x2.dtype.is_floating_point:
            packed, scale_zero = self._cpu_packed(torch.bfloat16)
            y = torch._weight_int4pack_mm_for_cpu(
                x2.to(torch.bfloat16).contiguous(), packed, self.group_size, scale_zero
            ).to(x2.dtype)
        else:
            y = reference.int4_matmul(x2, self.qweight, self.scales, self.group_size)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"int4 group_size={self.group_size}"
        )
