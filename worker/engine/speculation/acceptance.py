"""AcceptanceTable: how likely a proposer's tokens are to be accepted, by a signal the proposer gives.

Acceptance comes in bursts, and both proposers say when they are in one. Prompt lookup: inside a
copied span whole proposals are kept, elsewhere the first token is mostly wrong, and the length of
the match behind a proposal tells them apart (on the reference model, 8-token proposals from matches
of 8+ tokens kept 73-100% of their tokens, from one-token matches 13-18%). A draft model: its own
top-1 probability (the first, undistilled reference draft's tokens at >= 0.3 were kept 88-100% of the
time, below 0.3 43%). A sequence's
running average mixes the two kinds and lags every switch; the signal tells them apart at once. So
the engine learns, per signal bucket and across its sequences, the chance p that a proposed token
is accepted given that the ones before it were (each verified token adds a hit, the first rejected
one a miss). Prompt lookup's j-th token is judged at the match its kept predecessors made (a match
of m tokens is one of m + j - 1 once j - 1 proposed tokens were kept: its chance grows along a
copied span), so a proposal's j-th token is kept with the product of the chances at m .. m + j - 1;
a draft's with the product of its tokens' chances: what SpeculationController.allocate and the
draft's early stop weigh against the measured cost of a row. Counts fade (HORIZON) so the estimate follows a changing
workload.
"""

from __future__ import annotations

import bisect

PRIOR_HITS, PRIOR_TRIALS = 1.0, 2.0  # an unseen bucket starts at p = 1/2
HORIZON = 256.0  # trials a bucket remembers (older counts fade proportionally)
TRUSTED = 8.0  # trials (priors included) before a bucket's chance can rule speculation out
MATCH_EDGES = (1, 2, 3, 4, 8, 16)  # prompt lookup, by match length: none, 1, 2, 3, 4-7, 8-15, 16+
CONFIDENCE_EDGES = (0.3, 0.5, 0.7, 0.85, 0.95)  # a draft, by its top-1 probability


class AcceptanceTable:
    def __init__(self, edges: tuple[float, ...]) -> None:
        self.edges = edges
        self.hits = [PRIOR_HITS] * (len(edges) + 1)
        self.trials = [PRIOR_TRIALS] * (len(edges) + 1)

    def bucket(self, signal: float) -> int:
        """The bucket of a signal value: how many edges are <= it."""
        return bisect.bisect_right(self.edges, signal)

    def chance(self, signal: float) -> float:
        """p: the chance that a token proposed with this signal is accepted, given the proposal's
        tokens before it were."""
        b = self.bucket(signal)
        return self.hits[b] / self.trials[b]

    def chances(self) -> tuple[float, ...]:
        """chance() of every bucket, in order (what the draft's C chain looks its tokens up in)."""
        return tuple(h / t for h, t in zip(self.hits, self.trials, strict=True))

    def best(self) -> float:
        """The highest chance any bucket proposals came from may have (what the best proposals could
        get): one seen fewer than TRUSTED times counts as 1 (too little seen to rule it out), and so
        does a table that has seen nothing yet."""
        seen = [(h, t) for h, t in zip(self.hits, self.trials, strict=True) if t > PRIOR_TRIALS]
        return max((h / t if t >= TRUSTED else 1.0 for h, t in seen), default=1.0)

    def overall(self) -> float:
        """The chance over all buckets (a draft's, before it has drafted the token)."""
        return sum(self.hits) / sum(self.trials)

    def hope(self, by_signal: bool) -> float:
        """The best chance a proposal may get before it is made: the best bucket's when the signal is
        known before proposing (prompt lookup's match length), else the overall chance (a draft's
        tokens are judged before they are drafted); 1 while too little is seen to rule it out."""
        if by_signal:
            return self.best()
        return self.overall() if sum(self.trials) - PRIOR_TRIALS * len(self.trials) >= TRUSTED else 1.0

    def fade(self, keep: float) -> None:
        """Keeps the `keep` share of every bucket's counts (its chance unchanged): evidence grows old
        while nothing is proposed, and a bucket that falls under TRUSTED trials can no longer rule
        speculation out (hope: 1, so a probe measures it again)."""
        self.hits = [h * keep for h in self.hits]
        self.trials = [t * keep for t in self.trials]

    def observe(self, signals: list[float], accepted: int) -> None:
        """A proposal whose tokens came with `signals` kept its first `accepted`: each kept token is a
        hit in its bucket, the first rejected one a miss; the tokens after it were never judged."""
        for j, signal in enumerate(signals[: accepted + 1]):
            b = self.bucket(signal)
            self.hits[b] += j < accepted
            self.trials[b] += 1
            if self.trials[b] > HORIZON:
                scale = HORIZON / self.trials[b]
                self.hits[b] *= scale
                self.trials[b] *= scale
