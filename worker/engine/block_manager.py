"""BlockManager: the paged KV cache's bookkeeping, pure Python over block ids.

Every block has a reference count. A full block whose tokens are computed (or scheduled in the
current step) gets a chained hash = hash((parent block's hash, its tokens)) and enters the prefix
cache, so a later sequence with the same prefix reuses it. A block whose count falls to 0 keeps its
contents: if hashed it becomes "evictable" (still reusable, reclaimed least-recently-used first),
otherwise it returns to the plain free list. Hashes are 64-bit Python hashes of int tuples
(stable across processes); a collision would silently share a block (probability ~2^-64 per pair).
The chain's root is the sequence's rope_offset, LoRA adapter and cache salt folded into a constant:
a LongRoPE sequence whose prompt is past the threshold rotates every key with the long factors, and
an adapter changes every layer's K/V, so their blocks are never another's; a salt (one per tenant of
`freight serve`) keeps a stream's blocks from every other salt's, so that no tenant's prompt is
served from, or reported as cached by, another's. Sequences of one salt, or of none, share as before.

Sliding windows (`window`: set when every layer of the model attends through the same window W):
a query at position p reads keys p - W < j <= p only, so once a sequence computes from position p
on, its blocks wholly below p - W + 1 are never read again and are released (`release_behind`) like
a finished sequence's: back to the free list, or, hashed, kept evictable for the prefix cache.
The block table stays position-indexed: its first `seq.num_released` entries are stale ids the
sequence no longer holds (attention never reads outside a window). A sequence then holds at most
`blocks_needed(...)` blocks whatever its length. Models mixing windowed and full layers have two
KV cache groups (kv_groups.py: one BlockManager per group, the local one windowed; see
docs/ARCHITECTURE.md "Sliding windows and Gemma's layers").
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence as Seq

from worker.engine.sequence import Sequence

_ROOT_HASH = 0x5EED
# tags that keep the roots' tuples apart; ints, since a str's hash differs from process to process
_LORA = 0x10A
_SALT = 0x5A17


def salt_key(salt: str) -> int:
    """A cache salt as the nonzero int that Sequence.cache_salt holds: the same in every process
    (blake2b, where hash(salt) would change with PYTHONHASHSEED), distinct per salt but by a ~2^-64
    collision."""
    return int.from_bytes(hashlib.blake2b(salt.encode(), digest_size=8).digest(), "little") or 1


def root_hash(seq: Sequence) -> int:
    """The parent hash of seq's first block: the same for every unsalted sequence of the base model
    but LongRoPE's long prompts; one per adapter (its engine id, never reused) and per salt otherwise."""
    root = hash((_ROOT_HASH, _SALT, seq.cache_salt)) if seq.cache_salt else _ROOT_HASH
    if seq.adapter >= 0:
        return hash((root, seq.rope_offset, _LORA, seq.adapter))
    return root if not seq.rope_offset else hash((root, seq.rope_offset))


