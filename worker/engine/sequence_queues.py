"""SequenceQueues: where each of the scheduler's sequences is, and the moves that free its blocks.

A sequence waits (`waiting`, in admission order; preempted ones go back to its head), then runs in
the PersistentBatch (`prefilling` while more than one of its tokens is uncomputed), and leaves the
batch when it finishes, is preempted (recomputed later) or dropped with an error; one that leaves
with sampled tokens still in flight (overlapped steps) waits in `departed` until they arrive. Every
move out of the batch frees its KV blocks. Scheduler (scheduler.py) adds the per-step policy.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from worker.engine.batch_state import PersistentBatch
from worker.engine.block_manager import BlockManager
from worker.engine.kv_groups import GroupedBlockManager
from worker.engine.sequence import Sequence


class SequenceQueues:
    def __init__(self, block_manager: BlockManager | GroupedBlockManager, batch: PersistentBatch) -> None:
        self.bm = block_manager
        self.batch = batch
        self.waiting: deque[Sequence] = deque()
        self.prefilling: list[Sequence] = []  # running with > 1 uncomputed token, admission order
        self.departed: dict[int, Sequence] = {}  # seq_id -> left the batch with sampled tokens in flight

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
