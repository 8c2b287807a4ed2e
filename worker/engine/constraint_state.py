"""ConstraintState: one sequence's position in its constraint's grammar (an llguidance matcher).

The engine advances it with every token the sequence receives (`consume`) and asks it for the next
allowed-token bitmask (StructuredOutputs fills many at once). Its tokens are exactly the
sequence's generated tokens: preemption recomputes the KV of tokens the sequence keeps, so the
state never rewinds there. `validate` and `rollback` serve speculative decoding: how many of a
proposed run of tokens the grammar accepts (without moving), and taking back the last k consumed
tokens (a verified run that the target rejected in part).
"""

from __future__ import annotations

import llguidance


class ConstraintState:
    __slots__ = ("matcher", "failure")

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher
        self.failure: str | None = None  # why the sequence ends with an error (set by the engine)

    def consume(self, token: int) -> bool:
        """Advance by one generated token; False (and `error` set) if the grammar does not allow it."""
        return self.matcher.consume_token(token)

    def consume_many(self, tokens: list[int]) -> bool:
        """Advance by several tokens (all or an error)."""
        return self.matcher.consume_tokens(tokens)

    def validate(self, tokens: list[int]) -> int:
        """How many of `tokens`, from the current state, the grammar accepts in a row (the state does
        not move): a speculative run is cut at the first token outside the grammar."""
        return self.matcher.validate_tokens(tokens)

    def fill_run(self, tokens: list[int], address: int, num_bytes: int) -> int:
        """Masks along a proposed run (speculative verification): the mask before tokens[0], then
        after each accepted token, written as consecutive rows of `num_bytes` at `address` (room
        for len(tokens) + 1); stops at the first token the grammar refuses. Returns how many tokens
        were accepted (a rows are written: a + 1); the state is where it was."""
        accepted = self.validate(tokens)  # a refused token would leave the matcher in error: never consumed
        self.fill(address, num_bytes)
        for i, token in enumerate(tokens[:accepted], 1):
            self.matcher.consume_token(token)
            self.fill(address + i * num_bytes, num_bytes)
        self.rollback(accepted)
        return accepted

    def rollback(self, num_tokens: int) -> None:
        """Take back the last `num_tokens` consumed tokens."""
        if num_tokens and not self.matcher.rollback(num_tokens):
            raise ValueError(f"cannot roll back {num_tokens} tokens: {self.matcher.get_error()}")

    def copy(self) -> ConstraintState:
        """An independent state at the same position (a forked choice)."""
        return ConstraintState(self.matcher.deep_copy())

    def fill(self, address: int, num_bytes: int) -> None:
        """Write the allowed-token bitmask (int32 words, bit t % 32 of word t // 32 = token t allowed)
        into `num_bytes` bytes at `address` (a contiguous int32 row of ceil(vocab / 32) words)."""
        self.matcher.unsafe_compute_mask_ptr(address, num_bytes)

    @property
    def is_finished(self) -> bool:
        """The grammar is complete and nothing may follow (the sequence stops here)."""
        return self.matcher.is_stopped()

    @property
    def is_accepting(self) -> bool:
        """The text so far is a complete match (more may still follow, e.g. a regex `a+`)."""
        return self.matcher.is_accepting()

    @property
    def error(self) -> str | None:
        return self.matcher.get_error() if self.matcher.is_error() else None
