"""KV cache groups: a model mixing full-attention and sliding-window layers (Gemma 2 / 3, gpt-oss)
keeps its local layers' K/V in a paged pool of their own, released behind the window.

Group 0 holds the full layers' caches and is managed exactly as a model without windows (every
block kept to the end); group 1 holds the windowed layers' caches (one window W for all of them,
ModelConfig.local_window), with its own block ids, and releases each sequence's blocks its window
has left like an all-windowed model's single pool does (BlockManager(window=W)). So a sequence holds
at most blocks_needed(..., W) local blocks however long it grows, while its full blocks grow with it.

Both groups' tables stay position-indexed and grow in lockstep (the same number of entries: block i
of either covers positions i*B .. i*B+B-1): a sequence's group-0 table is `seq.block_table`, its
group-1 table `seq.local` (a LocalTable: what BlockManager reads of a sequence, with the tokens read
through). Every mutation the scheduler asks for (allocate, grow, release, truncate, fork, commit,
free) is applied to both; only release is group 1's alone. Copy-on-write copies the block in each
group that shares it, in both or (no free block) in neither.

A step reads each group as a `KVGroup`: where its rows' block tables are (the PersistentBatch's
array and its device copy, named by `table`) and a sequence's table in it (`blocks`). Everything
built per step (slot mappings, block tables, the decode graphs' buffers, the KV block copies) is built
once per group in a loop over `kv_groups(...)`; the step's AttentionMetadata is group 0's and carries
group 1's in `local` (`metadata`), which the model's local layers read.

Prefix caching: both pools key blocks by the same chained hashes. A hit of k blocks must hold in both
groups: group 0 needs blocks [0, k), group 1 only the ones inside the hit's window (those before it
are placed in the table as placeholder id 0, never held nor read). Released local blocks of a cached
prefix may have been evicted since, so the hit is cut to the longest k for which group 1 still has
them (conservative: a shorter hit recomputes more, never reads a wrong block).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from contracts.sampling import SamplingParams
from worker.engine.block_manager import BlockManager, blocks_needed
from worker.engine.config import EngineConfig
from worker.engine.sequence import Sequence

if TYPE_CHECKING:  # models import torch; this module stays light
    import torch

    from worker.engine.backends.base import AttentionMetadata
    from worker.engine.models import CausalLM, ModelConfig

_PLACEHOLDER = 0  # the id in a local table's slots behind a prefix hit's window: never read


@dataclass(frozen=True)
class KVGroup:
    """One KV cache group as a step reads it: a paged pool of some layers' K/V, block ids of its own."""

    index: int  # 0: every layer's pool, or the full-attention layers'; 1: the windowed layers'
    table: str  # the PersistentBatch array (and DeviceRows tensor) of the rows' block tables in this group
    blocks: Callable[[Sequence], list[int]]  # a running sequence's block table in this group


FULL = KVGroup(0, "block_table", operator.attrgetter("block_table"))
LOCAL = KVGroup(1, "local_table", operator.attrgetter("local.block_table"))


def kv_groups(grouped: bool) -> tuple[KVGroup, ...]:
    """The groups of a model: one pool, or (grouped) its full and its windowed layers' pools."""
    return (FULL, LOCAL) if grouped else (FULL,)


def metadata(metas: list[AttentionMetadata]) -> AttentionMetadata:
    """The step's metadata from one per group (in group order, sharing everything but slot mappings
    and block tables): group 0's, carrying group 1's in `local`."""
    meta = metas[-1]
    for m in reversed(metas[:-1]):
        meta = dataclasses.replace(m, local=meta)
    return meta


class LocalTable:
    """A sequence's group-1 (local layers') blocks: block_table, num_released, block_hashes,
    planned_hashes, protected_len as on a Sequence (see sequence.py); tokens read through."""

    __slots__ = ("seq", "block_table", "num_released", "block_hashes", "planned_hashes", "protected_len")

    def __init__(self, seq: Sequence) -> None:
        self.seq = seq
        self.block_table: list[int] = []
        self.num_released = 0
        self.block_hashes: list[int] = []
        self.planned_hashes: list[int] = []
        self.protected_len = 0

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.seq.token_ids)

    @property
    def params(self) -> SamplingParams:
        return self.seq.params

    @property
    def rope_offset(self) -> int:  # the root of its prefix-cache hashes (block_manager.root_hash)
        return self.seq.rope_offset

    @property
    def adapter(self) -> int:  # likewise
        return self.seq.adapter

    @property
    def cache_salt(self) -> int:  # likewise
        return self.seq.cache_salt

    @property
    def num_computed_tokens(self) -> int:
        return self.seq.num_computed_tokens

    @num_computed_tokens.setter
    def num_computed_tokens(self, n: int) -> None:  # both groups allocate the same hit
        self.seq.num_computed_tokens = n


