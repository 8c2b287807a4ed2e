"""GrammarCache: each distinct Constraint compiled once per process, for one model's tokenizer.

The grammar engine is llguidance (docs/ARCHITECTURE.md, "Structured outputs", has the measurement
behind the choice); each kind's grammar text is contracts/grammar.py's, the text the control plane
checks at submit. Its tokenizer information (an LLTokenizer built from tokenizer.json, the
model's vocabulary width and EOS ids) is built on the first constrained request, never for a job
without one. A compiled grammar is kept as a matcher in its start state; every sequence carrying
that constraint gets a copy (`LLMatcher.deep_copy` shares the compiled grammar: no second compile).
A constraint that does not compile is cached as its error message, so its rows all fail with it
and nothing is compiled twice. The cache is LRU-bounded (`max_entries`).
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import llguidance

from contracts.constraint import Constraint
from contracts.grammar import grammar_text
from worker.engine.constraint_state import ConstraintState


class GrammarCache:
    """Compiled constraints of one model (tokenizer.json at model_dir, logits width vocab_size)."""

    def __init__(self, model_dir: Path, vocab_size: int, eos_token_ids: tuple[int, ...], max_entries: int = 256) -> None:
        self.model_dir = model_dir
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.max_entries = max_entries
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[Constraint, llguidance.LLMatcher | str] = OrderedDict()
        self.compiles = 0  # compile attempts (tests: one per distinct constraint)

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the vocabulary, built on first use (once per engine: it walks every token)."""
        if self._tokenizer is None:
            text = (self.model_dir / "tokenizer.json").read_text(encoding="utf-8")
            eos = list(self.eos_token_ids) or None
            self._tokenizer = llguidance.LLTokenizer(text, n_vocab=self.vocab_size, eos_token=eos)
        return self._tokenizer

    def error(self, constraint: Constraint) -> str | None:
        """Why the constraint does not compile (None: it does); compiles it on first sight."""
        compiled = self._get(constraint)
        return compiled if isinstance(compiled, str) else None

    def state(self, constraint: Constraint) -> ConstraintState:
        """A fresh matcher for one sequence (the constraint must compile: see `error`)."""
        compiled = self._get(constraint)
        if isinstance(compiled, str):
            raise ValueError(compiled)
        return ConstraintState(compiled.deep_copy())

    def _get(self, constraint: Constraint) -> llguidance.LLMatcher | str:
        compiled = self._compiled.get(constraint)
        if compiled is not None:
            self._compiled.move_to_end(constraint)
            return compiled
        compiled = self._compile(constraint)
        self._compiled[constraint] = compiled
        if len(self._compiled) > self.max_entries:
            self._compiled.popitem(last=False)
        return compiled

    def _compile(self, constraint: Constraint) -> llguidance.LLMatcher | str:
        self.compiles += 1
        what = {"json_schema": "JSON schema", "json_object": "JSON object", "regex": "regex", "choice": "choice",
                "grammar": "Lark grammar"}[constraint.kind]  # fmt: skip
        try:
            text = grammar_text(constraint)
        except (ValueError, TypeError) as exc:
            return f"the {what} constraint is invalid: {exc}; fix it"
        try:
            tokenizer = self.tokenizer
        except (ValueError, RuntimeError) as exc:  # a tokenizer.json llguidance cannot read
            return f"structured outputs are not available for this model: llguidance cannot read its tokenizer ({exc})"
        matcher = llguidance.LLMatcher(tokenizer, text, log_level=0)
        if matcher.is_error():
            return f"the {what} constraint does not compile: {_one_line(matcher.get_error())}; fix it"
        return matcher


def _one_line(message: str) -> str:
    """llguidance's error as one line: its first line, and its `error:` line when it has one (a regex
    parse error puts the reason there, after the pattern and a caret); a panic's backtrace dropped."""
    lines = [line.strip() for line in message.split("<backtrace>", 1)[0].splitlines() if line.strip()]
    if not lines:
        return "the grammar library refused it"
    reason = next((line.removeprefix("error: ") for line in lines[1:] if line.startswith("error: ")), None)
    return f"{lines[0]} {reason}" if reason else lines[0]
