"""Scheduler: continuous batching under a token budget, chunked prefill, preemption by recompute.

Each step: (1) every running sequence with one uncomputed token decodes: the rows are found with numpy
over the PersistentBatch, and only rows that cross into a new KV block run Python (to get a block),
so a steady decode step costs O(rows that changed), not O(batch); (2) running sequences in the middle
of a prefill get the remaining budget as chunks; (3) waiting sequences are admitted in order while
budget, rows and KV blocks last. Decode never starves (max_num_batched_tokens >= max_num_seqs). When
a running sequence needs a block and none is free, others are preempted (those mid-prefill first,
then decodes, newest first): their blocks are freed and they go back to the head of the queue to be
recomputed (their full blocks usually survive in the prefix cache). On a model whose every layer
has the same sliding window (BlockManager.window), a sequence admitted gets blocks for its first
chunk only, and each step first releases the blocks its window has left (decode rows picked with
numpy, like block growth), so it holds a bounded number of blocks however long it grows. A model
mixing full and windowed layers does the same through a GroupedBlockManager (kv_groups.py): its
full layers' blocks are all kept, its local layers' (a pool of their own) released the same way.

Where each sequence is: it waits (`waiting`, in admission order; preempted ones go back to its
head), then runs in the PersistentBatch (`prefilling` while more than one of its tokens is
uncomputed), and leaves the batch when it finishes, is preempted (recomputed later) or dropped with
an error; every move out of the batch frees its KV blocks (`_leave`).

A sequence scheduled to sample counts the token it will get at once (num_pending), so the next step
can be scheduled before this one's tokens reach the host (overlapped steps): its decode input is then
the sampled id the device already holds. A sequence that leaves the batch with tokens still in flight
is kept in `departed` until they arrive. A request's n > 1 choices fork from its prefill (fork.py): a forked row's first
write into a shared block takes its own copy first (`_room`: the block manager's copy_on_write, in
every KV cache group at once; `out.copies`). The step's plan: scheduler_output.py.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from worker.engine.batch_state import PersistentBatch
from worker.engine.block_manager import BlockManager
from worker.engine.config import EngineConfig
from worker.engine.fork import fork
from worker.engine.kv_groups import GroupedBlockManager
from worker.engine.scheduler_output import ScheduledChunk, SchedulerOutput
from worker.engine.sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager | GroupedBlockManager, batch: PersistentBatch,
                 max_model_len: int) -> None:  # fmt: skip
        self.bm = block_manager
        self.batch = batch
        self.waiting: deque[Sequence] = deque()
        self.prefilling: list[Sequence] = []  # running with > 1 uncomputed token, admission order
        self.departed: dict[int, Sequence] = {}  # seq_id -> left the batch with sampled tokens in flight
        self.config = config
        self.max_model_len = max_model_len
        # Blocks kept free at admission so running sequences can grow without instant preemption.
        self.watermark = block_manager.num_blocks // 100

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting) or self.batch.num_active > 0

    @property
    def running(self) -> list[Sequence]:
        """The running sequences in admission order (tests, debugging; not on the hot path)."""
        b = self.batch
        rows = np.flatnonzero(b.active)
        return b.sequences(rows[np.argsort(b.admitted_at[rows], kind="stable")])

    # ---- one step ------------------------------------------------------------------------
    def schedule(self, proposals: list[tuple[int, list[int]]] | None = None) -> SchedulerOutput:
        """The step's plan. `proposals`: speculation's (decode row, proposed tokens) to verify this step
        (Speculator.plan, over decode_rows() within the step's budget beyond one token per row)."""
        out = SchedulerOutput()
        b = self.batch
        budget = self.config.max_num_batched_tokens
        rows = b.decode_rows()
        if proposals:
            rows, budget = self._speculate(rows, budget, out, proposals)
        if rows.size:
            bs = self.bm.block_size
            at = b.span(rows)
            positions = b.num_computed[at]
            if self.bm.window is not None:  # before growing: the blocks freed here can serve it
                self._release_rows(rows, positions, at)
            grow = positions >= b.num_blocks[at] * bs
            if b.num_cow:  # forked rows whose next write goes into a shared block
                grow |= b.cow[at]
            if grow.any():
                self._grow(rows[grow], rows, out)
                rows = rows[b.active[rows]]  # preempted and dropped rows left the batch
                at = b.span(rows)
                positions = b.num_computed[at]
            if isinstance(at, slice):
                positions = positions.copy()  # a view would follow the increment below
            b.num_computed[at] += 1
            b.num_pending[at] += 1
            out.decode_rows, out.decode_positions = rows, positions
            budget -= rows.size
            if self.bm.enable_prefix_caching:  # blocks this step fills, where the host has their tokens
                full = rows[(positions + 1) % bs == 0]
                if full.size:
                    self.commit_rows(full)
        for seq in list(self.prefilling) if self.prefilling else ():
            if budget <= 0:
                break
            if seq.batch is None:  # preempted above
                continue
            n = min(seq.num_uncomputed_tokens, budget)
            if self.bm.window is not None:
                self._release(seq, seq.num_computed_tokens)
            while not self.bm.append_slots(seq, seq.num_computed_tokens + n):
                newest = self.prefilling[-1]
                victim = newest if newest is not seq else None
                waits = victim is None and bool(out.chunks or out.decode_rows.size or out.spec)
                if not self._no_room(seq, victim, waits, out):
                    break
            else:
                b.sync_blocks(seq)
                out.chunks.append(self._take(seq, n))
                budget -= n
        if self.waiting and not out.num_preempted:
            self._admit(budget, out)
        return out

    def _release_rows(self, rows: np.ndarray, positions: np.ndarray, at: slice | np.ndarray) -> None:
        """Decode rows (computing `positions`) whose window has left a block since their last release
        give it back; numpy finds them (a row does once every block_size steps)."""
        b, bm = self.batch, self.bm
        due = (positions - bm.window + 1) // bm.block_size > b.released[at]
        if due.any():
            for r, pos in zip(rows[due].tolist(), positions[due].tolist(), strict=True):
                self._release(b.seqs[r], pos)

    def _release(self, seq: Sequence, position: int) -> None:
        if self.bm.release_behind(seq, position):
            self.batch.released[seq.row] = self.bm.released(seq)

    def _speculate(self, rows: np.ndarray, budget: int, out: SchedulerOutput,
                   proposals: list[tuple[int, list[int]]]) -> tuple[np.ndarray, int]:  # fmt: skip
        """Decode rows with proposals verify them (their newest token + K proposed tokens as 1 + K
        decode rows of the sequence, blocks for all of them taken now; the blocks of rejected tokens
        are given back when the step is applied); returns the decode rows left and the budget left.
        Blocks are taken only while the decode rows' growth stays covered, so speculation never
        causes a preemption."""
        b, bm = self.batch, self.bm
        spare = bm.num_free_blocks - self.watermark - rows.size
        spec = []
        for r, draft in proposals:
            seq = b.seqs[r]
            pos = int(b.num_computed[r])  # seq's newest token, on the host (no step in flight)
            if bm.window is not None:  # as a decode row would: the blocks its window left go first
                self._release(seq, pos)
            need = bm.blocks_for(pos + 1 + len(draft)) - len(seq.block_table)
            if need > spare or not bm.append_slots(seq, pos + 1 + len(draft)):
                continue
            spare -= need
            b.sync_blocks(seq)
            b.num_computed[r] += 1  # as a decode row: the newest token's K/V; accepted ones are added later
            b.num_pending[r] += 1
            out.spec.append(ScheduledChunk(seq=seq, start=pos, num_tokens=1 + len(draft), samples=True, draft=tuple(draft)))
            budget -= 1 + len(draft)
            spec.append(r)
        if len(spec) == rows.size:  # every row verifies (batch 1's common case)
            rows = rows[:0]
        elif spec:  # rows ascending, spec a subsequence of them
            keep = np.ones(rows.size, bool)
            keep[np.searchsorted(rows, spec)] = False
            rows = rows[keep]
        return rows, budget

    def _grow(self, grow: np.ndarray, rows: np.ndarray, out: SchedulerOutput) -> None:
        """Give each row of `grow` (decode rows whose next position needs a new block, or their own copy
        of a shared one) its block, in admission order, preempting newer sequences (prefilling first)
        when none is free."""
        b = self.batch
        for r in grow[np.argsort(b.admitted_at[grow], kind="stable")].tolist():
            if not b.active[r]:  # preempted for an older row's block
                continue
            seq = b.seqs[r]
            while not self._room(seq, r, out):
                victim = self._newest_after(rows, int(b.admitted_at[r]))
                # without a victim, seq waits for the blocks of the older decodes scheduled
                waits = victim is None and bool((b.active[rows] & (b.admitted_at[rows] < b.admitted_at[r])).any())
                if not self._no_room(seq, victim, waits, out):
                    break
            else:
                b.sync_blocks(seq)

    def _no_room(self, seq: Sequence, victim: Sequence | None, waits: bool, out: SchedulerOutput) -> bool:
        """seq found no free block: preempt `victim`, a newer sequence, and try again (True). Without
        one, seq stops trying (False): preempted when it `waits` for blocks the others scheduled this
        step hold, else dropped, since nothing would ever free enough for it."""
        if victim is not None:
            self._preempt(victim)
            out.num_preempted += 1
            return True
        if waits:
            self._preempt(seq)
            out.num_preempted += 1
        else:
            self._drop(seq, "the KV cache is too small for this sequence to grow; raise kv_cache_bytes")
            out.errored.append(seq)
        return False

    def _room(self, seq: Sequence, r: int, out: SchedulerOutput) -> bool:
        """A block for row r's next position: a new one, or its own copy of one shared with its forks
        (copy-on-write; the sharer that writes last keeps the original). False: no block is free."""
        pos = int(self.batch.num_computed[r])
        if not self.bm.append_slots(seq, pos + 1):
            return False
        if self.batch.cow[r]:
            index = pos // self.bm.block_size
            copies = self.bm.copy_on_write(seq, index)  # per KV cache group (kv_groups.py)
            if copies is None:
                return False
            for group, old, new in copies:
                out.copies.append((group, old, new))
                self.batch.set_block(r, index, new, group)
            self.batch.mark_cow(r, False)
        return True

    def _newest_after(self, rows: np.ndarray, admitted_at: int) -> Sequence | None:
        """The preemption victim for a decode row admitted at `admitted_at`: the newest prefilling
        sequence, else the newest decode row admitted after it, else None."""
        if self.prefilling:
            return self.prefilling[-1]
        b = self.batch
        live = rows[b.active[rows]]
        if live.size:
            newest = live[np.argmax(b.admitted_at[live])]
            if b.admitted_at[newest] > admitted_at:
                return b.seqs[newest]
        return None

    def _admit(self, budget: int, out: SchedulerOutput) -> None:
        b = self.batch
        while self.waiting and budget > 0 and b.num_active < self.config.max_num_seqs:
            seq = self.waiting[0]
            if seq.in_flight:  # preempted with a token on its way: admit once it has arrived
                break
            if seq.forks and b.num_active and b.num_active + 1 + len(seq.forks) > self.config.max_num_seqs:
                break  # rows for every choice (an empty batch forks what fits: _fork)
            if seq.adapter >= 0 and not b.loras.available(seq.adapter):  # type: ignore[union-attr]
                break  # every LoRA slot is held by running sequences of other adapters
            why = self.bm.never_fits(seq.num_tokens + 1, self.config.max_num_batched_tokens)
            if why is not None:
                self.waiting.popleft()
                self._drop(seq, f"{why}; raise kv_cache_bytes or shorten the prompt")
                out.errored.append(seq)
                continue
            matched, hashes = self.bm.match_prefix(seq)
            if self.bm.next_block_pending(matched, hashes):
                break  # its prefix is being computed now: admit next step and reuse it
            upto = None  # blocks for every token; with a window, for the first chunk's only
            if self.bm.window is not None:
                upto = min(seq.num_tokens, min(len(matched) * self.bm.block_size, seq.num_tokens - 1) + budget)
            if not self.bm.can_allocate(seq, matched, self.watermark if b.num_active else 0, upto):
                break
            self.waiting.popleft()
            self.bm.allocate(seq, matched, hashes, upto)
            if seq.num_cached_tokens is None:
                seq.num_cached_tokens = min(seq.num_computed_tokens, seq.num_prompt_tokens)
                out.admitted.append(seq)
            seq.status = SequenceStatus.RUNNING
            b.add(seq, min(seq.num_prompt_tokens + seq.params.max_tokens, self.max_model_len))
            self.prefilling.append(seq)  # until the chunk that reaches its last token
            n = min(seq.num_uncomputed_tokens, budget)
            out.chunks.append(self._take(seq, n))
            budget -= n

    def _take(self, seq: Sequence, n: int) -> ScheduledChunk:
        start = seq.num_computed_tokens
        end = start + n
        seq.num_computed_tokens = end
        samples = end == len(seq.token_ids) + seq.num_pending
        if samples:
            self.batch.num_pending[seq.row] += 1
            self.batch.prefill_done(seq.row)
            self.prefilling.remove(seq)
        first = last = 0
        if seq.prompt_logprobs is not None:
            first, last = max(start, seq.prompt_scored), min(end, seq.num_prompt_tokens - 1)
            if first < last:
                seq.prompt_scored = last
            else:
                first = last = 0
        self._commit(seq)
        forks = self._fork(seq) if samples and seq.forks else ()
        return ScheduledChunk(seq=seq, start=start, num_tokens=n, samples=samples, prompt_first=first, prompt_end=last,
                              forks=forks)

    def _fork(self, parent: Sequence) -> tuple[Sequence, ...]:
        """parent's other choices take rows sharing its blocks (fork.py); those without a row wait."""
        forked, left = fork(parent, self.bm, self.batch, self.config.max_num_seqs, self.max_model_len)
        self.waiting.extendleft(reversed(left))
        return forked

    # ---- leaving the batch ---------------------------------------------------------------
    def _leave(self, seq: Sequence) -> None:
        self.bm.free(seq)
        self.batch.remove(seq)
        if seq in self.prefilling:
            self.prefilling.remove(seq)
        if seq.in_flight:
            self.departed[seq.seq_id] = seq

    def _preempt(self, seq: Sequence) -> None:
        self._leave(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)

    def _drop(self, seq: Sequence, message: str) -> None:
        if seq.batch is not None:
            self._leave(seq)
        seq.finish("error", message)
        for child in seq.forks:  # choices not forked yet share the parent's fate
            child.finish("error", message)
        seq.forks = []

    def finish(self, seq: Sequence) -> None:
        """Release a sequence the engine has marked finished: running, or preempted while its last
        token was in flight (then it waits in the queue)."""
        if seq.batch is not None:
            self._leave(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def abort_all(self) -> list[Sequence]:
        """Drop every unfinished sequence (blocks freed); returns them."""
        dropped = self.running + list(self.waiting)
        for seq in self.running:
            self._leave(seq)
        for seq in dropped:
            seq.in_flight = 0
            seq.finish("cancelled")
        self.prefilling.clear()
        self.waiting.clear()
        self.departed.clear()
        return dropped

    # ---- prefix cache --------------------------------------------------------------------
    def commit_rows(self, rows: np.ndarray) -> None:
        """Hash and cache the newly full blocks of these rows, where the host has their tokens."""
        b = self.batch
        upto = np.minimum(b.num_computed[rows], b.num_tokens[rows])
        for r in rows[upto // self.bm.block_size > b.num_hashed[rows]].tolist():
            self._commit(b.seqs[r])

    def commit_row(self, row: int) -> None:
        """commit_rows for one row (speculation's verified rows), without numpy's per-call cost."""
        b = self.batch
        if min(int(b.num_computed[row]), int(b.num_tokens[row])) // self.bm.block_size > b.num_hashed[row]:
            self._commit(b.seqs[row])

    def _commit(self, seq: Sequence) -> None:
        self.bm.commit_computed(seq, min(seq.num_computed_tokens, len(seq.token_ids)))
        self.batch.num_hashed[seq.row] = len(seq.block_hashes)
