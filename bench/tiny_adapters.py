"""PEFT LoRA adapters of the tiny checkpoints (bench/tiny_checkpoints.py), made by peft itself.

The engine's LoRA tests compare freight's tokens against transformers + peft on these adapters, and
bench/lora_mix.py times them: both make them here. peft initializes B to zero (an adapter that
changes nothing), so the factors are drawn at random (seeded) at a scale that changes greedy tokens.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@torch.no_grad()
def make_adapter(base: torch.nn.Module, path: Path, rank: int = 8, alpha: float = 16.0,
                 targets: tuple[str, ...] | str = PROJECTIONS, seed: int = 0, scale: float = 0.15,
                 **options: object) -> Path:  # fmt: skip
    """A LoRA adapter of the transformers model `base` (left untouched) saved at `path` by
    PeftModel.save_pretrained: factors ~ N(0, scale^2) from `seed`; `options`: more LoraConfig fields
    (use_rslora, rank_pattern, alpha_pattern, layers_to_transform, ...)."""
    import peft

    model = peft.get_peft_model(copy.deepcopy(base),
                                peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, **options))  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters()):
        if "lora_" in name:
            param.copy_(torch.randn(param.shape, generator=g) * scale)
    model.save_pretrained(path)
    return path


def peft_model(base: torch.nn.Module, adapter: Path, merged: bool = False) -> torch.nn.Module:
    """transformers + peft over a copy of `base` with the adapter at `adapter` (fp32, eval): the
    unmerged PeftModel, or with `merged` its merge_and_unload() (W + scaling * B A in the weights)."""
    import peft

    model = peft.PeftModel.from_pretrained(copy.deepcopy(base), str(adapter)).eval()
    return model.merge_and_unload().eval() if merged else model
