"""Mixture-of-experts MLP: top-k routing and the experts' SwiGLU over tokens grouped by expert.

Layouts (docs/ARCHITECTURE.md, "Kernel contract"):
- w13 [E, 2 * I, H]: expert e's gate rows [0, I) then up rows [I, 2I) (transformers' stacked
  `gate_up_proj`); w2 [E, H, I] (`down_proj`).
- topk_weights fp32 [T, K], topk_ids int [T, K]: token t goes to experts topk_ids[t] with those
  weights (select_experts).
fused_moe(x, w13, w2, topk_weights, topk_ids) = sum_j topk_weights[t, j] *
    w2[e] @ (silu(gate_e(x[t])) * up_e(x[t])), e = topk_ids[t, j].
Options (gpt-oss's experts, transformers' GptOssExperts):
- b13 [E, 2I] (gate, then up) and b2 [E, H]: expert biases, added to each projection's output
  before the activation / before the routing weight: the weight scales the whole expert output,
  sum_j w_j * (w2[e] @ act + b2[e]), b2 included;
- swiglu_limit / swiglu_alpha: the clamped SwiGLU instead of silu(gate) * up
  (activation.clamped_swiglu: (clamp(up, -l, l) + 1) * g * sigmoid(alpha * g), g = clamp(gate, max=l));
  swiglu_limit None: plain SwiGLU.

The reference is also the CPU fast path: the T * K (token, expert) pairs are sorted by expert
(stable), each expert runs one matmul over its gathered rows, its SwiGLU, and one down matmul;
a weighted index_add folds the rows back into tokens. Python loops over experts (E iterations,
empty experts skipped), never over tokens. The sum over a token's experts runs in ascending expert
order, as transformers' MoE blocks add them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from kernels.reference.activation import clamped_swiglu
from kernels.reference.activation import silu_mul as _silu_mul


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (topk_weights fp32 [T, K], topk_ids int64 [T, K]): softmax over the
    experts in fp32, the K largest probabilities (descending), divided by their sum if `renormalize`
    (Mixtral; Qwen MoEs with norm_topk_prob)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def select_experts_topk_softmax(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss's routing: router_logits [T, E] -> the K largest logits' ids (descending) and the
    softmax over those K logits only, fp32 [T, K] (always summing to 1)."""
    values, ids = torch.topk(router_logits.float(), top_k, dim=-1)
    return torch.softmax(values, dim=-1), ids


def expert_order(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, list[int]]:
    """(order int64 [T * K]: the flat (token, slot) pair indices sorted by expert, stable; rows per
    expert [E]). Pair p is token p // K."""
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    return order, counts


def grouped_moe(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    expert_mlp: Callable[[int, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """fused_moe with each expert's MLP given as expert_mlp(e, rows [n, H]) -> [n, H] (called once per
    expert that got tokens, on all of its rows): a backend's fused SiLU * up kernel, or quantized
    expert projections, plug in here."""
    tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    out = torch.zeros_like(x)
    if tokens == 0:
        return out
    order, counts = expert_order(topk_ids, num_experts)
    token_of = order // top_k  # [T * K] token row of each sorted pair
    xs = x.index_select(0, token_of)  # [T * K, H] tokens gathered in expert order
    ys = x.new_empty((tokens * top_k, hidden))
    start = 0
    for e, n in enumerate(counts):
        if n:
            ys[start : start + n] = expert_mlp(e, xs[start : start + n])
            start += n
    ys.mul_(topk_weights.reshape(-1).index_select(0, order).unsqueeze(1).to(ys.dtype))
    return out.index_add_(0, token_of, ys)


def _linear(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.mm(rows, weight.t())


def swiglu_experts(
    w13: torch.Tensor,
    w2: torch.Tensor,
    silu_mul: Callable[[torch.Tensor], torch.Tensor] = _silu_mul,
    linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = _linear,
) -> Callable[[int, torch.Tensor], torch.Tensor]:
    """expert_mlp for stacked weights: rows -> w2[e] @ silu_mul(w13[e] @ rows), two matmuls
    (`linear(rows [n, K], weight [N, K]) -> [n, N]`: a backend's GEMV for a few rows plugs in here)."""

    def mlp(e: int, rows: torch.Tensor) -> torch.Tensor:
        return linear(silu_mul(linear(rows, w13[e])), w2[e])

    return mlp


def biased_experts(
    w13: torch.Tensor,
    b13: torch.Tensor,
    w2: torch.Tensor,
    b2: torch.Tensor,
    activation: Callable[[torch.Tensor], torch.Tensor],
    linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = _linear,
) -> Callable[[int, torch.Tensor], torch.Tensor]:
    """expert_mlp for stacked weights with biases (b13 [E, 2I], b2 [E, H]; gpt-oss): rows ->
    w2[e] @ activation(w13[e] @ rows + b13[e]) + b2[e]."""

    def mlp(e: int, rows: torch.Tensor) -> torch.Tensor:
        return linear(activation(linear(rows, w13[e]) + b13[e]), w2[e]) + b2[e]

    return mlp


def moe_activation(
    swiglu_limit: float | None, swiglu_alpha: float | None,
    silu_mul: Callable[[torch.Tensor], torch.Tensor] = _silu_mul,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The experts' activation on gate_up [n, 2I]: `silu_mul` when swiglu_limit is None, else the
    clamped SwiGLU with these parameters (gpt-oss's config swiglu_limit, swiglu_alpha)."""
    if swiglu_limit is None:
        return silu_mul
    if swiglu_alpha is None:
        raise ValueError("the clamped SwiGLU needs swiglu_alpha with swiglu_limit")
    return partial(clamped_swiglu, alpha=float(swiglu_alpha), limit=float(swiglu_limit))


def expert_mlp(
    w13: torch.Tensor, w2: torch.Tensor, b13: torch.Tensor | None, b2: torch.Tensor | None,
    swiglu_limit: float | None, swiglu_alpha: float | None,
    silu_mul: Callable[[torch.Tensor], torch.Tensor] = _silu_mul,
    linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = _linear,
) -> Callable[[int, torch.Tensor], torch.Tensor]:
    """grouped_moe's expert_mlp for fused_moe's arguments: swiglu_experts without options, else
    biased_experts (missing biases as zeros) with moe_activation's activation."""
    if b13 is None and b2 is None and swiglu_limit is None:
        return swiglu_experts(w13, w2, silu_mul, linear)
    num_experts, two_i, hidden = w13.shape
    b13 = w13.new_zeros((num_experts, two_i)) if b13 is None else b13
    b2 = w2.new_zeros((num_experts, hidden)) if b2 is None else b2
    return biased_experts(w13, b13, w2, b2, moe_activation(swiglu_limit, swiglu_alpha, silu_mul), linear)


def fused_moe(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
    b13: torch.Tensor | None = None, b2: torch.Tensor | None = None,
    swiglu_limit: float | None = None, swiglu_alpha: float | None = None,
) -> torch.Tensor:  # fmt: skip
    """x [T, H] -> [T, H] (see the module docstring)."""
    mlp = expert_mlp(w13, w2, b13, b2, swiglu_limit, swiglu_alpha)
    return grouped_moe(x, topk_weights, topk_ids, w13.shape[0], mlp)
