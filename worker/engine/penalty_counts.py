"""PenaltyCounts: the token counts behind the repetition, frequency and presence penalties, on the device.

Only rows whose request uses a penalty have counts, each in a slot of two dense tensors: `output`
float32 [S, V] (how often each token was generated) and `prompt` bool [S, V] (which tokens the prompt
holds). A slot is filled when its row joins the batch (from the sequence's tokens, so a recomputed
sequence gets its counts back) and counts each sampled token on the device right after sampling,
so nothing waits for the host, also with overlapped steps. Slots are reused; the tensors grow by
doubling and never shrink: memory = peak concurrent penalized rows (rounded up to a power of two)
x vocab x 5 bytes (256 rows x 152k vocab: 195 MB), nothing at all when no request uses a penalty.
A dense count per penalized row (vLLM rebuilds the same [rows, vocab] counts every step from padded
token lists) makes a step's work O(penalized rows x vocab) on the device and O(1) on the host.
"""

from __future__ import annotations

import numpy as np
import torch

from worker.engine.batch_state import PersistentBatch
from worker.engine.sampler import to_device


class PenaltyCounts:
    def __init__(self, max_rows: int, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.slot_of_row = np.full(max_rows, -1, np.int64)
        self.free: list[int] = []
        self.output = torch.zeros((0, vocab_size), dtype=torch.float32, device=device)  # [S, V]
        self.prompt = torch.zeros((0, vocab_size), dtype=torch.bool, device=device)  # [S, V]

    @property
    def capacity(self) -> int:
        return self.output.shape[0]

    def sync(self, batch: PersistentBatch) -> None:
        """Apply the batch's joins and leaves of penalized rows since the last step, in order."""
        for row, seq in batch.penalty_events:
            if seq is None:
                slot = int(self.slot_of_row[row])
                if slot >= 0:
                    self.free.append(slot)
                    self.slot_of_row[row] = -1
            elif seq.batch is batch and seq.row == row:  # still there (not preempted at once)
                self._fill(row, seq.token_ids[: seq.num_prompt_tokens], seq.token_ids[seq.num_prompt_tokens :])
        batch.penalty_events.clear()

    def _fill(self, row: int, prompt_ids: list[int], output_ids: list[int]) -> None:
        if not self.free:
            grow = max(4, self.capacity)
            self.free.extend(range(self.capacity + grow - 1, self.capacity - 1, -1))  # lowest slot first
            self.output = torch.cat([self.output, self.output.new_zeros((grow, self.vocab_size))])
            self.prompt = torch.cat([self.prompt, self.prompt.new_zeros((grow, self.vocab_size))])
        slot = self.free.pop()
        self.slot_of_row[row] = slot
        self.prompt[slot] = False
        self.prompt[slot, to_device(np.asarray(prompt_ids, np.int64), self.device)] = True
        self.output[slot] = 0.0
        if output_ids:
            ids = to_device(np.asarray(output_ids, np.int64), self.device)
            self.output[slot].index_add_(0, ids, torch.ones(ids.shape, dtype=torch.float32, device=self.device))

    def slots(self, rows: np.ndarray) -> torch.Tensor:
        """The slots of penalized batch rows, int64 on the device."""
        return to_device(self.slot_of_row[rows], self.device)

    def count(self, slots: torch.Tensor, tokens: torch.Tensor) -> None:
        """Count one sampled token per slot (tokens int64 [P] on the device)."""
        self.output.index_put_((slots, tokens), torch.ones(tokens.shape, dtype=torch.float32, device=self.device),
                               accumulate=True)  # fmt: skip
