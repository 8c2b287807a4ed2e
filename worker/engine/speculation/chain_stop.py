"""ChainStop: a draft model's early stop, the speculator's rule for when a row stops drafting.

Sequence s drafts token j + 1 while the chance that all its tokens so far are kept (the product of
`chances[bucket(p_i)]`, i <= j, a bucket being how many of `edges` are <= the draft's probability p_i
of token i), times the draft's overall chance for the next token and the row's token value
`values[s]`, beats `per_token`, what a drafted token costs (Speculator._go_on sets the numbers).
The step-by-step path calls it in Python; the C draft chain (kernels/cpu/draft_chain.py) takes the
same numbers as arrays (`arrays`) and evaluates the same rule.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from kernels.cpu.draft_chain import EarlyStop


@dataclass(frozen=True)
class ChainStop:
    edges: tuple[float, ...]
    chances: tuple[float, ...]  # len(edges) + 1
    overall: float
    per_token: float
    values: tuple[float, ...]  # per sequence

    def __call__(self, s: int, probs: list[float]) -> bool:
        """Does sequence s, whose drafted tokens so far came with `probs`, draft another?"""
        chances = (self.chances[bisect.bisect_right(self.edges, q)] for q in probs)
        return math.prod(chances) * self.overall * self.values[s] > self.per_token

    def arrays(self) -> EarlyStop:
        """The rule's numbers as DraftChain.propose takes them."""
        return EarlyStop(
            edges=np.asarray(self.edges, np.float64), chances=np.asarray(self.chances, np.float64),
            overall=self.overall, per_token=self.per_token, values=np.asarray(self.values, np.float64),
        )  # fmt: skip
