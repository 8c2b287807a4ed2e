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

from kernels.cpu.decode_stack import pack_rows
from kernels.cpu.gemv import NativeGemv
from worker.engine.backends.cpu_decode_stack import ModelDecodeStack, exactly_half


class DraftStack:
    def __init__(self, model: nn.Module, block_size: int, head_ids: np.ndarray | None = None) -> None:
        """Call `usable(model)` first. A draft stored in fp16 (every matrix and the lm_head exactly fp16
        values) runs on fp16 copies: the same products from half the bytes, so the small model stays in
        the L2 cache across a proposal's steps (the target's step between proposals evicts it).
        head_ids: the tokens it may propose (a frequent-token head: only their lm_head rows are read),
        or None: every token."""
        stack: ModelDecodeStack = model.decode_stack  # the ModelDecodeStack the backend bound
        head = model.lm_head.weight.detach()
        # the backend's packed copy of the head where it made one (CpuBackend.head_copies; `half`: in fp16)
        copies = model.backend.head_copies(model.lm_head) if hasattr(model.backend, "head_copies") else None
        fp16 = copies.half if copies is not None else exactly_half(head)
        # the engine's stack is fp16 already when the matrices are (ModelDecodeStack.for_engine: with
        # packed copies too, which every row count takes); else a halved copy of an fp32 one
        half = (stack if stack.half else stack.halved()) if fp16 else None
        self.half = half is not None
        self._stack = half or stack
        self._gemv = NativeGemv()
        self.head_ids = head_ids
        self._head32 = head  # past the GEMV's rows, without a packed head: F.linear
        self._lm_head: torch.Tensor | None = None  # the GEMVs' head, where there is no packed one
        if head_ids is not None:  # the frequent tokens' rows only, packed here
            rows = head[torch.from_numpy(head_ids)]
            self._packed = pack_rows(rows.half() if self.half else rows.contiguous(), self._gemv.pack_width)
        elif copies is not None and copies.half == self.half:  # the backend's packed head (gemm.h)
            self._packed = copies.packed
        else:
            self._packed, self._lm_head = None, head.half().contiguous() if self.half else head
        self.chain = self._stack.draft_chain(self._lm_head, self._packed, head_ids)  # a whole proposal in one C call
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
    def greedy(self, ids: np.ndarray, positions: np.ndarray, tables: np.ndarray, out_rows: np.ndarray | None = None,
               probs: bool = False) -> tuple[np.ndarray, np.ndarray | None]:  # fmt: skip
        """One decode-shaped step: ids, positions int64 [R] and tables int32 [R, W] (each row's
        sequence's block table, covering its position) -> the argmax token after each of `out_rows`
        (default: every row), and with `probs` its probability (top1). Stores every row's K/V at its slot."""
        bs = self.block_size
        slots = tables[np.arange(ids.size), positions // bs].astype(np.int64) * bs + positions % bs
        hidden = self._stack.rows(torch.from_numpy(ids), torch.from_numpy(positions), torch.from_numpy(slots),
                                  torch.from_numpy(tables), torch.from_numpy((positions + 1).astype(np.int32)))  # fmt: skip
        if out_rows is not None:
            hidden = hidden[torch.from_numpy(out_rows)]
        logits = None
        if self._packed is not None:
            logits = self._gemv.packed(hidden.contiguous(), self._packed, self.chain.rows)
        elif hidden.shape[0] <= self._gemv.max_rows:
            logits = self._gemv(hidden, self._lm_head, checked=True)
        if logits is None:
            logits = F.linear(hidden, self._head32)
        if not probs:
            token, prob = logits.numpy().argmax(-1), None
        else:
            token, prob = self._gemv.top1(logits)
        return (token, prob) if self.head_ids is None else (self.head_ids[token], prob)


def top1(logits: torch.Tensor, probs: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """The argmax token per row of fp32 CPU logits [R, V], and with `probs` its softmax probability
    (the draft's confidence: speculation/acceptance.py), in numpy, for the generic forward's logits
    (DraftStack takes NativeGemv.top1, in C)."""
    x = logits.numpy()
    token = x.argmax(-1)
    if not probs:
        return token, None
    gap = np.maximum(x - np.take_along_axis(x, token[:, None], -1), -80.0)  # no subnormal exp (a slow path)
    return token, 1.0 / np.exp(gap).sum(-1)
