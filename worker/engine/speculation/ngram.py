"""NgramIndex: prompt lookup, the proposer that needs no model.

For each n in 1..MAX_N it remembers where the latest occurrence of every n-gram of the sequence's
tokens (prompt and generated) was followed by another token. A proposal (`match`, then
`continuation`) matches the sequence's last MAX_N tokens first, then shorter suffixes, and offers
the up to K tokens that followed the latest match (a match close to the end continues
periodically: the suffix repeats with that period). The match's length (how far back the text
before it agrees with the newest tokens, up to MATCH_CAP) is what prompt lookup's acceptance is
judged by (acceptance.AcceptanceTable): a long match is a copied span that tends to go on, a
one-token match is a guess. The index grows with the tokens (MAX_N dict writes per new token, done
when matching), so a step's host cost is O(new tokens) per sequence, not
O(length); the prompt is indexed once.
"""

from __future__ import annotations

MAX_N = 4  # longest suffix looked up
MATCH_CAP = 16  # a match is extended back at most this far


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

    def match(self, tokens: list[int]) -> tuple[int, int]:
        """(e, length): the position after the latest earlier match of the longest matching suffix of
        `tokens` (n = MAX_N..1), and how many tokens the match spans (extended back past n while the
        text before e agrees with the newest tokens, up to MATCH_CAP); (-1, 0) when not even the last
        token occurred before."""
        self._update(tokens)
        end = len(tokens)
        for n in range(min(MAX_N, end - 1), 0, -1):
            e = self.follows.get(tuple(tokens[end - n :]))
            if e is not None:
                m = n
                while m < MATCH_CAP and m < e and tokens[e - 1 - m] == tokens[end - 1 - m]:
                    m += 1
                return e, m
        return -1, 0

    @staticmethod
    def continuation(tokens: list[int], e: int, k: int) -> list[int]:
        """The k tokens that follow position e; a match that runs into the newest tokens continues with
        its period (the text repeats with period len - e: "- - - -", "0, 0, 0,") instead of stopping."""
        end = len(tokens)
        if e + k <= end:
            return tokens[e : e + k]
        period = end - e
        return [tokens[e + i % period] for i in range(k)]
