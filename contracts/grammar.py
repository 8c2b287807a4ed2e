"""The llguidance grammar text of each Constraint kind: the one text the engine compiles and the
control plane checks at submit (jobs/constraint_check.py), so both refuse the same constraints.

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
from typing import Any

import llguidance

from contracts.constraint import Constraint

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
