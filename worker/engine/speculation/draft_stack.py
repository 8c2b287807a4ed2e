"""DraftStack: the draft model's greedy steps straight on the C decode stack (CPU).

A draft forward is a few rows through a small model: its C work (kernels/cpu/decode_stack.c, the
lm_head GEMV) takes tens of microseconds, while the generic path around it (AttentionMetadata, the
model's forward and its eligibility checks, Backend.project) costs several times that in Python.
Here a step is ModelDecodeStack.rows (the embedding lookup and one C call), one GEMV (or F.linear past its rows)
and an argmax, with the step's positions, slots, block tables and context lengths made in numpy.

Rows are decode-shaped: each row one token at its position, reading its sequence's cache up to and
including itself, so several rows of one sequence (a catch-up of the tokens the draft has not
computed) run in one call exactly like the target's verify rows: the stack stores every row's K/V
before attending. Same floats as the generic path's decode-shaped call (the same C kernels).

Taken when the target's backend bound the draft to the decode stack (ModelDecodeStack: CPU, fp32,
a dense model it supports) and the lm_head is a plain fp32 weight; else DraftModel runs its forwards
through the ModelRunner as before.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from kernels.cpu.gemv import NativeGemv
from worker.engine.backends.cpu_decode_stack import ModelDecodeStack


class DraftStack:
    def __init__(self, model: nn.Module, block_size: int) -> None:
        """Call `usable(model)` first."""
        self._stack = model.decode_stack  # the ModelDecodeStack the backend bound
        self._lm_head = model.lm_head.weight
        self._gemv = NativeGemv()
        self.block_size = block_size

    @staticmethod
    def usable(model: nn.Module) -> bool:
        """The model is bound to the C decode stack and its lm_head is a plain fp32 CPU weight."""
        stack = getattr(model, "decode_stack", None)
        head = getattr(model, "lm_head", None)
        return (
            isinstance(stack, ModelDecodeStack) and type(head) is nn.Linear and head.bias is None
            and head.weight.dtype == torch.float32 and head.weight.device.type == "cpu"
            and head.weight.is_contiguous() and not head._forward_hooks and not head._forward_pre_hooks
        )  # fmt: skip

    def takes(self, rows: int) -> bool:
        """Whether a step of `rows` rows fits the stack (ModelDecodeStack.fits)."""
        return self._stack.fits(rows)

    @torch.inference_mode()
    def greedy(self, ids: np.ndarray, positions: np.ndarray, tables: np.ndarray, out_rows: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """One decode-shaped step: ids, positions int64 [R] and tables int32 [R, W] (each row's
        sequence's block table, covering its position) -> the argmax token after each of `out_rows`
        (default: every row) and its probability (top1). Stores every row's K/V at its slot."""
        bs = self.block_size
        slots = tables[np.arange(ids.size), positions // bs].astype(np.int64) * bs + positions % bs
        hidden = self._stack.rows(torch.from_numpy(ids), torch.from_numpy(positions), torch.from_numpy(slots),
                                  torch.from_numpy(tables), torch.from_numpy((positions + 1).astype(np.int32)))  # fmt: skip
        if out_rows is not None:
            hidden = hidden[torch.from_numpy(out_rows)]
        logits = None
        if hidden.shape[0] <= self._gemv.max_rows:
            logits = self._gemv(hidden, self._lm_head, checked=True)
        if logits is None:
            logits = F.linear(hidden, self._lm_head)
        return top1(logits)


def top1(logits: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(argmax token, its softmax probability) per row of fp32 logits [R, V] (the draft's confidence:
    speculation/acceptance.py)."""
    best, token = logits.max(-1)
    prob = torch.exp(logits - best.unsqueeze(-1)).sum(-1).reciprocal()
    return token.numpy(), prob.numpy()