def chain_hashes(token_ids: Seq[int], block_size: int, parent: int = _ROOT_HASH, start: int = 0) -> list[int]:
    """Chained hashes of the full blocks of token_ids from block index `start` (parent: block start-1)."""
    out = []
    for i in range(start, len(token_ids) // block_size):
        parent = hash((parent, tuple(token_ids[i * block_size : (i + 1) * block_size])))
        out.append(parent)
    return out


def blocks_needed(num_tokens: int, chunk: int, block_size: int, window: int | None) -> int:
    """The most blocks a sequence of num_tokens tokens holds at once when it computes at most `chunk`
    tokens a step: all of them, or with a window the blocks of the window behind a chunk and the
    chunk's own (a chunk [s, s + n) reads keys from s - W + 1 on: at most W - 1 + n positions, over
    one more block than they fill when they start mid-block)."""
    every = -(-num_tokens // block_size)
    if window is None:
        return every
    return min(every, -(-(window - 1 + chunk) // block_size) + 1)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool, window: int | None = None) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache holds no block; raise kv_cache_bytes or use a smaller model")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.window = window  # every layer's sliding window (tokens); None: blocks are held to the end
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

    def blocks_needed(self, num_tokens: int, chunk: int) -> int:
        """blocks_needed(...) of this cache (module function)."""
        return blocks_needed(num_tokens, chunk, self.block_size, self.window)

    def never_fits(self, num_tokens: int, chunk: int, pool: str = "the cache") -> str | None:
        """Why a sequence of num_tokens tokens computed `chunk` at a time can never be held, even
        alone (its blocks_needed exceeds the pool), or None if it can: the admission bound."""
        need = self.blocks_needed(num_tokens, chunk)
        return f"needs {need} KV blocks; {pool} holds {self.num_blocks}" if need > self.num_blocks else None

    def behind(self, position: int) -> int:
        """Leading blocks no query at `position` or later reads (all of whose keys are at least a
        window older); 0 without a window."""
        if self.window is None:
            return 0
        return max(0, position - self.window + 1) // self.block_size

    def held(self, seq: Sequence) -> int:
        """Blocks seq holds references to (its table minus the released front)."""
        return len(seq.block_table) - seq.num_released

    def released(self, seq: Sequence) -> int:
        """The leading entries of seq's table a window released (kv_groups has two tables)."""
        return seq.num_released

    def match_prefix(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """(cached blocks holding the longest prefix of seq.token_ids, hashes of all its full blocks).

        No reuse without prefix caching or for prompt_logprobs requests (they need every logit).
        """
        if not self.enable_prefix_caching:
            return [], []
        hashes = chain_hashes(seq.token_ids, self.block_size, root_hash(seq))
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

    def _skipped(self, seq: Sequence, matched: list[int]) -> int:
        """Matched blocks a window has already left at the hit: placed in the table, never held."""
        return self.behind(min(len(matched) * self.block_size, seq.num_tokens - 1))

    def can_allocate(self, seq: Sequence, matched: list[int], reserve: int = 0, num_tokens: int | None = None) -> bool:
        """Room for seq's first num_tokens tokens (default: all), counting reused cached blocks that are
        currently evictable."""
        fresh = self.blocks_for(seq.num_tokens if num_tokens is None else num_tokens) - len(matched)
        revived = sum(1 for b in matched[self._skipped(seq, matched) :] if self.ref_counts[b] == 0)
        return fresh + revived + reserve <= self.num_free_blocks

    # ---- mutations -----------------------------------------------------------------------
    def allocate(self, seq: Sequence, matched: list[int], hashes: list[int], num_tokens: int | None = None) -> None:
        """Give seq blocks for its first num_tokens tokens (default: all; the rest come through
        append_slots), reusing `matched`; sets num_computed_tokens to the hit. With a window, matched
        blocks wholly behind the hit's window are placed in the table without being held."""
        skip = self._skipped(seq, matched)
        for b in matched[skip:]:
            if self.ref_counts[b] == 0:
                del self.evictable[b]
            self.ref_counts[b] += 1
        self.prefix_hits += len(matched)
        upto = seq.num_tokens if num_tokens is None else num_tokens
        seq.block_table = list(matched) + [self._take() for _ in range(self.blocks_for(upto) - len(matched))]
        seq.num_released = skip
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

    def release_behind(self, seq: Sequence, position: int) -> bool:
        """seq computes from `position` on: release the blocks its window has left (see the module
        docstring). True if any was released."""
        upto = min(self.behind(position), len(seq.block_table))
        if upto <= seq.num_released:
            return False
        for b in seq.block_table[seq.num_released : upto]:
            self._drop_ref(b)
        seq.num_released = upto
        return True

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Give back seq's blocks past the first blocks_for(num_tokens) (speculation's rollback: the
        blocks of rejected proposed tokens). Those blocks were never hashed (their tokens were not on
        the host); they go to the front of the free list, to be taken again first."""
        keep = self.blocks_for(num_tokens)
        while len(seq.block_table) > keep:
            self._drop_ref(seq.block_table.pop(), reuse_first=True)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child shares all of parent's held blocks (n > 1 choices after one prefill): counts go up,
        and the child inherits the parent's committed hashes. The shared last block, if partial, must
        be copied by whichever sequence writes into it first (copy_on_write)."""
        for b in parent.block_table[parent.num_released :]:
            self.ref_counts[b] += 1
        child.num_released = parent.num_released
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        child.planned_hashes = list(parent.block_hashes)  # nothing pending: it computes no prompt block
        child.protected_len = parent.protected_len

    def copy_on_write(self, seq: Sequence, index: int) -> list[tuple[int, int, int]] | None:
        """Before seq writes into its block `index`: if other sequences share it, seq gets a fresh block
        and [(group, old, new)] is returned for the KV copy (group 0: this manager has one pool;
        kv_groups' has two); [] if seq holds it alone (write in place); None if no block is free
        (nothing changed)."""
        old = seq.block_table[index]
        if self.ref_counts[old] == 1:
            return []
        if not self.num_free_blocks:
            return None
        new = self._take()
        self.ref_counts[old] -= 1
        seq.block_table[index] = new
        return [(0, old, new)]

    def shares(self, seq: Sequence, index: int) -> bool:
        """Other sequences hold seq's block `index` too (copy_on_write would copy it)."""
        return self.ref_counts[seq.block_table[index]] > 1

    def commit_computed(self, seq: Sequence, upto: int) -> None:
        """Hash and cache seq's full blocks below position `upto`: at most its computed (or scheduled)
        tokens, and only tokens the host has (a token still being sampled cannot be hashed yet)."""
        if not self.enable_prefix_caching:
            return
        full = upto // self.block_size
        if full <= len(seq.block_hashes):
            return
        parent = seq.block_hashes[-1] if seq.block_hashes else root_hash(seq)
        start = len(seq.block_hashes)
        for i, h in enumerate(
            chain_hashes(seq.token_ids[: full * self.block_size], self.block_size, parent, start)
        ):
            idx = start + i
            if idx < len(seq.planned_hashes) and seq.planned_hashes[idx] == h:
                self._unpend(h)
            block = seq.block_table[idx]
            # a released block may belong to another sequence by now: its hash is not registered
            if idx >= seq.num_released and h not in self.hash_to_block and self.block_hash[block] is None:
                self.hash_to_block[h] = block
                self.block_hash[block] = h
            seq.block_hashes.append(h)

    def free(self, seq: Sequence) -> None:
        """Drop seq's references; blocks are released leaf-first so LRU evicts leaves before parents."""
        for h in seq.planned_hashes[len(seq.block_hashes) :]:
            self._unpend(h)
        for b in reversed(seq.block_table[seq.num_released :]):
            self._drop_ref(b)
        seq.block_table = []
        seq.num_released = 0
        seq.block_hashes = []
        seq.planned_hashes = []

    def _drop_ref(self, b: int, reuse_first: bool = False) -> None:
        """One holder fewer of block b. At no holder, a hashed block stays cached as evictable; an
        unhashed one is free: at the back of the free list, or at its front with reuse_first."""
        self.ref_counts[b] -= 1
        if self.ref_counts[b] == 0:
            if self.block_hash[b] is not None:
                self.evictable[b] = None
            elif reuse_first:
                self.free_blocks.appendleft(b)
            else:
                self.free_blocks.append(b)

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
        counts = Counter(b for s in live for b in s.block_table[s.num_released :])
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
