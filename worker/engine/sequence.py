"""Sequence: one request's tokens, KV blocks and decoding state as it moves through the engine."""

from __future__ import annotations

import enum

import torch

from worker.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """token_ids = prompt + generated so far. Invariants:

    - tokens [0, num_computed_tokens) have K/V in the cache (or are scheduled in the current step);
    - block_table covers at least num_computed_tokens tokens (block i holds positions i*B..i*B+B-1);
    - block_hashes[i] is the chained hash of full block i, for the computed full blocks;
    - planned_hashes: hashes of the full blocks this sequence will compute (from its tokens at
      admission); those past len(block_hashes) are "pending" in the block manager.
    """

    def __init__(
        self, seq_id: int, index: int, prompt_token_ids: list[int], params: SamplingParams, seed: int
    ) -> None:
        self.seq_id = seq_id
        self.index = index  # position in the caller's prompt list
        self.params = params
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []
        self.planned_hashes: list[int] = []
        self.protected_len = 0  # positions < this are in shared cached blocks: never written
        self.num_cached_tokens: int | None = None  # prefix-cache hit at first admission
        self.seed = seed % 2**63  # any int seed, folded into [0, 2**63)
        self._generator: torch.Generator | None = None
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.logprobs: list[dict[int, float]] | None = [] if params.logprobs is not None else None
        self.prompt_logprobs: list[float | None] | None = [None] if params.prompt_logprobs else None
        self.text: str | None = None  # set when the request finishes (or for stop-string checks)

    @property
    def generator(self) -> torch.Generator:
        """This request's CPU generator, made at its first draw (greedy requests never draw, so a
        bulk greedy job makes none); every later draw continues the same stream."""
        if self._generator is None:
            self._generator = torch.Generator().manual_seed(self.seed)
        return self._generator

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
        return len(self.token_ids) - self.num_computed_tokens

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
        self.num_computed_tokens = 0
        self.block_table = []
        self.block_hashes = []
        self.planned_hashes = []
        self.protected_len = 0
