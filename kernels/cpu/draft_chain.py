"""A draft model's whole greedy proposal in one C call (draft_chain.h, built into decode_stack.c).

`DraftChain(stack, embed, head, packed, head_ids)` binds a draft's BoundDecodeStack, its embedding
and its lm_head (fp32, or fp16 holding the same values: `head` for GEMVs or `packed`, as pack_rows
lays it out, for gemm.h's products; `head_ids`: the token of each head row when the head holds only
some tokens, FR-Spec's frequent-token head); `propose(...)` runs the catch-up rows, then drafts each
sequence's tokens until its K or its early stop (`EarlyStop`: numbers the caller chooses, the rule
below evaluated in C). Same tokens and probabilities as the step-by-step path over the same stack,
head product and top1 kernels.
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import numpy as np
import torch

from kernels.cpu.decode_stack import BoundDecodeStack

_ptr, _i64, _f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double


class _Head(ctypes.Structure):
    _fields_ = [("embed", _ptr), ("head", _ptr), ("packed", _ptr), ("head_ids", _ptr), ("vocab", _i64), ("rows", _i64),
                ("head_half", _i64), ("early_stop", _i64),
                ("edges", _ptr), ("chance", _ptr), ("num_edges", _i64), ("overall", _f64), ("per_token", _f64)]  # fmt: skip


class EarlyStop(NamedTuple):
    """Sequence s drafts token j + 1 while prod(chances[bucket(p_i)], i <= j) x overall x values[s] >
    per_token, p_i being the draft's probability of its token i and a bucket how many of `edges` are
    <= p_i."""

    edges: np.ndarray  # float64 [E], ascending
    chances: np.ndarray  # float64 [E + 1]
    overall: float
    per_token: float
    values: np.ndarray  # float64 [S]: per sequence


class DraftChain:
    def __init__(self, stack: BoundDecodeStack, embed: torch.Tensor, head: torch.Tensor | None,
                 packed: torch.Tensor | None = None, head_ids: np.ndarray | None = None) -> None:  # fmt: skip
        """embed [vocab, hidden] fp32, contiguous on the CPU; the lm_head's rows as `head` [rows,
        hidden] (fp32 or fp16, contiguous: GEMVs) or `packed` (pack_rows of them at the stack's tile
        width, fp32 or fp16: gemm.h; head may then be None); head_ids: the token id of each row
        (distinct, in the vocabulary), or None: rows = vocab."""
        if not (embed.dtype == torch.float32 and embed.is_contiguous() and embed.device.type == "cpu"
                and embed.dim() == 2 and embed.shape[1] == stack.hidden):  # fmt: skip
            raise ValueError(f"DraftChain takes a contiguous fp32 CPU embedding [vocab, {stack.hidden}]")
        vocab, weight = embed.shape[0], packed if packed is not None else head
        rows = vocab if head_ids is None else len(head_ids)
        if weight is None or weight.dtype not in (torch.float32, torch.float16) or weight.device.type != "cpu":
            raise ValueError("DraftChain takes its lm_head as an fp32 or fp16 CPU tensor (head or packed)")
        if head is not None and not (head.dtype == weight.dtype and head.is_contiguous()
                                     and head.shape == (rows, stack.hidden)):  # fmt: skip
            raise ValueError(f"DraftChain's lm_head must be [{rows}, {stack.hidden}] contiguous (one row per token "
                             f"it proposes), got {tuple(head.shape)} {head.dtype}")  # fmt: skip
        width = stack.pack_width
        if packed is not None and not (packed.is_contiguous()
                                       and packed.shape == (-(-rows // width), stack.hidden, width)):  # fmt: skip
            raise ValueError(f"DraftChain's packed head must be pack_rows of its {rows} rows, got {tuple(packed.shape)}")
        if head_ids is not None:
            head_ids = np.ascontiguousarray(head_ids, np.int64)
            if not (head_ids.ndim == 1 and 0 < rows <= vocab and np.unique(head_ids).size == rows
                    and head_ids.min() >= 0 and head_ids.max() < vocab):  # fmt: skip
                raise ValueError("DraftChain's head_ids must give each head row a distinct token of the vocabulary")
        self._fn = stack.draft_fn  # the library the stack was bound from, not loaded again
        self._fn.argtypes = [_ptr, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _i64, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _ptr,
                             _i64]  # fmt: skip
        self._fn.restype = ctypes.c_int
        # kept alive: the C side holds pointers
        self._stack, self._embed, self._head, self._packed, self._head_ids = stack, embed, head, packed, head_ids
        self.vocab, self.rows = vocab, rows
        self._half = int(weight.dtype == torch.float16)

    def takes(self, rows: int) -> bool:
        """Whether a proposal with `rows` catch-up rows fits (its forwards run on GEMVs only)."""
        return 0 < rows <= self._stack.gemv_rows

    def propose(self, ids: np.ndarray, positions: np.ndarray, tables: np.ndarray, last_rows: np.ndarray,
                ks: np.ndarray, stop: EarlyStop | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
        """Catch-up rows ids, positions int64 [R] and tables int32 [R, W] (each row's sequence's block
        table, covering its position and the K tokens after its last row), each sequence's last row
        last_rows int64 [S] (ascending) and its most tokens ks int64 [S] (>= 1) -> tokens int64 [S,
        max ks], their probabilities fp32 [S, max ks] and counts int64 [S] (the first counts[s] of row s
        are drafted). Stores every forward's K/V in the draft's cache. Raises IndexError for a value
        out of range (ids, positions, the tables' width and K are checked before the first forward;
        a block id per forward, by the stack)."""
        ids, positions, last_rows, ks = (np.ascontiguousarray(a, np.int64) for a in (ids, positions, last_rows, ks))
        tables = np.ascontiguousarray(tables, np.int32)
        seqs, kmax = last_rows.size, int(ks.max())
        if not (rows := ids.size) or stop is not None and len(stop.values) != seqs:
            raise ValueError("DraftChain.propose needs at least one row and, with a stop, a value per sequence")
        if not self.takes(rows):
            raise ValueError(f"a chain's forward takes at most {self._stack.gemv_rows} rows, not {rows}")
        tokens, probs = np.zeros((seqs, kmax), np.int64), np.zeros((seqs, kmax), np.float32)
        counts = np.zeros(seqs, np.int64)
        if stop is None:
            edges, chances, values, head = np.zeros(0), np.ones(1), np.zeros(seqs), (0, 0, 0.0, 0.0)
        else:
            edges, chances = np.ascontiguousarray(stop.edges, np.float64), np.ascontiguousarray(stop.chances, np.float64)
            values, head = np.ascontiguousarray(stop.values, np.float64), (1, edges.size, stop.overall, stop.per_token)
            if chances.size != edges.size + 1:
                raise ValueError(f"an early stop needs one chance more than its {edges.size} edges, got {chances.size}")
        early, num_edges, overall, per_token = head
        head_ptr = None if self._head is None else self._head.data_ptr()
        packed = None if self._packed is None else self._packed.data_ptr()
        ids_ptr = None if self._head_ids is None else self._head_ids.ctypes.data
        spec = _Head(self._embed.data_ptr(), head_ptr, packed, ids_ptr, self.vocab, self.rows, self._half, early,
                     edges.ctypes.data, chances.ctypes.data, num_edges, overall, per_token)  # fmt: skip
        status = self._fn(self._stack.model_ptr, ctypes.addressof(spec), rows, ids.ctypes.data, positions.ctypes.data,
                          tables.ctypes.data, tables.shape[1], seqs, last_rows.ctypes.data, ks.ctypes.data,
                          values.ctypes.data, kmax, tokens.ctypes.data, probs.ctypes.data, counts.ctypes.data,
                          torch.get_num_threads())  # fmt: skip
        if status == -2:
            raise MemoryError("decode_stack_draft could not allocate its activations")
        if status:
            raise IndexError("decode_stack_draft refused the proposal: an id, position, slot or row out of range")
        return tokens, probs, counts
