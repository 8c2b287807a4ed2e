"""The sparse mixture-of-experts MLP of Mixtral, Qwen2-MoE and Qwen3-MoE.

Parameter names follow transformers' in-memory modules (`mlp.gate.weight`, `mlp.experts.gate_up_proj`
[E, 2I, H], `mlp.experts.down_proj` [E, H, I], `mlp.shared_expert.*`, `mlp.shared_expert_gate.weight`);
checkpoints store one tensor per expert (`experts.3.w1.weight`, `experts.3.gate_proj.weight`), which
the loader stacks at load (models/expert_weights.py). The router and the shared-expert gate hold bare
weights, not nn.Linear: quantization (worker.engine.quant swaps nn.Linear modules) must leave the
routing in full precision, and the stacked experts are not nn.Linear either, so they stay in the
model's dtype (see docs/ARCHITECTURE.md, "Mixture of experts").

The block is entered through `.forward` from DecoderLayer (see decoder.py's note on hooks); the
experts run through Backend.fused_moe (the grouped torch path on the CPU, a Triton kernel on CUDA).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from worker.engine.backends.base import Backend
from worker.engine.models.model_config import ModelConfig


class RouterWeight(nn.Module):
    """A bare [out, hidden] weight applied as x @ weight.T (the router, the shared-expert gate)."""

    def __init__(self, out_features: int, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, hidden))


class Experts(nn.Module):
    """E routed SwiGLU experts, stacked: one tensor per projection for all experts."""

    def __init__(self, num_experts: int, hidden: int, expert_size: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * expert_size, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, expert_size))


class SparseMoeBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: Backend, shared_expert: nn.Module | None) -> None:
        """shared_expert: Qwen2-MoE's always-on dense MLP (decoder.MLP), gated by a sigmoid; or None."""
        super().__init__()
        moe = cfg.moe
        assert moe is not None  # invariant: DecoderLayer builds this block only for MoE configs
        self.backend = backend
        self.top_k = moe.top_k
        self.renormalize = moe.norm_topk_prob
        self.gate = RouterWeight(moe.num_experts, cfg.hidden_size)
        self.experts = Experts(moe.num_experts, cfg.hidden_size, moe.expert_size)
        if shared_expert is not None:
            self.shared_expert = shared_expert
            self.shared_expert_gate = RouterWeight(1, cfg.hidden_size)
        else:
            self.shared_expert = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (topk_weights fp32 [T, K], topk_ids int64 [T, K])."""
        logits = F.linear(x, self.gate.weight)  # [T, E]
        return self.backend.select_experts(logits, self.top_k, self.renormalize)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[T, hidden] -> [T, hidden]."""
        weights, ids = self.route(x)
        out = self.backend.fused_moe(x, self.experts.gate_up_proj, self.experts.down_proj, weights, ids)
        if self.shared_expert is not None:
            shared = self.shared_expert.forward(x)
            out = out + torch.sigmoid(F.linear(x, self.shared_expert_gate.weight)) * shared
        return out
