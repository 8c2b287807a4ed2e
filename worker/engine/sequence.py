"""Sequence: one request's tokens, KV blocks and decoding state as it moves through the engine."""

from __future__ import annotations

import enum
from typing import Any, Protocol

import numpy as np

from contracts.sampling import SamplingParams
from worker.engine.constraint_state import ConstraintState
from worker.engine.reasoning_state import ReasoningState


class BatchRows(Protocol):
    """What a running sequence reads of the engine's PersistentBatch (batch_state.py, which imports
    this module): its row's counters. Int arrays [max_num_seqs]."""

    num_computed: np.ndarray
    num_pending: np.ndarray


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """token_ids = prompt + the generated tokens the host has received so far. Invariants:

    - tokens [0, num_computed_tokens) have K/V in the cache (or are scheduled in a step in flight);
    - block_table covers at least num_computed_tokens tokens (block i holds positions i*B..i*B+B-1);
      its first num_released entries were released (a sliding window left them: block_manager.py);
      a model with two KV cache groups keeps the local layers' table in `local` (kv_groups.py);
    - block_hashes[i] is the chained hash of full block i, for the computed full blocks;
    - planned_hashes: hashes of the full blocks this sequence will compute (from its tokens at
      admission); those past len(block_hashes) are "pending" in the block manager.

    While the sequence runs it owns a row of the engine's PersistentBatch (`row`), which then holds
    its step counters (num_computed_tokens reads through to it) and the tokens it has been scheduled
    to sample but whose ids have not reached the host yet (`num_pending`).
    """

    __slots__ = (
        "seq_id", "index", "params", "token_ids", "num_prompt_tokens", "status", "_num_computed",
        "block_table", "num_released", "block_hashes", "planned_hashes", "protected_len", "num_cached_tokens", "seed",
        "finish_reason", "error", "logprobs", "prompt_logprobs", "prompt_scored", "text", "batch", "row",
        "in_flight", "choice", "forks", "group", "constraint_state", "spec", "local", "rope_offset", "adapter",
        "cache_salt",
    )  # fmt: skip

    def __init__(
        self, seq_id: int, index: int, prompt_token_ids: list[int], params: SamplingParams, seed: int
    ) -> None:
        self.seq_id = seq_id
        self.index = index  # position in the caller's prompt list
        self.params = params
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.status = SequenceStatus.WAITING
        self._num_computed = 0
        self.block_table: list[int] = []
        self.num_released = 0  # leading block_table entries no longer held (sliding window)
        self.block_hashes: list[int] = []
        self.planned_hashes: list[int] = []
        self.protected_len = 0  # positions < this are in shared cached blocks: never written
        self.num_cached_tokens: int | None = None  # prefix-cache hit at first admission
        self.seed = seed % 2**63  # any int seed, folded into [0, 2**63)
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.logprobs: list[dict[int, float]] | None = [] if params.logprobs is not None else None
        self.prompt_logprobs: list[float | None] | None = [None] if params.prompt_logprobs else None
        # prompt positions whose logits were scheduled for prompt_logprobs (they score position + 1)
        self.prompt_scored = 0
        self.text: str | None = None  # set when the request finishes (or for stop-string checks)
        self.batch: BatchRows | None = None  # set while running
        self.row = -1
        # sampled tokens of steps in flight after the sequence left the batch (preempted or finished)
        self.in_flight = 0
        # n > 1: every choice of a request is a Sequence of one `group` (index order); choice 0 prefills
        # and, when its last prompt chunk is scheduled, the others (`forks`, until then) take rows that
        # share its KV blocks and sample from the same logits (scheduler._fork)
        self.choice = 0
        self.forks: list[Sequence] = []
        self.group: list[Sequence] | None = None
        # the position in params.constraint's grammar (a ConstraintState; a ReasoningState for a thinking
        # row with a budget or a constraint: structured_outputs.py), made on the first masked
        # step; it holds exactly the generated tokens, which preemption keeps, so it never rewinds
        self.constraint_state: ConstraintState | ReasoningState | None = None
        self.spec: object | None = None  # speculation's per-sequence state (speculation/speculator.py)
        # the local layers' block table of a model with two KV cache groups (kv_groups.LocalTable)
        self.local: Any = None
        # added to the positions of this sequence's prefill chunks to get their rotary rows: the LongRoPE
        # all-long half for a prompt longer than the threshold (CausalLM.rope_offset, set at creation from
        # the prompt length, which preemption keeps), else 0; it also roots its prefix-cache hashes
        self.rope_offset = 0
        # the LoRA adapter's engine id (lora/manager.py), -1 for the base model; it roots the sequence's
        # prefix-cache hashes too, so no two adapters share KV
        self.adapter = -1
        # the stream's cache salt as an int (block_manager.salt_key), 0 for none; it roots the prefix-cache
        # hashes too, so sequences of different salts (serve's tenants) never share KV
        self.cache_salt = 0

    @property
    def num_computed_tokens(self) -> int:
        if self.batch is None:
            return self._num_computed
        return int(self.batch.num_computed[self.row])

    @num_computed_tokens.setter
    def num_computed_tokens(self, n: int) -> None:
        if self.batch is None:
            self._num_computed = n
        else:
            self.batch.num_computed[self.row] = n

    @property
    def num_pending(self) -> int:
        """Tokens scheduled to be sampled whose ids have not reached the host yet."""
        return self.in_flight if self.batch is None else int(self.batch.num_pending[self.row])

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens (known or pending) whose K/V is not computed or scheduled yet."""
        return len(self.token_ids) + self.num_pending - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def finish(self, reason: str, error: str | None = None) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.error = error

    def reset_for_recompute(self) -> None:
        """After preemption: the KV is gone; every token (prompt + generated) is prefilled again."""
        self.status = SequenceStatus.WAITING
        self._num_computed = 0
        self.block_table = []
        self.num_released = 0
        self.block_hashes = []
        self.planned_hashes = []
        self.protected_len = 0
        self.local = None
