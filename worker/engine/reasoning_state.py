"""ReasoningState: the mask state of a chat row of a thinking model that has a budget or a constraint.

It stands where a ConstraintState stands (`Sequence.constraint_state`, same methods), so the step's
masking, token checks and speculative verification treat it as any constrained row. It follows the
row's phase with contracts/reasoning.py's ReasoningStream and:

- while the row thinks, allows every token (a constrained row: every token but EOS, and for harmony
  every token but its message structure save `<|end|>`: the thinking cannot end the row or leave
  its message before the answer came);
- after `reasoning_budget` thinking tokens, forces the format's end marker (`</think>\\n\\n`, or
  `<|end|><|start|>assistant<|channel|>final<|message|>`) one token a step: the mask allows that
  token only, so the answer follows;
- with a constraint, holds the answer to it: the grammar's matcher sees every token from the answer's
  first on. A think-family row whose thinking the model ends itself (`</think>`) gets the separator
  `\\n\\n` forced first; a harmony row gets its headers forced (`<|channel|>analysis<|message|>` to
  think, then the format's answer header after `<|end|>`: the final channel's, or for a forced tool
  call only `<|start|>assistant`, the grammar writing the commentary header). A think row that may
  still open its thinking (Qwen3 writes `<think>` first) is allowed `<think>` beside the grammar's
  first tokens.

`rollback` restores the phase from a snapshot taken before each consumed token (speculation takes
back rejected tokens) and takes back the matcher's share.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from contracts.reasoning import THINK_START, ReasoningStream, ReasoningTokens
from worker.engine.constraint_state import ConstraintState


class ReasoningState:
    __slots__ = ("stream", "tokens", "budget", "forced", "inner", "constrained", "failure", "history", "blocked",
                 "thought", "answering", "answer_next")  # fmt: skip

    def __init__(self, tokens: ReasoningTokens, prompt_ids: list[int], budget: int | None,
                 inner: ConstraintState | None, eos_ids: tuple[int, ...]) -> None:  # fmt: skip
        """`inner`: the constraint's matcher in its start state (None: no constraint)."""
        self.tokens = tokens
        self.stream = ReasoningStream(tokens, prompt_ids)
        self.budget = budget
        self.inner = inner
        self.constrained = inner is not None
        self.failure: str | None = None  # why the sequence ends with an error (set by the engine)
        # tokens a constrained row may not write while it thinks: EOS (the answer must come), and for
        # harmony the message structure but `<|end|>` (the thinking stays analysis messages)
        ids = tokens.ids
        structure = () if tokens.format.family == "think" else tuple(
            ids[t] for t in ("<|start|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"))  # fmt: skip
        self.blocked = tuple(dict.fromkeys(tuple(eos_ids) + structure))
        self.forced: tuple[int, ...] = ()  # the tokens the next steps must write, in order
        self.answer_next = False  # the answer starts once `forced` is written
        self.answering = self.stream.phase == "answer"  # the grammar sees every token from here (thinking off)
        self.thought = self.stream.phase == "thinking"  # the row has been thinking
        self.history: list[tuple] = []  # per consumed token: the state before it
        self._settle()

    # ---- the phase --------------------------------------------------------------------------------
    def _force(self, tokens: tuple[int, ...], answer: bool) -> None:
        self.forced, self.answer_next = tokens, answer
        if not tokens and answer:
            self.answering, self.answer_next = True, False

    def _settle(self) -> None:
        """After a token (or at the start): what the next tokens must be."""
        if self.forced or self.answering:
            return
        s, t = self.stream, self.tokens
        self.thought = self.thought or s.phase == "thinking"
        if s.phase == "thinking" and self.budget is not None and s.thinking_tokens >= self.budget:
            self._force(t.end_ids, True)
        elif not self.constrained:
            return
        elif t.format.family == "think":
            if s.phase == "answer":  # the model wrote `</think>`: the separator, then the answer
                self._force(t.answer_ids, True)
        elif s.phase in ("header", "between"):  # harmony's headers are held: think first (but at budget 0)
            role = t.role_ids if s.phase == "between" else ()  # a header that opens in the prompt has its role
            if self.budget != 0 and not self.thought:
                self._force(role + t.analysis_header, False)
            else:
                self._force(role + t.answer_ids[len(t.role_ids) :], True)

    def consume(self, token: int) -> bool:
        """Advance by one generated token; False if the mask refuses it."""
        self.history.append((self.stream.state(), self.forced, self.answer_next, self.answering, self.thought, False))
        if self.forced:
            if token != self.forced[0]:
                return False
            self.stream.feed(token)
            self._force(self.forced[1:], self.answer_next)
            self._settle()
            return True
        if not self.answering:
            if self.constrained and self.stream.phase == "thinking" and token in self.blocked:
                return False
            opening = self.stream.phase == "open"
            self.stream.feed(token)
            if not (self.constrained and opening and self.stream.phase == "answer"):
                self._settle()
                return True
            self.answering = True  # the model answers without thinking: this token is the answer's first
        self.stream.feed(token)
        if self.inner is None:
            return True
        self.history[-1] = (*self.history[-1][:5], True)
        return self.inner.consume(token)

    def consume_many(self, tokens: list[int]) -> bool:
        return all(self.consume(t) for t in tokens)

    def validate(self, tokens: list[int]) -> int:
        """How many of `tokens` are accepted in a row (the state does not move)."""
        probe = self.copy()
        for i, token in enumerate(tokens):
            if not probe.consume(token):
                return i
        return len(tokens)

    def rollback(self, num_tokens: int) -> None:
        """Take back the last `num_tokens` consumed tokens."""
        fed = 0
        for _ in range(num_tokens):
            stream_state, self.forced, self.answer_next, self.answering, self.thought, to_inner = self.history.pop()
            self.stream.restore(stream_state)
            fed += to_inner
        if fed:
            self.inner.rollback(fed)  # type: ignore[union-attr]

    def copy(self) -> ReasoningState:
        out = ReasoningState.__new__(ReasoningState)
        out.tokens, out.budget, out.constrained, out.blocked = self.tokens, self.budget, self.constrained, self.blocked
        out.stream = self.stream.copy()
        out.inner = self.inner.copy() if self.inner is not None else None
        out.failure, out.forced, out.answer_next = None, self.forced, self.answer_next
        out.answering, out.thought = self.answering, self.thought
        out.history = list(self.history)
        return out

    # ---- masks --------------------------------------------------------------------------------------
    def fill(self, address: int, num_bytes: int) -> None:
        """Write the allowed-token bitmask (ConstraintState.fill's layout) at `address`: the grammar's,
        or a row copied whole from a cached one (a thinking row's, or one forced token's)."""
        if self.forced:
            row = _row(num_bytes, (), (self.forced[0],))
        elif self.inner is not None and (self.answering or self.stream.phase == "open"):
            self.inner.fill(address, num_bytes)
            if not self.answering:  # `<think>`, or the answer's first token
                words = np.ctypeslib.as_array((ctypes.c_uint32 * (num_bytes // 4)).from_address(address))
                think = self.tokens.ids[THINK_START]
                words[think // 32] |= np.uint32(1 << (think % 32))
            return
        else:
            row = _row(num_bytes, self.blocked if self.constrained else (), None)
        ctypes.memmove(address, row.ctypes.data, num_bytes)

    def fill_run(self, tokens: list[int], address: int, num_bytes: int) -> int:
        """ConstraintState.fill_run: the masks along a proposed run; the state does not move."""
        accepted = self.validate(tokens)
        self.fill(address, num_bytes)
        for i, token in enumerate(tokens[:accepted], 1):
            self.consume(token)
            self.fill(address + i * num_bytes, num_bytes)
        self.rollback(accepted)
        return accepted

    @property
    def is_finished(self) -> bool:
        """The answer's grammar is complete (the row stops here)."""
        return self.inner is not None and self.answering and self.inner.is_finished

    @property
    def is_accepting(self) -> bool:
        """The output may end here: no constraint, or an answer that matches its grammar."""
        return self.inner is None or (self.answering and self.inner.is_accepting)

    @property
    def error(self) -> str | None:
        return self.inner.error if self.inner is not None else None


@functools.lru_cache(maxsize=64)
def _row(num_bytes: int, refused: tuple[int, ...], only: tuple[int, ...] | None) -> np.ndarray:
    """A bitmask row of `num_bytes`: every token but `refused`, or (`only`) just those tokens."""
    words = np.zeros(num_bytes // 4, np.uint32) if only is not None else np.full(num_bytes // 4, 0xFFFFFFFF, np.uint32)
    for t in only or ():
        words[t // 32] |= np.uint32(1 << (t % 32))
    for t in refused:
        words[t // 32] &= ~np.uint32(1 << (t % 32))
    return words
