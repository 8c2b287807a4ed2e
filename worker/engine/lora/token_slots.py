"""The adapter slot of each token of a step, in step_inputs' layout, for LoraStep.set."""

from __future__ import annotations

import numpy as np

from worker.engine.batch_state import PersistentBatch
from worker.engine.scheduler_output import SchedulerOutput


def step_slots(sched: SchedulerOutput, batch: PersistentBatch) -> np.ndarray | None:
    """The adapter slot of each of the step's tokens, in step_inputs' layout (prefill chunks, then
    decode rows, then verify runs), or None when none has an adapter."""
    if not batch.num_lora:
        return None
    parts = []
    if sched.chunks:
        rows = [c.seq.row for c in sched.chunks]
        parts.append(np.repeat(batch.lora_slot[rows], [c.num_tokens for c in sched.chunks]))
    if sched.decode_rows.size:
        parts.append(batch.lora_slot[sched.decode_rows])
    if sched.spec:
        rows = [c.seq.row for c in sched.spec]
        parts.append(np.repeat(batch.lora_slot[rows], [c.num_tokens for c in sched.spec]))
    slots = np.concatenate(parts) if len(parts) > 1 else parts[0]
    return slots if (slots >= 0).any() else None
