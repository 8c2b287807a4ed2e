"""Forking a request's n > 1 choices from one prefill (the scheduler calls `fork` when choice 0's
last prompt chunk is scheduled).

The other choices take batch rows that share choice 0's KV blocks (reference counts up, nothing
copied), start with the same tokens computed, and sample their first token from the same logits row
(step_inputs repeats it once per choice), each with its own seed. If the prompt ends inside a block,
that block is shared but will be written by every choice: each row is marked copy-on-write, and the
first decode of each gets its own copy of the block (Scheduler._room; the last sharer keeps the
original). So the prompt is computed once, with or without the prefix cache. A choice that finds no
free row is returned to be queued as a sequence of its own (its prompt computed again, from the
prefix cache where it can); the scheduler admits a request with choices only when rows for all of
them are free, so that happens only when n > max_num_seqs (or after a preemption).
Preempting a forked choice is plain recompute: it rejoins as a sequence with its own tokens.
"""

from __future__ import annotations

from worker.engine.batch_state import PersistentBatch
from worker.engine.block_manager import BlockManager
from worker.engine.sequence import Sequence, SequenceStatus


def fork(parent: Sequence, bm: BlockManager, batch: PersistentBatch, max_rows: int, max_model_len: int,
         ) -> tuple[tuple[Sequence, ...], list[Sequence]]:  # fmt: skip
    """parent's forks -> (choices forked into rows now, choices left without a row)."""
    forked, left = [], []
    for child in parent.forks:
        if batch.num_active >= max_rows:
            child.num_cached_tokens = 0  # counted with the parent's prompt: never "admitted"
            left.append(child)
            continue
        bm.fork(parent, child)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens
        child.status = SequenceStatus.RUNNING
        row = batch.add(child, min(child.num_prompt_tokens + child.params.max_tokens, max_model_len))
        batch.num_pending[row] += 1  # its first token is sampled in this step
        batch.prefill_done(row)
        forked.append(child)
    parent.forks = []
    if forked and parent.num_computed_tokens % bm.block_size:  # a partial last block is shared
        for seq in (parent, *forked):
            batch.mark_cow(seq.row, True)
    return tuple(forked), left
