"""LookupAcceptance: how likely prompt lookup's proposed tokens are to be accepted, by match length.

Prompt lookup's acceptance comes in bursts: inside a copied span whole proposals are kept, elsewhere
the first token is mostly wrong (on the reference model, 8-token proposals from matches of 8+ tokens
kept 73-100% of their tokens, from one-token matches 13-18%). A sequence's running average mixes the
two and lags every switch; the length of the match behind a proposal tells them apart at once. So
the engine learns, per match-length bucket and across its sequences, the chance p that a proposed
token is accepted given that the ones before it were (each verify adds its accepted tokens as hits,
plus one miss when it stopped short); the j-th token of a proposal is then accepted with chance p^j,
which is what SpeculationController.allocate weighs against the measured cost of its row. Counts
fade (HORIZON) so the estimate follows a changing workload.
"""

from __future__ import annotations

BUCKETS = 7  # no match, 1, 2, 3, 4-7, 8-15, 16+ tokens
PRIOR_HITS, PRIOR_TRIALS = 1.0, 2.0  # an unseen bucket starts at p = 1/2
HORIZON = 256.0  # trials a bucket remembers (older counts fade proportionally)


def bucket(length: int) -> int:
    """The bucket of a match spanning `length` tokens."""
    if length < 4:
        return max(0, length)
    return 4 if length < 8 else 5 if length < 16 else 6


class LookupAcceptance:
    def __init__(self) -> None:
        self.hits = [PRIOR_HITS] * BUCKETS
        self.trials = [PRIOR_TRIALS] * BUCKETS

    def chance(self, length: int) -> float:
        """p: the chance that a token proposed from a match of `length` tokens is accepted, given the
        proposal's tokens before it were."""
        b = bucket(length)
        return self.hits[b] / self.trials[b]

    def best(self) -> float:
        """The highest chance of any bucket (what the best matches get)."""
        return max(h / t for h, t in zip(self.hits, self.trials, strict=True))

    def expected(self, length: int, k: int) -> float:
        """Expected accepted tokens of a k-token proposal from such a match: p + p^2 + ... + p^k."""
        p = self.chance(length)
        return sum(p**j for j in range(1, k + 1))

    def observe(self, length: int, proposed: int, accepted: int) -> None:
        """A proposal of `proposed` tokens from a match of `length` tokens kept `accepted`."""
        b = bucket(length)
        self.hits[b] += accepted
        self.trials[b] += accepted + (accepted < proposed)
        if self.trials[b] > HORIZON:
            scale = HORIZON / self.trials[b]
            self.hits[b] *= scale
            self.trials[b] *= scale
