"""Batch-aware ordering: run requests that share prefixes next to each other.

An online server sees requests in arrival order; an offline job knows its whole batch. Sorting the
prompts' token lists lexicographically is a depth-first walk over their prefix trie: every group of
requests sharing a prefix becomes contiguous, so the prefix is computed once, by the group's first
request, and stays in the cache (hot, never evicted) while the rest of the group runs.
"""

from __future__ import annotations

from collections.abc import Sequence


def prefix_order(prompts: Sequence[Sequence[int]]) -> list[int]:
    """Indices of `prompts` in depth-first prefix-trie order (stable for equal prompts)."""
    return sorted(range(len(prompts)), key=lambda i: tuple(prompts[i]))
