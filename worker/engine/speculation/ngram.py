"""NgramIndex: prompt lookup, the proposer that needs no model.

For each n in 1..MAX_N it remembers where the latest occurrence of every n-gram of the sequence's
tokens (prompt and generated) was followed by another token. A proposal matches the sequence's last
MAX_N tokens first, then shorter suffixes, and offers the up to K tokens that followed the latest
match (a match close to the end continues periodically: the suffix repeats with that period). The index grows with the tokens (MAX_N dict writes per new token, done when proposing), so a
step's host cost is O(new tokens) per sequence, not O(length); the prompt is indexed once.
"""

from __future__ import annotations

MAX_N = 4  # longest suffix matched


class NgramIndex:
    __slots__ = ("follows", "upto")

    def __init__(self) -> None:
        self.follows: dict[tuple[int, ...], int] = {}  # n-gram -> position of the token after its latest match
        self.upto = 1  # n-grams followed by a token at a position < upto are indexed

    def _update(self, tokens: list[int]) -> None:
        follows = self.follows
        for e in range(self.upto, len(tokens)):  # e: the position after the n-gram
            for n in range(1, min(MAX_N, e) + 1):
                follows[tuple(tokens[e - n : e])] = e
        self.upto = max(self.upto, len(tokens))

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier match of the longest matching suffix of
        `tokens` (n = MAX_N..1); [] when not even the last token occurred before."""
        self._update(tokens)
        length = len(tokens)
        for n in range(min(MAX_N, length - 1), 0, -1):
            e = self.follows.get(tuple(tokens[length - n :]))
            if e is not None:
                if e + k <= length:
                    return tokens[e : e + k]
                # the match runs into the newest tokens: the text repeats with period length - e, so the
                # proposal continues the period ("- - - -", "0, 0, 0,") instead of stopping short
                period = length - e
                return [tokens[e + i % period] for i in range(k)]
        return []
