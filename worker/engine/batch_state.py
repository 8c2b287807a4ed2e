"""PersistentBatch: the running sequences' step state in preallocated arrays, one row each.

A sequence takes a row when it is admitted and keeps it until it finishes or is preempted (rows
never move, so a row index stays valid across steps in flight; the lowest free row is reused, so
the rows in use stay packed at the front). Everything a decode step reads (positions, the last
token, block tables, sampling parameters, stop ids) lives here, written when a row joins, leaves or
gets a block, so a steady decode step builds its inputs with a few numpy operations over the rows,
not a Python loop over the sequences. DeviceRows mirrors the arrays the device reads.

Token accounting per row: num_tokens = tokens on the host (len(seq.token_ids)); num_pending = tokens
scheduled to be sampled whose ids have not come back yet (0 or 1, 2 with overlapped steps); a row
decodes when exactly one of its num_tokens + num_pending tokens is not computed, and stops being
scheduled when num_tokens + num_pending reaches limit (max_tokens or the model's context).
"""

from __future__ import annotations

import heapq
import operator
from collections import deque
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

import numpy as np

from worker.engine.kv_groups import kv_groups
from worker.engine.sequence import Sequence

if TYPE_CHECKING:
    from worker.engine.lora.manager import LoraManager

_MASK64 = (1 << 64) - 1


