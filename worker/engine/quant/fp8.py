"""FP8 (e4m3) weights: a replacement for nn.Linear with per-output-channel weight scales and
dynamic per-token activation scales (W8A8-FP8, the format most H100/H200 deployments run).

State dict: `qweight` float8_e4m3fn [N, K], `scales` fp32 [N] (and `bias`), the kernel contract's
layout (docs/ARCHITECTURE.md). Execution (x [..., K] -> [..., N] in x's dtype):
- CUDA, compute capability >= 8.9: kernels/triton/fp8_matmul.py (x quantized per token in one
  Triton launch, then torch._scaled_mm on the e4m3 tensor cores).
- Other GPUs: refused when the model loads (`check_fp8_device`), with what to use instead.
- CPU: the exact torch reference (kernels/reference/fp8_matmul.py): every activation row rounded
  to e4m3 like on the GPU, multiplied by the weight's e4m3 values widened to fp32 once and kept
  beside the parameters (not in the state dict). The outputs are the fp8 model's; the speed and
  memory are the fp32 model's (plus the fp8 copy), since no CPU kernel multiplies float8
  (docs/PERFORMANCE.md, Quantization).
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.reference import fp8_matmul as reference
from kernels.reference.fp8_matmul import FP8_DTYPE

# the bit views that move a tensor between devices without ever changing its dtype
_BITS = {FP8_DTYPE: torch.uint8, torch.float32: torch.int32}


def check_fp8_device(device: torch.device) -> None:
    """Raise ValueError, before any weight is touched, when fp8 weights cannot run on `device`: a
    CUDA GPU older than compute capability 8.9. The CPU runs them through the reference."""
    if device.type != "cuda":
        return
    from kernels.checks import fp8_shortfall

    shortfall = fp8_shortfall(device)
    if shortfall is not None:
        raise ValueError(
            f"quantization 'fp8' needs an NVIDIA GPU of compute capability 8.9 or newer (L4, L40S, RTX 4090, "
            f"H100, H200, Blackwell) to multiply float8; {shortfall}: use --quantization int8 or int4 on it "
            "(or run fp8 on the CPU: exact, fp32 speed)"
        )


def check_fp8_shape(name: str, linear: nn.Linear, device: torch.device) -> None:
    """torch._scaled_mm (CUDA) multiplies only K and N that are multiples of 16."""
    if device.type == "cuda" and (linear.in_features % 16 or linear.out_features % 16):
        raise ValueError(
            f"quantization 'fp8' needs every quantized layer's input and output sizes to be multiples "
            f"of 16 on CUDA (torch._scaled_mm); {name} is {linear.out_features} x {linear.in_features}: "
            f"use int8 for this model"
        )


class Fp8Linear(nn.Module):
    """y = e4m3(x per token) @ (qweight * scales[:, None]).T + bias; qweight e4m3 [N, K], scales fp32 [N]."""

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
        self.qweight = nn.Parameter(
            torch.zeros(out_features, in_features, dtype=FP8_DTYPE, device=device), requires_grad=False
        )
        self.scales = nn.Parameter(torch.ones(out_features, dtype=torch.float32, device=device), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device), requires_grad=False) if bias else None
        self._cpu_weight: tuple[tuple, torch.Tensor] | None = None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Fp8Linear:
        w = linear.weight.detach()
        mod = cls(linear.in_features, linear.out_features, linear.bias is not None, w.dtype, w.device)
        q, s = reference.quantize_fp8_rows(w)
        mod.qweight.copy_(q)
        mod.scales.copy_(s)
        if linear.bias is not None:
            mod.bias.data.copy_(linear.bias.detach())
        return mod

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 (nn.Module's signature)
        """`model.to(dtype)` turns every floating-point parameter into the model's dtype; the e4m3
        weight and its fp32 scales must keep theirs (torch._scaled_mm takes nothing else). They
        travel as integer bit views, which device moves change and dtype casts leave alone."""
        kept = {}
        for name in ("qweight", "scales"):
            p = self._parameters.pop(name)
            moved = fn(p.data.view(_BITS[p.dtype])).view(p.dtype)
            kept[name] = nn.Parameter(moved, requires_grad=False)
        try:
            super()._apply(fn, recurse)
        finally:
            self._parameters.update(kept)
        self._cpu_weight = None
        return self

    def _cpu_values(self) -> torch.Tensor:
        """The weight's e4m3 values as fp32 [N, K] (unscaled), widened once and cached."""
        q = self.qweight
        key = (q.data_ptr(), 0 if q.is_inference() else q._version)
        if self._cpu_weight is None or self._cpu_weight[0] != key:
            self._cpu_weight = (key, q.float())
        return self._cpu_weight[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        if x2.is_cuda:
            from kernels.triton.fp8_matmul import fp8_matmul

            y = fp8_matmul(x2, self.qweight, self.scales)
        else:
            y = reference.fp8_matmul_dequantized(x2, self._cpu_values(), self.scales)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3 per channel"