class PrefixMatch(list):
    """Group 0's matched blocks (a list, as BlockManager.match_prefix gives) and group 1's (`local`,
    placeholders behind the hit's window)."""

    local: list[int]


class GroupedBlockManager:
    """BlockManager's interface over the two groups (module docstring). `window` is group 1's: the
    scheduler then releases per step and admits a sequence with blocks for its first chunk only."""

    def __init__(self, num_blocks: int, num_local_blocks: int, block_size: int, enable_prefix_caching: bool,
                 window: int) -> None:  # fmt: skip
        self.full = BlockManager(num_blocks, block_size, enable_prefix_caching)
        self.local = BlockManager(num_local_blocks, block_size, enable_prefix_caching, window=window)
        self.num_blocks = num_blocks  # group 0's (the watermark's base); never_fits checks both
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.window = window

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks free in both groups (they grow in lockstep)."""
        return min(self.full.num_free_blocks, self.local.num_free_blocks)

    @property
    def prefix_hits(self) -> int:
        return self.full.prefix_hits

    @property
    def pending(self) -> object:
        return self.full.pending

    def blocks_for(self, num_tokens: int) -> int:
        return self.full.blocks_for(num_tokens)

    def never_fits(self, num_tokens: int, chunk: int) -> str | None:
        """BlockManager.never_fits over both pools: group 0's need (every block) against its pool, then
        group 1's (a window's) against the local pool, which may be the smaller of the two."""
        return self.full.never_fits(num_tokens, chunk) or self.local.never_fits(
            num_tokens, chunk, "the sliding-window layers' cache")  # fmt: skip

    def behind(self, position: int) -> int:
        return self.local.behind(position)

    def held(self, seq: Sequence) -> int:
        return self.full.held(seq)

    def released(self, seq: Sequence) -> int:
        """The leading entries of seq's tables the window released (group 1's)."""
        return seq.local.num_released if seq.local is not None else 0

    def match_prefix(self, seq: Sequence) -> tuple[list[int], list[int]]:
        matched, hashes = self.full.match_prefix(seq)
        k, n = len(matched), seq.num_tokens
        local: list[int] = []
        while k:
            skip = self.local.behind(min(k * self.block_size, n - 1))
            ids = [self.local.hash_to_block.get(h) for h in hashes[skip:k]]
            missing = [i for i, b in enumerate(ids) if b is None]
            if not missing:
                local = [_PLACEHOLDER] * skip + ids  # type: ignore[list-item]
                break
            k = skip + missing[-1]  # the hit must end before the last missing block
        out = PrefixMatch(matched[:k])
        out.local = local
        return out, hashes

    def next_block_pending(self, matched: list[int], hashes: list[int]) -> bool:
        return self.full.next_block_pending(matched, hashes)

    def can_allocate(self, seq: Sequence, matched: list[int], reserve: int = 0, num_tokens: int | None = None) -> bool:
        local_reserve = min(reserve, self.local.num_blocks // 100)
        return self.full.can_allocate(seq, matched, reserve, num_tokens) and self.local.can_allocate(
            seq, _local(matched), local_reserve, num_tokens)  # type: ignore[arg-type]  # fmt: skip

    # ---- mutations -----------------------------------------------------------------------
    def allocate(self, seq: Sequence, matched: list[int], hashes: list[int], num_tokens: int | None = None) -> None:
        self.full.allocate(seq, matched, hashes, num_tokens)
        seq.local = LocalTable(seq)
        self.local.allocate(seq.local, _local(matched), hashes, num_tokens)  # type: ignore[arg-type]
        self.local.prefix_hits -= len(matched)  # counted once, by group 0
        seq.local.block_hashes = list(seq.block_hashes)  # placeholders hold no hash: the chain's are the same

    def append_slots(self, seq: Sequence, num_tokens: int) -> bool:
        need = self.blocks_for(num_tokens) - len(seq.block_table)
        if need > self.full.num_free_blocks or need > self.local.num_free_blocks:
            return False
        return self.full.append_slots(seq, num_tokens) and self.local.append_slots(seq.local, num_tokens)  # type: ignore[arg-type]

    def release_behind(self, seq: Sequence, position: int) -> bool:
        return self.local.release_behind(seq.local, position)  # type: ignore[arg-type]

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        self.full.truncate(seq, num_tokens)
        self.local.truncate(seq.local, num_tokens)  # type: ignore[arg-type]

    def fork(self, parent: Sequence, child: Sequence) -> None:
        self.full.fork(parent, child)
        child.local = LocalTable(child)
        self.local.fork(parent.local, child.local)  # type: ignore[arg-type]

    def copy_on_write(self, seq: Sequence, index: int) -> list[tuple[int, int, int]] | None:
        """BlockManager.copy_on_write in each group that shares block `index` (group 0's copy, then
        group 1's, as (1, old, new)); None, with nothing changed, if either lacks the free block."""
        local = seq.local
        if (self.full.shares(seq, index) and not self.full.num_free_blocks) or (
                self.local.shares(local, index) and not self.local.num_free_blocks):  # type: ignore[arg-type]  # fmt: skip
            return None
        copies, local_copies = self.full.copy_on_write(seq, index), self.local.copy_on_write(local, index)  # type: ignore[arg-type]
        assert copies is not None and local_copies is not None  # their free blocks were checked above
        return copies + [(1, old, new) for _, old, new in local_copies]

    def commit_computed(self, seq: Sequence, upto: int) -> None:
        self.full.commit_computed(seq, upto)
        self.local.commit_computed(seq.local, upto)  # type: ignore[arg-type]

    def free(self, seq: Sequence) -> None:
        self.full.free(seq)
        if seq.local is not None:
            self.local.free(seq.local)  # type: ignore[arg-type]
            seq.local = None

    def check_invariants(self, live: list[Sequence]) -> None:
        """Both groups' bookkeeping (BlockManager.check_invariants), the tables in lockstep, and each
        live sequence within group 1's bound."""
        self.full.check_invariants(live)
        self.local.check_invariants([s.local for s in live])  # type: ignore[misc]
        for s in live:
            if s.local is None or len(s.local.block_table) != len(s.block_table):
                raise AssertionError(f"sequence {s.seq_id}: its group tables are not in lockstep")


def _local(matched: list[int]) -> list[int]:
    """Group 1's part of a match (a plain empty list: no hit, as the embedder passes)."""
    return matched.local if isinstance(matched, PrefixMatch) else []


def block_manager(num_blocks: int, num_local_blocks: int | None, config: EngineConfig,
                  cfg: ModelConfig) -> BlockManager | GroupedBlockManager:  # fmt: skip
    """The engine's block manager over its pools (kv_pool_sizes): one, or a GroupedBlockManager when
    the model's windowed layers have a pool of their own (num_local_blocks)."""
    if num_local_blocks is None:
        return BlockManager(num_blocks, config.block_size, config.enable_prefix_caching, window=cfg.kv_window)
    return GroupedBlockManager(num_blocks, num_local_blocks, config.block_size, config.enable_prefix_caching,
                               cfg.local_window)  # type: ignore[arg-type]  # fmt: skip


def kv_context_bound(cfg: ModelConfig, dtype: torch.dtype, budget: int) -> int | None:
    """The most tokens one sequence's KV can hold in `budget` bytes: every token takes k and v in each
    full-attention layer, and at most the whole budget goes to them. None when every layer has a window
    (blocks behind it are released: the pool does not bound the context)."""
    if cfg.kv_window is not None:
        return None
    full_layers = sum(1 for i in range(cfg.num_layers) if cfg.kv_group(i) == 0)
    per_token = 2 * cfg.num_kv_heads * cfg.head_dim * dtype.itemsize * max(1, full_layers)
    return max(2, budget // per_token)


def kv_pool_sizes(model: CausalLM, config: EngineConfig, budget: int, max_len: int) -> tuple[int, int | None]:
    """(group 0's blocks, group 1's blocks or None: one pool) for `budget` bytes of KV cache.

    One pool: budget // (bytes of a block over every layer), at most what max_num_seqs sequences of
    max_len tokens hold at once. Two groups: the local pool gets min(what max_num_seqs sequences can
    hold at once under the window: max_num_seqs x blocks_needed(max_len, chunk, W) + 1, the blocks one
    pool would have had), so it never takes more than its layers' share of the budget; the full
    layers' pool gets all the rest. Neither pool is then smaller than the single pool was, and when
    the window binds the full pool is larger: the same budget serves a longer total context."""
    cfg = model.cfg
    bs, chunk, seqs = config.block_size, config.max_num_batched_tokens, config.max_num_seqs
    layer_block = 2 * bs * cfg.num_kv_heads * cfg.head_dim * config.torch_dtype.itemsize  # one layer's k + v
    one_pool = budget // (layer_block * cfg.num_layers)
    full_cap = seqs * blocks_needed(max_len, chunk, bs, cfg.kv_window) + 1
    window = cfg.local_window
    if window is None:
        return min(one_pool, full_cap), None
    num_local_layers = sum(cfg.kv_group(i) for i in range(cfg.num_layers))
    local = min(one_pool, seqs * blocks_needed(max_len, chunk, bs, window) + 1)
    full = (budget - local * layer_block * num_local_layers) // (layer_block * (cfg.num_layers - num_local_layers))
    if local == one_pool:  # an even split (the window does not bind): no rounding makes group 0 the larger,
        full = one_pool  # so the admission check of group 0's need covers group 1's too
    return min(full, full_cap), local
