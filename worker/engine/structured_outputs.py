"""StructuredOutputs: the engine's side of constraints: compile checks, per-step masks, token checks.

Per step that samples constrained rows, after the forward is launched and before sampling
(Engine.step's mask phase calls `mask` between the two): each constrained row's allowed-token bitmask is
filled on the host, one matcher after the other (llguidance's thread-pool executor would wake its
threads for each step, which costs more than a mask; bench/structured_speed.py measures the masks'
share of a step), into a pinned int32 buffer and
applied in place to that row's logits: on CUDA by the Triton kernel kernels/triton/token_bitmask.py
(one H2D copy of the packed words), on the CPU by the vectorized torch reference. Only constrained
rows are touched, so an unconstrained row's logits (and a batch without constraints) pay nothing.
Logprobs stay those of the raw distribution (the runner reads them from a copy taken before).
Speculative verification masks a constrained row's 1 + K verify rows the same way (`mask_runs`):
the masks along its proposed run (ConstraintState.fill_run), the run cut at the first proposal the
grammar refuses.

A chat row of a thinking model with a budget or a constraint gets a ReasoningState
(reasoning_state.py) in place of a ConstraintState: the same methods, its masks free while the row
thinks, one forced token a step while the end marker is written, the grammar's over the answer.

A row whose mask allows nothing (or only EOS before the grammar accepts) can never satisfy its
constraint: it is given an all-allowed mask (so sampling stays finite), and its next token ends it
with an error (ConstraintState.failure). Rows finished while the step was in flight get an
all-allowed mask too: their token is dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from contracts.constraint import Constraint
from contracts.reasoning import ReasoningFormat
from worker.engine.constraint_state import ConstraintState
from worker.engine.grammar_cache import GrammarCache
from worker.engine.reasoning_state import ReasoningState
from worker.engine.sequence import Sequence
from worker.engine.stats import EngineStats
from worker.engine.tokenizer import Tokenizer

UNSATISFIABLE = ("no output can satisfy the constraint with this model's tokenizer (its allowed-token mask "
                 "is empty); check the schema, pattern or grammar")  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCut:
    """A constrained verify run: how many proposals the grammar lets it accept, and, when the row
    where it is cut can never satisfy the constraint, why (the row's token there ends it in error)."""

    allowed: int
    failure: str | None = None


def first_line(message: str) -> str:
    """llguidance's matcher errors end with a dump of the parser state: keep the message itself."""
    return message.strip().split("\n", 1)[0]


def failure(state: ConstraintState) -> str:
    """Why a row whose constraint can go no further fails, with the matcher's own word for it
    (its stop reason, or a parser limit it hit) when it has one."""
    error = state.error
    return f"{UNSATISFIABLE} (llguidance: {first_line(error)})" if error else UNSATISFIABLE


class StructuredOutputs:
    def __init__(self, model_dir: Path, vocab_size: int, eos_token_ids: tuple[int, ...], max_rows: int,
                 device: torch.device, stats: EngineStats, tokenizer: Tokenizer) -> None:  # fmt: skip
        self.grammars = GrammarCache(model_dir, vocab_size, eos_token_ids)
        self.tokenizer = tokenizer  # a reasoning format's markers as ids (Tokenizer.reasoning_tokens)
        self.eos_token_ids = eos_token_ids
        self.words = (vocab_size + 31) // 32  # int32 words per mask
        clear = np.full(self.words, 0xFFFFFFFF, np.uint32)  # every bit but the EOS tokens'
        for t in eos_token_ids:
            if t < vocab_size:
                clear[t // 32] &= ~np.uint32(1 << (t % 32))
        self.not_eos = clear.view(np.int32)
        self.device = device
        self.stats = stats
        self.max_rows = max_rows
        # two host buffers used in turn: a step's H2D copy has finished by the time its buffer is
        # refilled (the engine has waited for that step's tokens in between); made on the first
        # constrained step, so an engine that never sees a constraint holds no (pinned) mask memory
        self._buffers: list[torch.Tensor] = []
        self._turn = 0
        self._run_buffer = torch.zeros((0, self.words), dtype=torch.int32)  # verify rows' masks (grown)
        self._apply = None

    def error(self, rule: Constraint | ReasoningFormat) -> str | None:
        """Why a request with this constraint (compiled once per distinct constraint) or reasoning
        format (its markers must be tokens of this tokenizer) cannot run."""
        if isinstance(rule, ReasoningFormat):
            try:
                self.tokenizer.reasoning_tokens(rule)
            except ValueError as exc:
                return str(exc)
            return None
        return self.grammars.error(rule)

    def state(self, seq: Sequence) -> ConstraintState | ReasoningState:
        """A sequence's mask state, made at its first masked step (before its first token)."""
        p = seq.params
        inner = self.grammars.state(p.constraint) if p.constraint is not None else None
        if p.reasoning is None:
            return inner  # type: ignore[return-value]  # masked: a constraint
        tokens = self.tokenizer.reasoning_tokens(p.reasoning)
        return ReasoningState(tokens, seq.token_ids[: seq.num_prompt_tokens], p.reasoning_budget, inner,
                              self.eos_token_ids)  # fmt: skip

    def mask(self, logits: torch.Tensor, which: np.ndarray, seqs: list[Sequence]) -> None:
        """Fill the masks of `seqs` (constrained; their logits rows `which`) and apply them to
        `logits` [S, V] in place."""
        t0 = time.perf_counter()
        m = len(seqs)
        if not self._buffers:
            pin = self.device.type == "cuda"
            self._buffers = [torch.zeros((self.max_rows, self.words), dtype=torch.int32, pin_memory=pin) for _ in range(2)]
        buf = self._buffers[self._turn][:m]
        self._turn ^= 1
        open_rows = []
        address, row_bytes = buf.data_ptr(), self.words * 4
        for j, seq in enumerate(seqs):
            state = seq.constraint_state
            if seq.is_finished or (state is not None and state.failure is not None):
                continue  # its token is dropped, or ends it with an error
            if state is None:
                state = seq.constraint_state = self.state(seq)
            state.fill(address + j * row_bytes, row_bytes)
            open_rows.append(j)
        words = buf.numpy()
        allowed = np.ones(m, np.bool_)
        allowed[open_rows] = False
        for j in self._dead_ends(words, open_rows, lambda j: seqs[j].constraint_state):  # type: ignore[arg-type,return-value]
            state = seqs[j].constraint_state
            state.failure = failure(state)  # type: ignore[union-attr]
            allowed[j] = True
        words[allowed] = -1  # every token: the row's token is dropped or ends it
        self._apply_masks(logits, buf, which)
        self.stats.mask_seconds += time.perf_counter() - t0

    def mask_runs(self, logits: torch.Tensor, runs: list[tuple[int, Sequence, tuple[int, ...]]]) -> list[RunCut]:
        """Speculative verification: for each (first logits row, constrained sequence, proposed run)
        fill the masks along the run (row j: the grammar after the first j proposals) and apply them
        to `logits` [M, V] in place, like `mask` does for a plain step's row. Returns per run how many
        proposals may be accepted (the grammar's accepted prefix, cut before a dead end) and the
        failure of the row where that cut falls, if it is a dead end (its token ends the row)."""
        t0 = time.perf_counter()
        total = sum(len(d) + 1 for _, _, d in runs)
        if self._run_buffer.shape[0] < total:
            self._run_buffer = torch.zeros((total, self.words), dtype=torch.int32, pin_memory=self.device.type == "cuda")
        buf = self._run_buffer[:total]
        words = buf.numpy()
        words[:] = -1  # rows past a run's cut: their tokens are never kept
        address, row_bytes = buf.data_ptr(), self.words * 4
        which, cuts, at = [], [], 0
        for first, seq, draft in runs:
            state = seq.constraint_state
            assert state is not None and state.failure is None  # Speculator.plan: masked before, not failed
            accepted = state.fill_run(list(draft), address + at * row_bytes, row_bytes)
            start = at
            dead = self._dead_ends(words, list(range(at, at + accepted + 1)),
                                   lambda j: _after(state, draft[: j - start]))  # noqa: B023  # fmt: skip
            cut, why = accepted, None
            if dead:  # the first dead end: the run stops there (its token, if the run gets there, ends the row)
                cut = dead[0] - at
                why = failure(_after(state, draft[:cut]))
                words[dead[0]] = -1
            cuts.append(RunCut(allowed=cut, failure=why))
            which.extend(range(first, first + len(draft) + 1))
            at += len(draft) + 1
        self._apply_masks(logits, buf, np.asarray(which, np.int64))
        self.stats.mask_seconds += time.perf_counter() - t0
        return cuts

    def _dead_ends(self, words: np.ndarray, rows: list[int], state_at: Callable[[int], ConstraintState]) -> list[int]:
        """Of `rows` (filled masks; `state_at(row)`: the grammar there), those that can never satisfy
        the constraint: the mask allows nothing, or only EOS while the text is not a complete match."""
        if not rows:
            return []
        host = words[rows]
        empty = ~(host & self.not_eos).any(1)  # nothing allowed but (maybe) EOS
        return [rows[k] for k in np.flatnonzero(empty).tolist() if not host[k].any() or not state_at(rows[k]).is_accepting]

    def _apply_masks(self, logits: torch.Tensor, buf: torch.Tensor, which: np.ndarray) -> None:
        rows = torch.from_numpy(np.ascontiguousarray(which, np.int64))
        if self.device.type == "cpu":
            from kernels.reference.token_bitmask import apply_token_bitmask_

            apply_token_bitmask_(logits, buf, rows)
            return
        if self._apply is None:
            from kernels.triton.token_bitmask import apply_token_bitmask_ as triton_apply

            self._apply = triton_apply
        self._apply(logits, buf.to(self.device, non_blocking=True), rows.pin_memory().to(self.device, non_blocking=True))

    @staticmethod
    def check(seq: Sequence, token: int) -> str | None:
        """Advance seq's constraint by its new token: None, "finished" (the grammar is complete:
        the sequence stops) or an error message (the sequence ends with it)."""
        state = seq.constraint_state
        if state is None:
            return None
        if state.failure is not None:
            return state.failure
        if not state.consume(token):
            return f"the generated token {token} is outside the constraint ({first_line(state.error or '')})"
        if state.is_finished:
            return "finished" if state.is_accepting else failure(state)
        return None


def _after(state: ConstraintState, tokens: tuple[int, ...]) -> ConstraintState:
    """A copy of `state` advanced by `tokens` (the grammar accepts them: validated before)."""
    there = state.copy()
    there.consume_many(list(tokens))
    return there
