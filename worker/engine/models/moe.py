"""The sparse mixture-of-experts MLP of Mixtral, Qwen2-MoE, Qwen3-MoE and gpt-oss.

Parameter names follow transformers' in-memory modules (`mlp.gate.weight`, `mlp.experts.gate_up_proj`
[E, 2I, H], `mlp.experts.down_proj` [E, H, I], `mlp.shared_expert.*`, `mlp.shared_expert_gate.weight`);
checkpoints store one tensor per expert (`experts.3.w1.weight`, `experts.3.gate_proj.weight`), which
the loader stacks at load (models/expert_weights.py). The router and the shared-expert gate hold bare
weights, not nn.Linear: quantization (worker.engine.quant swaps nn.Linear modules) must leave the
routing in full precision; the experts are quantized per expert by Experts.quantize.

The block is entered through `.forward` from DecoderLayer (see decoder.py's note on hooks); the
stacked experts run through Backend.fused_moe (the grouped torch path on the CPU, a Triton kernel on
CUDA), gpt-oss's included: its expert biases (b13, b2) and clamped SwiGLU (swiglu_limit,
swiglu_alpha from MoeConfig) are fused_moe options, added / fused in the Triton kernel's epilogues.
Quantized experts run grouped_moe over their per-expert modules (one matmul per expert and
projection over its gathered rows). gpt-oss's router has a bias (`mlp.router.*` in checkpoints,
`mlp.gate.*` here) and routes top-k first, softmax over the k after.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from kernels.reference.fused_moe import grouped_moe, moe_activation, select_experts_topk_softmax
from worker.engine.backends.base import Backend
from worker.engine.models.model_config import ModelConfig


class RouterWeight(nn.Module):
    """A bare [out, hidden] weight applied as x @ weight.T (the router, the shared-expert gate)."""

    def __init__(self, out_features: int, hidden: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, hidden))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None


class Experts(nn.Module):
    """E routed SwiGLU experts, stacked: one tensor per projection for all experts.

    Quantized on the fly (worker.engine.quant.quantize_model), the stacked tensors give way to one
    quantized module per expert and projection (`quantized`: gate_up_0, down_0, gate_up_1, ...), the
    same Int8Linear / Int4Linear / Fp8Linear a dense projection gets; the experts then still run one
    matmul per expert over its gathered rows (models/moe.py's grouped path, not the fused kernel)."""

    def __init__(self, num_experts: int, hidden: int, expert_size: int, biases: bool = False) -> None:
        """biases: gpt-oss's per-expert `gate_up_proj_bias` [E, 2I] (gate, then up) and `down_proj_bias` [E, H]."""
        super().__init__()
        self.num_experts = num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * expert_size, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, expert_size))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, 2 * expert_size)) if biases else None
        self.down_proj_bias = nn.Parameter(torch.empty(num_experts, hidden)) if biases else None
        self.quantized: nn.ModuleList | None = None

    def expert_linears(self) -> list[tuple[str, nn.Linear]]:
        """(name, nn.Linear over one expert's slice) for each expert's gate_up and down projections,
        in the order of `quantized` (sharing the stacked tensors' memory; meta tensors on the meta model)."""
        out = []
        for e in range(self.num_experts):
            for name, stacked, bias in (("gate_up_proj", self.gate_up_proj, self.gate_up_proj_bias),
                                        ("down_proj", self.down_proj, self.down_proj_bias)):  # fmt: skip
                w = stacked[e]
                linear = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None, device="meta")
                linear.weight = nn.Parameter(w.detach(), requires_grad=False)
                if bias is not None:
                    linear.bias = nn.Parameter(bias[e].detach(), requires_grad=False)
                out.append((f"{e}.{name}", linear))
        return out

    def quantize(self, make: Callable[[nn.Linear], nn.Module]) -> None:
        """Replace the stacked weights by make(linear) of each expert_linears() entry."""
        self.quantized = nn.ModuleList(make(linear) for _, linear in self.expert_linears())
        self.gate_up_proj = None
        self.down_proj = None
        self.gate_up_proj_bias = None  # now in the quantized modules
        self.down_proj_bias = None

    def quantized_mlp(self, activation: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[int, torch.Tensor], torch.Tensor]:
        """grouped_moe's expert_mlp over the quantized modules (activation: SiLU * up, or the clamped one)."""
        mods = self.quantized
        assert mods is not None  # invariant: called after quantize()

        def mlp(e: int, rows: torch.Tensor) -> torch.Tensor:
            return mods[2 * e + 1](activation(mods[2 * e](rows)))

        return mlp


class SparseMoeBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: Backend, shared_expert: nn.Module | None) -> None:
        """shared_expert: Qwen2-MoE's always-on dense MLP (decoder.MLP), gated by a sigmoid; or None."""
        super().__init__()
        moe = cfg.moe
        assert moe is not None  # invariant: DecoderLayer builds this block only for MoE configs
        self.backend = backend
        self.top_k = moe.top_k
        self.renormalize = moe.norm_topk_prob
        self.topk_then_softmax = moe.topk_then_softmax
        self.gate = RouterWeight(moe.num_experts, cfg.hidden_size, bias=moe.biases)
        self.experts = Experts(moe.num_experts, cfg.hidden_size, moe.expert_size, biases=moe.biases)
        self.swiglu_limit, self.swiglu_alpha = moe.swiglu_limit, moe.swiglu_alpha  # None: plain SwiGLU
        # the quantized experts' activation (the stacked ones pass the options to backend.fused_moe)
        self.activation = moe_activation(moe.swiglu_limit, moe.swiglu_alpha, backend.silu_mul)
        if shared_expert is not None:
            self.shared_expert = shared_expert
            self.shared_expert_gate = RouterWeight(1, cfg.hidden_size)
        else:
            self.shared_expert = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (topk_weights fp32 [T, K], topk_ids int64 [T, K])."""
        logits = F.linear(x, self.gate.weight, self.gate.bias)  # [T, E]
        if self.topk_then_softmax:
            return select_experts_topk_softmax(logits, self.top_k)
        return self.backend.select_experts(logits, self.top_k, self.renormalize)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[T, hidden] -> [T, hidden]."""
        weights, ids = self.route(x)
        experts = self.experts
        if experts.quantized is not None:
            out = grouped_moe(x, weights, ids, experts.num_experts, experts.quantized_mlp(self.activation))
        elif experts.gate_up_proj_bias is None and self.swiglu_limit is None:
            out = self.backend.fused_moe(x, experts.gate_up_proj, experts.down_proj, weights, ids)
        else:
            out = self.backend.fused_moe(x, experts.gate_up_proj, experts.down_proj, weights, ids,
                                         b13=experts.gate_up_proj_bias, b2=experts.down_proj_bias,
                                         swiglu_limit=self.swiglu_limit, swiglu_alpha=self.swiglu_alpha)  # fmt: skip
        if self.shared_expert is not None:
            shared = self.shared_expert.forward(x)
            out = out + torch.sigmoid(F.linear(x, self.shared_expert_gate.weight)) * shared
        return out
