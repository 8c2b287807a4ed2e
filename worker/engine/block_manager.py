"""BlockManager: the paged KV cache's bookkeeping, pure Python over block ids.

Every block has a reference count. A full block whose tokens are computed (or scheduled in the
current step) gets a chained hash = hash((parent block's hash, its tokens)) and enters the prefix
cache, so a later sequence with the same prefix reuses it. A block whose count falls to 0 keeps its
contents: if hashed it becomes "evictable" (still reusable, reclaimed least-recently-used first),
otherwise it returns to the plain free list. Hashes are 64-bit Python hashes of int tuples
(stable across processes); a collision would silently share a block (probability ~2^-64 per pair).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Sequence as Seq

from worker.engine.sequence import Sequence

_ROOT_HASH = 0x5EED


def chain_hashes(token_ids: Seq[int], block_size: int, parent: int = _ROOT_HASH, start: int = 0) -> list[int]:
    """Chained hashes of the full blocks of token_ids from block index `start` (parent: block start-1)."""
    out = []
    for i in range(start, len(token_ids) // block_size):
        parent = hash((parent, tuple(token_ids[i * block_size : (i + 1) * block_size])))
        out.append(parent)
    return out


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache holds no block; raise kv_cache_bytes or use a smaller model")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.hash_to_block: dict[int, int] = {}
        self.free_blocks: deque[int] = deque(range(num_blocks))  # count 0, not cached
        self.evictable: OrderedDict[int, None] = OrderedDict()  # count 0, cached; oldest first
        self.pending: Counter[int] = Counter()  # hash -> running sequences that will compute it
        self.prefix_hits = 0  # blocks reused from the cache (cumulative)

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks) + len(self.evictable)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """(cached blocks holding the longest prefix of seq.token_ids, hashes of all its full blocks).

        No reuse without prefix caching or for prompt_logprobs requests (they need every logit).
        """
        if not self.enable_prefix_caching:
            return [], []
        hashes = chain_hashes(seq.token_ids, self.block_size)
        matched: list[int] = []
        if not seq.params.prompt_logprobs:
            for h in hashes:
                block = self.hash_to_block.get(h)
                if block is None:
                    break
                matched.append(block)
        return matched, hashes

    def next_block_pending(self, matched: list[int], hashes: list[int]) -> bool:
        """True if the first uncached full block is being computed by a running sequence: admitting
        this sequence a step later turns that block into a cache hit instead of a recompute."""
        return len(matched) < len(hashes) and self.pending.get(hashes[len(matched)], 0) > 0

    def can_allocate(self, seq: Sequence, matched: list[int], reserve: int = 0) -> bool:
        """Room for all of seq's tokens, counting reused cached blocks that are currently evictable."""
        fresh = self.blocks_for(seq.num_tokens) - len(matched)
        revived = sum(1 for b in matched if self.ref_counts[b] == 0)
        return fresh + revived + reserve <= self.num_free_blocks

    # ---- mutations -----------------------------------------------------------------------
    def allocate(self, seq: Sequence, matched: list[int], hashes: list[int]) -> None:
        """Give seq blocks for all its tokens, reusing `matched`; sets num_computed_tokens to the hit."""
        for b in matched:
            if self.ref_counts[b] == 0:
                del self.evictable[b]
            self.ref_counts[b] += 1
        self.prefix_hits += len(matched)
        seq.block_table = list(matched) + [
            self._take() for _ in range(self.blocks_for(seq.num_tokens) - len(matched))
        ]
        hit = len(matched) * self.block_size
        seq.block_hashes = [self.block_hash[b] for b in matched]
        seq.protected_len = hit
        # The last token is always computed: its logits give the next token.
        seq.num_computed_tokens = min(hit, seq.num_tokens - 1)
        if self.enable_prefix_caching:
            seq.planned_hashes = list(hashes)
            self.pending.update(hashes[len(matched) :])

    def append_slots(self, seq: Sequence, num_tokens: int) -> bool:
        """Grow seq's block table to hold num_tokens tokens; False (nothing changed) if out of blocks."""
        need = self.blocks_for(num_tokens) - len(seq.block_table)
        if need > self.num_free_blocks:
            return False
        seq.block_table.extend(self._take() for _ in range(need))
        return True

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child shares all of parent's blocks (n > 1 choices after one prefill): counts go up, and the
        child inherits the parent's committed hashes. The shared last block, if partial, must be copied
        by whichever sequence writes into it first (copy_on_write)."""
        for b in parent.block_table:
            self.ref_counts[b] += 1
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        child.planned_hashes = list(parent.block_hashes)  # nothing pending: it computes no prompt block
        child.protected_len = parent.protected_len

    def copy_on_write(self, seq: Sequence, index: int) -> tuple[int, int] | None | bool:
        """Before seq writes into its block `index`: if other sequences share it, seq gets a fresh block
        and (old, new) is returned for the KV copy; None if seq holds it alone (write in place); False
        if no block is free (nothing changed)."""
        old = seq.block_table[index]
        if self.ref_counts[old] == 1:
            return None
        if not self.num_free_blocks:
            return False
        new = self._take()
        self.ref_counts[old] -= 1
        seq.block_table[index] = new
        return old, new

    def commit_computed(self, seq: Sequence, upto: int) -> None:
        """Hash and cache seq's full blocks below position `upto`: at most its computed (or scheduled)
        tokens, and only tokens the host has (a token still being sampled cannot be hashed yet)."""
        if not self.enable_prefix_caching:
            return
        full = upto // self.block_size
        if full <= len(seq.block_hashes):
            return
        parent = seq.block_hashes[-1] if seq.block_hashes else _ROOT_HASH
        start = len(seq.block_hashes)
        for i, h in enumerate(
            chain_hashes(seq.token_ids[: full * self.block_size], self.block_size, parent, start)
        ):
            idx = start + i
            if idx < len(seq.planned_hashes) and seq.planned_hashes[idx] == h:
                self._unpend(h)
            block = seq.block_table[idx]
            if h not in self.hash_to_block and self.block_hash[block] is None:
                self.hash_to_block[h] = block
                self.block_hash[block] = h
            seq.block_hashes.append(h)

    def free(self, seq: Sequence) -> None:
        """Drop seq's references; blocks are released leaf-first so LRU evicts leaves before parents."""
        for h in seq.planned_hashes[len(seq.block_hashes) :]:
            self._unpend(h)
        for b in reversed(seq.block_table):
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                if self.block_hash[b] is not None:
                    self.evictable[b] = None
                else:
                    self.free_blocks.append(b)
        seq.block_table = []
        seq.block_hashes = []
        seq.planned_hashes = []

    def _unpend(self, h: int) -> None:
        self.pending[h] -= 1
        if self.pending[h] <= 0:
            del self.pending[h]

    def _take(self) -> int:
        if self.free_blocks:
            b = self.free_blocks.popleft()
        else:
            b, _ = self.evictable.popitem(last=False)  # least recently released
            del self.hash_to_block[self.block_hash[b]]
            self.block_hash[b] = None
        self.ref_counts[b] = 1
        return b

    def check_invariants(self, live: list[Sequence]) -> None:
        """Raise AssertionError if the bookkeeping disagrees with the live sequences (tests, debugging)."""
        counts = Counter(b for s in live for b in s.block_table)
        for b in range(self.num_blocks):
            if self.ref_counts[b] != counts.get(b, 0):
                raise AssertionError(f"block {b}: ref_count {self.ref_counts[b]} != users {counts.get(b, 0)}")
        free = set(self.free_blocks) | set(self.evictable)
        if len(free) != len(self.free_blocks) + len(self.evictable):
            raise AssertionError("a block is listed free twice")
        if free != {b for b in range(self.num_blocks) if self.ref_counts[b] == 0}:
            raise AssertionError("free lists disagree with ref counts")
        for h, b in self.hash_to_block.items():
            if self.block_hash[b] != h:
                raise AssertionError(f"hash map points to block {b} which holds another hash")
        if not live and self.pending:
            raise AssertionError(f"pending hashes left with no live sequence: {len(self.pending)}")
