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
- with a constraint, holds the answer to it: the grammar's matcher starts at the answer's first
  token. A think-family row whose thinking the model ends itself (`</think>`) gets the separator
  `\\n\\n` forced first; a harmony row gets its headers forced (`<|channel|>analysis<|message|>` to
  think, `<|start|>assistant<|channel|>final<|message|>` after `<|end|>`), so the answer is always
  the final channel's content. A think row that may still open its thinking (Qwen3 writes `<think>`
  first) is allowed `<think>` beside the grammar's first tokens.

The matcher consumes exactly the answer's tokens; `rollback` restores the phase from a snapshot
taken before each consumed token (speculation takes back rejected tokens).
"""

from __future__ import annotations

import ctypes

import numpy as np

from contracts.reasoning import THINK_START, ReasoningStream, ReasoningTokens
from worker.engine.constraint_state import ConstraintState


class ReasoningState:
    __slots__ = ("stream", "tokens", "budget", "forced", "inner", "constrained", "failure", "history", "blocked",
                 "thought")  # fmt: skip

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
        self.thought = self.stream.phase == "thinking"  # the row has been thinking
        self.history: list[tuple] = []  # per consumed token: the state before it
        self._settle()

    # ---- the phase --------------------------------------------------------------------------------
    def _settle(self) -> None:
        """After a token (or at the start): what the next tokens must be."""
        if self.forced:
            return
        s = self.stream
        self.thought = self.thought or s.phase == "thinking"
        if s.phase == "thinking" and self.budget is not None and s.thinking_tokens >= self.budget:
            self.forced = self.tokens.end_ids
        elif self.constrained and self.tokens.format.family == "harmony":
            # the headers are held: think first (unless the budget is 0), then the final channel
            think = self.budget != 0 and not self.thought
            channel = self.tokens.analysis_header if think else self.tokens.final_header
            if s.phase == "header":  # the role came from the prompt (`<|start|>assistant`)
                self.forced = channel
            elif s.phase == "between":
                self.forced = self.tokens.start_assistant + channel

    def consume(self, token: int) -> bool:
        """Advance by one generated token; False if the mask refuses it."""
        self.history.append((self.stream.state(), self.forced, self.thought, False))
        if self.forced:
            if token != self.forced[0]:
                return False
            self.forced = self.forced[1:]
            self.stream.feed(token)
            self._settle()
            return True
        before = self.stream.phase
        if self.constrained and before == "thinking" and token in self.blocked:
            return False
        kind = self.stream.feed(token)
        if kind == "answer" and self.inner is not None:
            self.history[-1] = (*self.history[-1][:3], True)
            if not self.inner.consume(token):
                return False
        if (self.constrained and before == "thinking" and self.stream.phase == "answer"
                and self.tokens.format.family == "think"):  # the model wrote `</think>`: the separator next
            self.forced = self.tokens.end_ids[1:]
        self._settle()
        return True

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
            stream_state, self.forced, self.thought, to_inner = self.history.pop()
            self.stream.restore(stream_state)
            fed += to_inner
        if fed:
            self.inner.rollback(fed)  # type: ignore[union-attr]

    def copy(self) -> ReasoningState:
        out = ReasoningState.__new__(ReasoningState)
        out.tokens, out.budget, out.constrained, out.blocked = self.tokens, self.budget, self.constrained, self.blocked
        out.stream = self.stream.copy()
        out.inner = self.inner.copy() if self.inner is not None else None
        out.failure, out.forced, out.thought = None, self.forced, self.thought
        out.history = list(self.history)
        return out

    # ---- masks --------------------------------------------------------------------------------------
    def fill(self, address: int, num_bytes: int) -> None:
        """Write the allowed-token bitmask (ConstraintState.fill's layout) at `address`."""
        words = np.ctypeslib.as_array((ctypes.c_int32 * (num_bytes // 4)).from_address(address))
        if self.forced:
            words[:] = 0
            _set(words, self.forced[0])
            return
        phase = self.stream.phase
        if self.inner is not None and phase in ("answer", "open"):
            self.inner.fill(address, num_bytes)
            if phase == "open":  # `<think>`, or the answer's first token
                _set(words, self.tokens.ids[THINK_START])
            return
        words[:] = -1
        if self.constrained:
            for t in self.blocked:
                _clear(words, t)

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
    def in_answer(self) -> bool:
        return self.stream.phase == "answer" and not self.forced

    @property
    def is_finished(self) -> bool:
        """The answer's grammar is complete (the row stops here)."""
        return self.inner is not None and self.in_answer and self.inner.is_finished

    @property
    def is_accepting(self) -> bool:
        """The output may end here: no constraint, or an answer that matches its grammar."""
        if self.inner is None:
            return True
        return self.in_answer and self.inner.is_accepting

    @property
    def error(self) -> str | None:
        return self.inner.error if self.inner is not None else None


def _set(words: np.ndarray, token: int) -> None:
    """Allow `token` in an int32 bitmask row."""
    words.view(np.uint32)[token // 32] |= np.uint32(1 << (token % 32))


def _clear(words: np.ndarray, token: int) -> None:
    """Refuse `token` in an int32 bitmask row."""
    words.view(np.uint32)[token // 32] &= ~np.uint32(1 << (token % 32))
