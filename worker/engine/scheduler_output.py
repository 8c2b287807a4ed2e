"""SchedulerOutput: what one step computes, as the scheduler planned it (scheduler.py) for the model
runner (step_inputs.py) and the step's outputs (step_output.py): prefill chunks, decode rows,
speculation's verify runs, KV block copies, and the sequences admitted, errored or preempted."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from worker.engine.sequence import Sequence

NO_ROWS = np.zeros(0, np.int64)


@dataclass(frozen=True, kw_only=True)
class ScheduledChunk:
    """seq computes positions [start, start + num_tokens) this step; `samples`: the chunk reaches the
    sequence's last token, so its logits yield the next one. Positions [prompt_first, prompt_end)
    have their logits scored for prompt_logprobs (each scores the prompt token after it)."""

    seq: Sequence
    start: int
    num_tokens: int
    samples: bool
    prompt_first: int = 0
    prompt_end: int = 0
    forks: tuple[Sequence, ...] = ()  # choices forked now: they sample from this chunk's last logits too
    # speculation (SchedulerOutput.spec): seq's newest token then these proposed tokens, positions
    # start..start+K, each run as a decode row of seq and verified (speculation/verifier.py)
    draft: tuple[int, ...] = ()


@dataclass(slots=True, kw_only=True)
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)  # prefill part: admitted / prefilling
    decode_rows: np.ndarray = field(default_factory=lambda: NO_ROWS)  # batch rows decoding, ascending
    decode_positions: np.ndarray = field(default_factory=lambda: NO_ROWS)  # the position each computes
    errored: list[Sequence] = field(default_factory=list)  # finished with "error" while scheduling
    admitted: list[Sequence] = field(default_factory=list)  # admitted for the first time this step
    num_preempted: int = 0
    copies: list[tuple[int, int, int]] = field(default_factory=list)  # KV blocks to copy first: (group, src, dst)
    spec: list[ScheduledChunk] = field(default_factory=list)  # speculation's verify runs (decode rows)

    @property
    def num_prefill_tokens(self) -> int:
        """Prompt (or recomputed) tokens this step: the chunks, except single-token chunks of
        sequences that already generated (those are decodes resumed after a preemption)."""
        return sum(c.num_tokens for c in self.chunks if c.num_tokens > 1 or c.seq.num_output_tokens == 0)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks) + len(self.decode_rows) + sum(c.num_tokens for c in self.spec)
