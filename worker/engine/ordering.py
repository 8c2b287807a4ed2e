"""Batch-aware ordering: run requests that share prefixes next to each other, longest work first.

An online server sees requests in arrival order; an offline job knows its whole batch. Sorting the
prompts' token lists lexicographically is a depth-first walk over their prefix trie: every group of
requests sharing a prefix becomes contiguous, so the prefix is computed once, by the group's first
request, and stays in the cache (hot, never evicted) while the rest of the group runs.

Between groups that share nothing the order is free, and it decides the batch's tail: a request
admitted last with a long generation ends up decoding alone, a step per token at batch size one.
So groups go longest-generation first (largest max_tokens; the classic longest-processing-time
rule), which keeps the decode batch wide until the end.
"""

from __future__ import annotations

from collections.abc import Sequence


def prefix_order(prompts: Sequence[Sequence[int]]) -> list[int]:
    """Indices of `prompts` in depth-first prefix-trie order (stable for equal prompts)."""
    return sorted(range(len(prompts)), key=lambda i: tuple(prompts[i]))


def batch_order(prompts: Sequence[Sequence[int]], max_tokens: Sequence[int], block_size: int) -> list[int]:
    """Indices of `prompts` to admit in: groups sharing a first full block (whose cached blocks they
    share) stay contiguous and in trie order; groups run largest max_tokens first (stable)."""
    groups: list[list[int]] = []
    previous: tuple[int, ...] | None = None
    for i in prefix_order(prompts):
        head = tuple(prompts[i][:block_size]) if len(prompts[i]) >= block_size else None
        if head is None or head != previous:
            groups.append([])
        groups[-1].append(i)
        previous = head
    groups.sort(key=lambda g: -max(max_tokens[i] for i in g))
    return [i for g in groups for i in g]
