"""LoraLinear: a projection (nn.Linear or a quantized one) plus the batched LoRA product of the
adapters its step's tokens use: y = base(x), then for each token t of slot s >= 0 and each slice i,
y[t, slice i] += scaling[s, i] * B_i A_i x[t] (kernels/reference/lora.py). One base product for the
whole batch; the adapters' low-rank products run per adapter segment (the backend's lora_shrink /
lora_expand). The model code is untouched: the manager swaps these in where the Linears are, as
quantization swaps its modules.
"""

from __future__ import annotations

import torch
from torch import nn

from worker.engine.backends.base import Backend
from worker.engine.lora.stacks import ModuleStack
from worker.engine.lora.step import LoraStep


class LoraLinear(nn.Module):
    def __init__(self, base: nn.Module, stack: ModuleStack, step: LoraStep, backend: Backend) -> None:
        super().__init__()
        self.base = base
        self.stack = stack
        self.step = step
        self.backend = backend
        self.in_features, self.out_features = int(base.in_features), int(base.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, out]."""
        y = self.backend.project(self.base, x)
        step = self.step
        if step.active:
            slots, plan = step.for_rows(x.shape[0])
            st = self.stack
            h = self.backend.lora_shrink(x, st.a, slots, plan)  # fp32 [T, L * R]
            self.backend.lora_expand(h, st.b, st.scaling, slots, st.bounds, y, plan)
        return y
