"""GrammarCache: each distinct Constraint compiled once per process, for one model's tokenizer.

The grammar engine is llguidance (docs/ARCHITECTURE.md, "Structured outputs", has the measurement
behind the choice). Its tokenizer information (an LLTokenizer built from tokenizer.json, the
model's vocabulary width and EOS ids) is built on the first constrained request, never for a job
without one. A compiled grammar is kept as a matcher in its start state; every sequence carrying
that constraint gets a copy (`LLMatcher.deep_copy` shares the compiled grammar: no second compile).
A constraint that does not compile is cached as its error message, so its rows all fail with it
and nothing is compiled twice. The cache is LRU-bounded (`max_entries`).

How each kind becomes a grammar:
- json_schema: llguidance's JSON-schema compiler, unknown keywords refused (not `lenient`), and
  OpenAI's strict reading: an object schema without `additionalProperties` allows no other
  properties (set to false before compiling). Output is compact JSON with ", " and ": " separators
  (no free whitespace: a model cannot pad an object with blanks until max_tokens).
- json_object: the schema {"type": "object"}, same formatting.
- regex: the whole output matches the pattern.
- choice: a Lark grammar whose start rule is the alternation of the strings (JSON-quoted literals).
- grammar: Lark text as llguidance reads it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import llguidance

from worker.engine.constraint import Constraint
from worker.engine.constraint_state import ConstraintState

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": False}
_SCHEMA_KEYS_OF_SCHEMAS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_KEYS_OF_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_KEYS_OF_SCHEMA = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def strict_schema(schema: Any) -> Any:
    """A copy of `schema` where every object schema that lists properties and says nothing of
    additionalProperties gets additionalProperties: false (OpenAI's strict mode)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_KEYS_OF_SCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = {k: strict_schema(v) for k, v in out[key].items()}
    for key in _SCHEMA_KEYS_OF_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [strict_schema(v) for v in out[key]]
    for key in _SCHEMA_KEYS_OF_SCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = strict_schema(out[key])
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def grammar_text(constraint: Constraint) -> str:
    """The llguidance grammar of a constraint (not compiled yet); ValueError for a malformed spec."""
    kind = constraint.kind
    if kind == "json_schema":
        schema = strict_schema(json.loads(constraint.spec))
        return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(constraint.spec)
    if kind == "choice":
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in constraint.choices))
    return llguidance.LLMatcher.grammar_from_lark(constraint.spec)


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
        """llguidance's view of the vocabulary, built on first use (~10 ms for a 4k vocabulary)."""
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
            return f"the {what} constraint does not compile: {matcher.get_error()}; fix it"
        return matcher
