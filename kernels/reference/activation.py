"""SwiGLU's activation on the fused gate_up projection."""

import torch
import torch.nn.functional as F


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2 * I] (gate first, then up) -> silu(gate) * up [..., I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