def seed_keys(seed: int) -> tuple[int, int]:
    """Two 32-bit keys of a request's seed (splitmix64 of it); the sampler's counter-based uniforms
    are a hash of these and the token's index, so a row's draws depend on nothing else."""
    z = (seed + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return z & 0xFFFFFFFF, z >> 32


class PersistentBatch:
    """Host state of up to max_rows running sequences. Arrays are indexed by row; rows not in use
    hold stale values (seq_id -1, active False) that no step reads."""

    def __init__(self, max_rows: int, max_blocks: int, block_size: int, eos_token_ids: frozenset[int],
                 grouped: bool = False) -> None:  # fmt: skip
        self.max_rows = max_rows
        self.block_size = block_size
        self.eos = tuple(sorted(eos_token_ids))
        r = max_rows
        self.seqs: list[Sequence | None] = [None] * r
        self.token_lists: list[list[int]] = [[] for _ in range(r)]  # the seqs' token_ids lists, by row
        self.active = np.zeros(r, np.bool_)
        self.prefilling = np.zeros(r, np.bool_)  # until the chunk that reaches its last token
        self.seq_id = np.full(r, -1, np.int64)
        self.admitted_at = np.zeros(r, np.int64)  # admission counter: preemption takes the newest
        self.num_computed = np.zeros(r, np.int64)
        self.num_tokens = np.zeros(r, np.int64)
        self.num_pending = np.zeros(r, np.int64)
        self.num_prompt = np.zeros(r, np.int64)
        self.limit = np.zeros(r, np.int64)  # total tokens at which the sequence ends with "length"
        self.protected = np.zeros(r, np.int64)  # positions below are shared cached blocks: slot -1
        self.num_blocks = np.zeros(r, np.int64)
        self.released = np.zeros(r, np.int64)  # seq.num_released: leading blocks a sliding window left
        self.num_hashed = np.zeros(r, np.int64)  # len(seq.block_hashes)
        # the rows' block tables, one array per KV cache group (kv_groups.py: `block_table`, and with
        # grouped `local_table`, the local layers' of seq.local), the same width
        self.groups = kv_groups(grouped)
        self.block_table = np.zeros((r, max_blocks), np.int32)
        for g in self.groups[1:]:
            setattr(self, g.table, np.zeros((r, max_blocks), np.int32))
        self.last_token = np.zeros(r, np.int64)  # the row's newest token (device copy: newest sampled)
        # sampling, as the sampler's two matrices: fparams = (temperature (0 = greedy), top_p, min_p),
        # iparams = (top_k, key0, key1) with key0/key1 = seed_keys(seed); the named arrays are column views
        self.fparams = np.zeros((r, 3), np.float32)
        self.iparams = np.zeros((r, 3), np.int64)
        self.temperature, self.top_p, self.min_p = self.fparams[:, 0], self.fparams[:, 1], self.fparams[:, 2]
        self.top_k, self.key0, self.key1 = self.iparams[:, 0], self.iparams[:, 1], self.iparams[:, 2]
        self.stop_ids = np.full((r, max(1, len(self.eos))), -1, np.int64)  # EOS (unless ignored) + stop ids
        # logits processing (logits_processing.py): pparams = (presence, frequency, repetition penalty);
        # logit_bias as (token id, bias) pairs padded with (0, 0.0): adding 0 to token 0 changes nothing
        self.pparams = np.zeros((r, 3), np.float32)
        self.bias_ids = np.zeros((r, 1), np.int64)
        self.bias_values = np.zeros((r, 1), np.float32)
        self.min_tokens = np.zeros(r, np.int64)
        self.processed = np.zeros(r, np.bool_)  # penalties, logit_bias or min_tokens: logits change
        self.penalized = np.zeros(r, np.bool_)  # penalties: the row has token counts (PenaltyCounts)
        self.biased = np.zeros(r, np.bool_)
        self.num_processed = 0
        self.penalty_events: list[tuple[int, Sequence | None]] = []  # (row, seq joined) / (row, None: left)
        # the row's newest block is shared with forked choices (n > 1): copy it before writing into it
        self.cow = np.zeros(r, np.bool_)
        self.num_cow = 0
        # host-only per-row work after sampling
        self.has_stop_strings = np.zeros(r, np.bool_)
        self.logprobs_k = np.full(r, -1, np.int64)  # -1: no logprobs
        # a structured-output constraint or a thinking budget (SamplingParams.masked): masked, checked per token
        self.constrained = np.zeros(r, np.bool_)
        self.num_constrained = 0
        # the row's LoRA adapter: its slot on the device (-1: the base model), held from join to leave;
        # `loras` (set by the engine) swaps adapters in and counts their rows
        self.lora_slot = np.full(r, -1, np.int32)
        self.num_lora = 0
        self.loras: LoraManager | None = None
        self._free = list(range(r))  # a heap: the lowest free row first
        self._admissions = 0
        # bumped whenever the set of rows past their prefill changes (join, leave, prefill done), so
        # a steady decode step reuses the last decode rows instead of searching the arrays again
        self.version = 0
        self._past_prefill = (-1, np.zeros(0, np.int64))  # (version, active rows not prefilling)
        # rows whose sampled tokens need per-row host work: stop strings or logprobs (counts, so a
        # step without any skips looking); rows that draw (temperature > 0)
        self.num_special = 0
        self.num_drawing = 0
        # rows whose device copies are stale: joined (every mirrored array) / got blocks (block table)
        self.joined: set[int] = set()
        self.grew: set[int] = set()
        self.resized: set[str] = set()  # mirrored matrices that grew wider: device copies rebuilt

    # ---- membership ----------------------------------------------------------------------
    @property
    def num_active(self) -> int:
        return self.max_rows - len(self._free)

    def add(self, seq: Sequence, limit: int) -> int:
        """Give seq a row (its block table, counters and sampling parameters written); returns it."""
        if not self._free:
            raise RuntimeError("the persistent batch is full; the scheduler admits at most max_num_seqs")
        row = heapq.heappop(self._free)
        p = seq.params
        self.seqs[row] = seq
        self.token_lists[row] = seq.token_ids
        self.active[row] = True
        self.prefilling[row] = True
        self.seq_id[row] = seq.seq_id
        self.admitted_at[row] = self._admissions
        self._admissions += 1
        self.num_computed[row] = seq.num_computed_tokens  # read before seq.batch is set
        self.num_tokens[row] = len(seq.token_ids)
        self.num_pending[row] = 0
        self.num_prompt[row] = seq.num_prompt_tokens
        self.limit[row] = limit
        self.protected[row] = seq.protected_len
        self.num_hashed[row] = len(seq.block_hashes)
        self.released[row] = seq.num_released if seq.local is None else seq.local.num_released
        self.last_token[row] = seq.token_ids[-1]
        self.fparams[row] = (p.temperature, p.top_p, p.min_p)
        self.top_k[row] = p.top_k
        self.key0[row], self.key1[row] = seed_keys(seq.seed)
        self._put("stop_ids", row, tuple(p.stop_token_ids) + (() if p.ignore_eos else self.eos), -1)
        self.pparams[row] = (p.presence_penalty, p.frequency_penalty, p.repetition_penalty)
        self._put("bias_ids", row, [t for t, _ in p.logit_bias], 0)
        self._put("bias_values", row, [v for _, v in p.logit_bias], 0.0)
        self.min_tokens[row] = p.min_tokens
        self.processed[row], self.penalized[row], self.biased[row] = p.processed, p.penalized, bool(p.logit_bias)
        self.num_processed += p.processed
        if p.penalized:
            self.penalty_events.append((row, seq))
        self.cow[row] = False
        self.has_stop_strings[row] = bool(p.stop)
        self.logprobs_k[row] = -1 if p.logprobs is None else p.logprobs
        self.constrained[row] = p.masked
        self.num_constrained += p.masked
        self.num_special += bool(p.stop) or p.logprobs is not None
        self.num_drawing += p.temperature > 0
        if seq.adapter >= 0:
            self.lora_slot[row] = self.loras.acquire(seq.adapter)  # type: ignore[union-attr]
            self.num_lora += 1
        self.num_blocks[row] = 0
        self.sync_blocks(seq, row)
        seq.batch, seq.row = self, row
        self.joined.add(row)
        self.version += 1
        return row

    def remove(self, seq: Sequence) -> None:
        """Free seq's row; its counters move back to the Sequence (pending ones to seq.in_flight)."""
        row = seq.row
        seq.batch, seq.row = None, -1
        seq._num_computed = int(self.num_computed[row])
        seq.in_flight = int(self.num_pending[row])
        self.seqs[row] = None
        self.token_lists[row] = []
        self.active[row] = False
        self.seq_id[row] = -1
        self.num_special -= bool(self.has_stop_strings[row]) or self.logprobs_k[row] >= 0
        self.num_constrained -= bool(self.constrained[row])
        self.constrained[row] = False
        self.num_drawing -= self.temperature[row] > 0
        self.num_processed -= bool(self.processed[row])
        if self.penalized[row]:
            self.penalty_events.append((row, None))
        self.num_cow -= bool(self.cow[row])
        self.cow[row] = False
        if self.lora_slot[row] >= 0:
            self.loras.release(int(self.lora_slot[row]))  # type: ignore[union-attr]
            self.lora_slot[row] = -1
            self.num_lora -= 1
        heapq.heappush(self._free, row)
        self.version += 1

    def prefill_done(self, row: int) -> None:
        """The row's last prompt chunk is scheduled: from now on it decodes."""
        self.prefilling[row] = False
        self.version += 1

    # ---- updates -------------------------------------------------------------------------
    def sync_blocks(self, seq: Sequence, row: int | None = None) -> None:
        """Copy the blocks seq.block_table gained since the last call into its row."""
        row = seq.row if row is None else row
        have, table = int(self.num_blocks[row]), seq.block_table
        if len(table) > have:
            for g in self.groups:
                getattr(self, g.table)[row, have : len(table)] = g.blocks(seq)[have:]
            self.num_blocks[row] = len(table)
            self.grew.add(row)

    def trim_blocks(self, seq: Sequence) -> None:
        """seq gave blocks back (BlockManager.truncate): its row's table ends where seq's does (entries
        past it are stale and never read)."""
        self.num_blocks[seq.row] = len(seq.block_table)

    def set_block(self, row: int, index: int, block: int, group: int = 0) -> None:
        """Block `index` of the row in KV cache group `group` was replaced (its own copy of a shared
        block)."""
        getattr(self, self.groups[group].table)[row, index] = block
        self.grew.add(row)

    def mark_cow(self, row: int, on: bool) -> None:
        """on: the row's newest block is shared with its forks; copy it before the next write."""
        self.num_cow += int(on) - int(self.cow[row])
        self.cow[row] = on

    def _put(self, name: str, row: int, values: Seq[float], fill: float) -> None:
        """Write a row of a padded matrix, widening the matrix (for every row) when values do not fit."""
        have = getattr(self, name)
        if len(values) > have.shape[1]:
            wider = np.full((self.max_rows, len(values)), fill, have.dtype)
            wider[:, : have.shape[1]] = have
            setattr(self, name, wider)
            self.resized.add(name)
            have = wider
        have[row] = fill
        have[row, : len(values)] = values

    def append_tokens(self, rows: np.ndarray, ids: list[int], ascending: bool = False) -> None:
        """The host received ids[i] for rows[i] (all active): appended to their sequences' token lists
        (C-level map, no per-row Python bytecode) and counted."""
        at = self.span(rows, ascending)
        if len(rows) == 1:
            self.token_lists[int(rows[0])].append(ids[0])
        elif len(rows):
            lists = self.token_lists[at] if isinstance(at, slice) else operator.itemgetter(*rows.tolist())(self.token_lists)
            deque(map(list.append, lists, ids), maxlen=0)
        self.num_tokens[at] += 1
        self.num_pending[at] -= 1

    # ---- queries -------------------------------------------------------------------------
    def decode_rows(self) -> np.ndarray:
        """Active rows (ascending) past their prefill with room for another token: the rows a decode
        step runs. (A row past its prefill always has exactly one token not computed: its newest,
        maybe still being sampled.) Rows whose last token is in flight are left out (overlap)."""
        version, rows = self._past_prefill
        if version != self.version:
            rows = np.flatnonzero(self.active & ~self.prefilling)
            self._past_prefill = (self.version, rows)
        if rows.size and int(rows[-1]) == rows.size - 1:  # packed at the front: views, not gathers
            room = self.num_computed[: rows.size] + 1 < self.limit[: rows.size]
        else:
            room = self.num_computed[rows] + 1 < self.limit[rows]
        return rows if room.all() else rows[room]

    @staticmethod
    def span(rows: np.ndarray, ascending: bool = True) -> slice | np.ndarray:
        """An index for `rows` (distinct; ascending unless told otherwise): the slice [0, n) when they
        are exactly the first n rows (numpy views instead of gathers: the common, packed case), else
        the rows themselves."""
        n = rows.size
        return slice(0, n) if ascending and n and int(rows[-1]) == n - 1 else rows

    def sequences(self, rows: np.ndarray) -> list[Sequence]:
        return [self.seqs[r] for r in rows.tolist()]  # type: ignore[misc]

    def check_row(self, seq: Sequence) -> None:
        """Raise AssertionError if seq's row disagrees with the sequence (tests, debugging)."""
        r = seq.row
        want = {
            "seq_id": seq.seq_id, "num_tokens": len(seq.token_ids), "num_prompt": seq.num_prompt_tokens,
            "protected": seq.protected_len, "num_blocks": len(seq.block_table),
            "released": seq.num_released if seq.local is None else seq.local.num_released,
            "num_hashed": len(seq.block_hashes), "temperature": np.float32(seq.params.temperature),
            "top_k": seq.params.top_k, "top_p": np.float32(seq.params.top_p), "min_p": np.float32(seq.params.min_p),
            "min_tokens": seq.params.min_tokens, "processed": seq.params.processed,
        }  # fmt: skip
        for name, value in want.items():
            if getattr(self, name)[r] != value:
                raise AssertionError(f"row {r} {name}: {getattr(self, name)[r]} != {value}")
        for g in self.groups:
            if getattr(self, g.table)[r, : len(seq.block_table)].tolist() != g.blocks(seq):
                raise AssertionError(f"row {r} {g.table} differs from the sequence's")
        if self.token_lists[r] is not seq.token_ids or not self.active[r] or self.seqs[r] is not seq:
            raise AssertionError(f"row {r} does not point at its sequence")
        total = self.num_tokens[r] + self.num_pending[r]
        if not self.prefilling[r] and self.num_computed[r] != total - 1:
            raise AssertionError(f"row {r} is past its prefill but has {total - self.num_computed[r]} tokens to compute")
