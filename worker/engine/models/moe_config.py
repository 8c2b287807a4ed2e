"""MoeConfig: the mixture-of-experts facts of a Mixtral / Qwen2-MoE / Qwen3-MoE / gpt-oss config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts.checkpoint.architectures import moe_keys


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    top_k: int  # experts per token (num_experts_per_tok)
    expert_size: int  # each routed expert's intermediate size
    # Routing is softmax over all experts, then top-k; norm_topk_prob renormalizes the k chosen
    # probabilities to sum to 1 (Mixtral always; Qwen MoEs when the config says so).
    norm_topk_prob: bool
    shared_expert_size: int  # 0: no shared expert (Qwen2-MoE has one, gated by a sigmoid)
    sparse_step: int  # layer i is sparse iff (i + 1) % sparse_step == 0 and i not in dense_layers
    dense_layers: tuple[int, ...]  # mlp_only_layers: dense MLP of intermediate_size
    # gpt-oss: top-k of the router logits first, softmax over the k (norm_topk_prob unused); router
    # and experts carry biases; the experts' SwiGLU is clamped: (clamp(up, -l, l) + 1) * g * sigmoid(a * g),
    # g = clamp(gate, max=l). None: plain SwiGLU.
    topk_then_softmax: bool = False
    biases: bool = False
    swiglu_limit: float | None = None
    swiglu_alpha: float | None = None

    def is_sparse(self, layer: int) -> bool:
        return layer not in self.dense_layers and (layer + 1) % self.sparse_step == 0

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> MoeConfig:
        """From a config.json that architectures.moe_problem accepted."""
        keys = moe_keys(cfg)
        return cls(
            num_experts=int(keys["num_experts"]),
            top_k=int(keys["top_k"]),
            expert_size=int(keys["expert_size"]),
            norm_topk_prob=bool(keys["norm_topk_prob"]),
            shared_expert_size=int(keys["shared_expert_size"]),
            sparse_step=int(keys["sparse_step"]),
            dense_layers=tuple(int(i) for i in keys["dense_layers"]),
            topk_then_softmax=bool(keys["topk_then_softmax"]),
            biases=bool(keys["biases"]),
            swiglu_limit=keys["swiglu_limit"],
            swiglu_alpha=keys["swiglu_alpha"],
        )
