"""LoraStacks: the device tensors holding the resident adapters' factors, one stack per wrapped
projection, in kernels/reference/lora.py's layout.

The engine fuses q/k/v into qkv_proj and gate/up into gate_up_proj (models/decoder.py), so a stack
holds the slices of one fused projection: a [S, L * R, in] (slice i's A in rows [i R, i R + r)),
b [S, out, R] (slice i's B in its output columns), scaling fp32 [S, L]; S = max_loras slots, R the
largest rank among the adapters registered. Ranks below R and slices an adapter does not wrap are
zeros (and scaling 0): they add exactly nothing. A slot is written whole when an adapter is swapped
in (`write`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from worker.engine.lora.adapter import LoraAdapter
from worker.engine.models.decoder import FUSED_PROJECTIONS


def engine_target(hf_module: str) -> tuple[str, int]:
    """model.layers.3.self_attn.k_proj -> (model.layers.3.self_attn.qkv_proj, 1); a projection the
    engine keeps apart is its own target: model.layers.3.mlp.down_proj -> (the same, 0)."""
    parent, _, projection = hf_module.rpartition(".")
    module, index = FUSED_PROJECTIONS.get(projection, (projection, 0))
    return f"{parent}.{module}", index


@dataclass
class ModuleStack:
    a: torch.Tensor  # [S, L * R, in]
    b: torch.Tensor  # [S, out, R]
    scaling: torch.Tensor  # fp32 [S, L]
    bounds: tuple[int, ...]  # L + 1 output-column offsets of the slices


def slice_bounds(model: nn.Module, target: str, out_features: int) -> tuple[int, ...]:
    """Output-column offsets of a fused projection's slices (q | k | v, gate | up), or (0, out)."""
    cfg = model.cfg  # type: ignore[attr-defined]
    if target.endswith("qkv_proj"):
        return (0, cfg.q_size, cfg.q_size + cfg.kv_size, cfg.q_size + 2 * cfg.kv_size)
    if target.endswith("gate_up_proj"):
        return (0, out_features // 2, out_features)
    return (0, out_features)


class LoraStacks:
    def __init__(self, model: nn.Module, targets: list[str], num_slots: int, rank: int, dtype: torch.dtype,
                 device: torch.device) -> None:  # fmt: skip
        """targets: the engine module names (e.g. model.layers.0.self_attn.qkv_proj) to hold stacks for."""
        self.num_slots = num_slots
        self.rank = rank
        self.stacks: dict[str, ModuleStack] = {}
        for target in targets:
            base = model.get_submodule(target)
            n_in, n_out = int(base.in_features), int(base.out_features)
            bounds = slice_bounds(model, target, n_out)
            slices = len(bounds) - 1
            self.stacks[target] = ModuleStack(
                a=torch.zeros((num_slots, slices * rank, n_in), dtype=dtype, device=device),
                b=torch.zeros((num_slots, n_out, rank), dtype=dtype, device=device),
                scaling=torch.zeros((num_slots, slices), dtype=torch.float32, device=device),
                bounds=bounds,
            )

    @property
    def nbytes(self) -> int:
        return sum(s.a.nbytes + s.b.nbytes + s.scaling.nbytes for s in self.stacks.values())

    def write(self, slot: int, adapter: LoraAdapter) -> None:
        """Put `adapter`'s factors in `slot` of every stack (zeros where it wraps nothing)."""
        for st in self.stacks.values():
            st.a[slot].zero_()
            st.b[slot].zero_()
            st.scaling[slot].zero_()
        for module in adapter.layout.modules:
            target, i = engine_target(module.name)
            st = self.stacks[target]
            a, b = adapter.factors[module.name]
            r, lo, hi = module.rank, st.bounds[i], st.bounds[i + 1]
            st.a[slot, i * self.rank : i * self.rank + r].copy_(a, non_blocking=True)
            st.b[slot, lo:hi, :r].copy_(b, non_blocking=True)
            st.scaling[slot, i] = module.scaling
