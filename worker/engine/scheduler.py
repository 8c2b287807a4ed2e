"""Scheduler: continuous batching under a token budget, chunked prefill, preemption by recompute.

Each step: (1) running sequences in decode (one uncomputed token) are scheduled first, so decode
never starves (max_num_batched_tokens >= max_num_seqs); (2) running sequences in the middle of a
prefill get the remaining budget as chunks; (3) waiting sequences are admitted in order while
budget, sequence slots and KV blocks last. When a running sequence needs a block and none is free,
others are preempted (those mid-prefill first, then decodes, newest first): their blocks are freed
and they go back to the head of the queue to be recomputed (their full blocks usually survive in the prefix cache).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from worker.engine.block_manager import BlockManager
from worker.engine.config import EngineConfig
from worker.engine.sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class ScheduledChunk:
    """seq computes positions [start, start + num_tokens) this step."""

    seq: Sequence
    start: int
    num_tokens: int

    @property
    def samples(self) -> bool:
        """The chunk reaches the last token, so its logits yield the next token."""
        return self.start + self.num_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)  # multi-token chunks first
    errored: list[Sequence] = field(default_factory=list)  # finished with "error" while scheduling
    admitted: list[Sequence] = field(default_factory=list)  # admitted for the first time this step
    num_preempted: int = 0


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.bm = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: later = lower priority
        # Blocks kept free at admission so running sequences can grow without instant preemption.
        self.watermark = block_manager.num_blocks // 100

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        decodes = [s for s in self.running if s.num_uncomputed_tokens == 1]
        prefills = [s for s in self.running if s.num_uncomputed_tokens > 1]
        queue = decodes + prefills
        scheduled: list[ScheduledChunk] = []
        i = 0
        while i < len(queue) and budget > 0:
            seq = queue[i]
            n = min(seq.num_uncomputed_tokens, budget)
            while not self.bm.append_slots(seq, seq.num_computed_tokens + n):
                if len(queue) > i + 1:
                    self._preempt(queue.pop())
                    out.num_preempted += 1
                elif scheduled:
                    self._preempt(queue.pop())  # seq itself waits for blocks held by the others
                    out.num_preempted += 1
                    break
                else:
                    self._drop(
                        seq, "the KV cache is too small for this sequence to grow; raise kv_cache_bytes"
                    )
                    out.errored.append(queue.pop(i))
                    break
            else:
                scheduled.append(self._take(seq, n))
                budget -= n
                i += 1
        if not out.num_preempted:
            budget = self._admit(scheduled, budget, out)
        # Multi-token chunks first (prefill attention), then single tokens (decode attention).
        out.chunks = [c for c in scheduled if c.num_tokens > 1] + [c for c in scheduled if c.num_tokens == 1]
        return out

    def _admit(self, scheduled: list[ScheduledChunk], budget: int, out: SchedulerOutput) -> int:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if self.bm.blocks_for(seq.num_tokens + 1) > self.bm.num_blocks:
                self.waiting.popleft()
                self._drop(seq, f"needs {self.bm.blocks_for(seq.num_tokens + 1)} KV blocks; the cache holds "
                           f"{self.bm.num_blocks}; raise kv_cache_bytes or shorten the prompt")  # fmt: skip
                out.errored.append(seq)
                continue
            matched, hashes = self.bm.match_prefix(seq)
            if self.bm.next_block_pending(matched, hashes):
                break  # its prefix is being computed now: admit next step and reuse it
            if not self.bm.can_allocate(seq, matched, self.watermark if self.running else 0):
                break
            self.waiting.popleft()
            self.bm.allocate(seq, matched, hashes)
            if seq.num_cached_tokens is None:
                seq.num_cached_tokens = min(seq.num_computed_tokens, seq.num_prompt_tokens)
                out.admitted.append(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            n = min(seq.num_uncomputed_tokens, budget)
            scheduled.append(self._take(seq, n))
            budget -= n
        return budget

    def _take(self, seq: Sequence, n: int) -> ScheduledChunk:
        chunk = ScheduledChunk(seq, seq.num_computed_tokens, n)
        seq.num_computed_tokens += n
        self.bm.commit_computed(seq)
        return chunk

    def _preempt(self, seq: Sequence) -> None:
        self.bm.free(seq)
        seq.reset_for_recompute()
        self.running.remove(seq)
        self.waiting.appendleft(seq)

    def _drop(self, seq: Sequence, message: str) -> None:
        if seq in self.running:
            self.bm.free(seq)
            self.running.remove(seq)
        seq.finish("error", message)

    def finish(self, seq: Sequence) -> None:
        """Release a sequence that the engine has marked finished."""
        self.bm.free(seq)
        self.running.remove(seq)

    def abort_all(self) -> list[Sequence]:
        """Drop every unfinished sequence (blocks freed); returns them."""
        dropped = list(self.running) + list(self.waiting)
        for seq in self.running:
            self.bm.free(seq)
        for seq in dropped:
            seq.finish("cancelled")
        self.running.clear()
        self.waiting.clear()
        return dropped
