"""Logits processing before sampling: min_tokens, logit_bias and the three penalties, for all rows of
a step at once (torch ops over the rows that need each, chosen from host arrays: no per-row Python).

Order, as vLLM's v1 sampler (and the meanings of transformers' processors of the same names):
1. min_tokens: while a row has generated fewer than min_tokens tokens, its EOS (unless ignored) and
   stop_token_ids are at -inf (MinNewTokensLengthLogitsProcessor).
2. logit_bias: each (token, bias) pair added to the logit (SequenceBiasLogitsProcessor, length-1
   sequences).
3. repetition penalty over the prompt and the generated tokens: a logit > 0 is divided by it, else
   multiplied (RepetitionPenaltyLogitsProcessor).
4. frequency and presence penalties over the generated tokens only (OpenAI's definition):
   logit -= frequency * count + presence * (count > 0).
The sampler then takes the argmax (greedy) or applies temperature, min_p, top-k and top-p and draws.
Logprobs are of the raw logits, before all of this (vLLM's default), so processing makes a new tensor.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from worker.engine.batch_state import PersistentBatch
from worker.engine.device_rows import DeviceRows
from worker.engine.penalty_counts import PenaltyCounts
from worker.engine.sampler import to_device


def mask_tokens(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """logits [M, V]; ids int64 [M, S], each row's ids first then -1 padding, ids[:, 0] >= 0 -> a copy
    with those tokens at -inf (padding points at the row's first id: the same write again)."""
    return logits.scatter(1, torch.where(ids >= 0, ids, ids[:, :1]), float("-inf"))


def add_bias(logits: torch.Tensor, ids: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """logits [M, V] + values float32 [M, B] at token ids int64 [M, B] (padding: id 0, value 0)."""
    return logits.scatter_add(1, ids, values)


def penalize(logits: torch.Tensor, prompt: torch.Tensor | None, output: torch.Tensor, pparams: torch.Tensor,
             additive: bool = True) -> torch.Tensor:  # fmt: skip
    """logits [P, V]; prompt bool [P, V] (token in the prompt); output float32 [P, V] (times generated);
    pparams float32 [P, 3] = (presence, frequency, repetition) -> the penalized logits. prompt None: no
    row has a repetition penalty; additive False: no row has a presence or frequency penalty."""
    generated = output > 0
    if prompt is not None:
        rep = pparams[:, 2:3]
        scale = torch.where(logits > 0, rep.reciprocal(), rep)  # divide a positive logit, multiply others
        logits = logits * scale.masked_fill_(~(prompt | generated), 1.0)
    else:
        logits = logits.clone()
    if additive:
        logits.addcmul_(output, pparams[:, 1:2], value=-1.0).addcmul_(generated, pparams[:, 0:1], value=-1.0)
    return logits


class LogitsProcessing:
    """Applies the steps above to a step's sampled logits; owns the penalties' token counts."""

    def __init__(self, batch: PersistentBatch, dev: DeviceRows, vocab_size: int) -> None:
        self.batch = batch
        self.dev = dev
        self.counts = PenaltyCounts(batch.max_rows, vocab_size, dev.device)

    def apply(self, logits: torch.Tensor, sample_rows: np.ndarray, counter: np.ndarray,
              extra: torch.Tensor | None = None,
              ) -> tuple[torch.Tensor, tuple[torch.Tensor | None, torch.Tensor] | None]:  # fmt: skip
        """logits fp32 [N, V] of batch rows sample_rows [N], counter [N] = tokens each row generated so
        far -> (processed copy, penalized) where penalized = (which logits rows (None: all), their
        count slots) for `count` after sampling, or None when no row is penalized. extra: float32
        [N, V] counts added to the rows' output counts (speculation: the proposed tokens before each
        verified position), or None."""
        b, dev, device = self.batch, self.dev, self.dev.device
        self.counts.sync(b)
        logits = logits.clone()
        masked = (b.min_tokens[sample_rows] > counter) & (b.stop_ids[sample_rows, 0] >= 0)
        self._rows(logits, masked, sample_rows, lambda x, r: mask_tokens(x, dev.stop_ids.index_select(0, r)))
        self._rows(logits, b.biased[sample_rows], sample_rows,
                   lambda x, r: add_bias(x, dev.bias_ids.index_select(0, r), dev.bias_values.index_select(0, r)))
        # a row that left the batch after this step was scheduled (finished by the previous step's
        # tokens, applied early for structured outputs) has no counts any more: its token is dropped
        penalized = b.penalized[sample_rows] & (self.counts.slot_of_row[sample_rows] >= 0)
        if not penalized.any():
            return logits, None
        idx = None if penalized.all() else to_device(np.flatnonzero(penalized), device)
        slots = self.counts.slots(sample_rows[penalized])
        pp = b.pparams[sample_rows[penalized]]  # which of the penalties any of these rows uses
        repetition, additive = bool((pp[:, 2] != 1.0).any()), bool((pp[:, :2] != 0.0).any())

        def apply_penalties(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
            prompt = self.counts.prompt.index_select(0, slots) if repetition else None
            output = self.counts.output.index_select(0, slots)
            if extra is not None:
                output = output + (extra if idx is None else extra.index_select(0, idx))
            return penalize(x, prompt, output, dev.pparams.index_select(0, r), additive)

        self._rows(logits, penalized, sample_rows, apply_penalties)
        return logits, (idx, slots)

    def count(self, penalized: tuple[torch.Tensor | None, torch.Tensor], tokens: torch.Tensor) -> None:
        """Count the sampled tokens [N] of the penalized rows (from `apply`)."""
        idx, slots = penalized
        self.counts.count(slots, tokens if idx is None else tokens.index_select(0, idx))

    def _rows(self, logits: torch.Tensor, mask: np.ndarray, sample_rows: np.ndarray,
              fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:  # fmt: skip
        """logits[mask] = fn(logits[mask], their batch rows on the device), in place."""
        if not mask.any():
            return
        device = self.dev.device
        rows = to_device(sample_rows[mask], device)
        if mask.all():
            logits.copy_(fn(logits, rows))
            return
        idx = to_device(np.flatnonzero(mask), device)
        logits.index_copy_(0, idx, fn(logits.index_select(0, idx), rows))
