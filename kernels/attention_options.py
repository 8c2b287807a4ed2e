"""A layer's attention options: what every paged attention kernel takes beside its operands."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class AttentionOptions:
    """A layer's attention options, None / 0 meaning off.

    sinks: fp32 [Hq] logits joining each head's softmax denominator (gpt-oss), or None.
    window: the sliding window in tokens: the query at position p sees keys p - window < j <= p
    (Hugging Face's convention).
    softcap: scores q.k * scale -> softcap * tanh(scores / softcap) before the mask and softmax
    (Gemma 2's attention soft-capping).
    """

    sinks: torch.Tensor | None = None
    window: int = 0
    softcap: float = 0.0


FULL_ATTENTION = AttentionOptions()  # every key up to the query's position, no sinks, no cap
