"""Constraints for the structured-output tests, chosen so that a random-weights model finishes many
of them with "stop" (bounded strings, enums, small arrays), and the judge of a finished output."""

from __future__ import annotations

import json
import re

import jsonschema

from contracts.constraint import Constraint
from contracts.grammar import strict_schema

_PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 3}, "role": {"enum": ["a", "b", "admin"]}},
    "required": ["name", "role"],
}

SCHEMAS: list[dict] = [
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"enum": ["red", "green", "blue"]},
    {"type": "object", "properties": {"level": {"type": "integer", "minimum": 1, "maximum": 5},
                                      "label": {"enum": ["low", "high"]}}, "required": ["level", "label"]},
    {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"who": _PERSON, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
     "required": ["who"]},  # nested, an optional field
    {"$defs": {"person": _PERSON}, "type": "object",
     "properties": {"a": {"$ref": "#/$defs/person"}, "b": {"$ref": "#/$defs/person"}}, "required": ["a", "b"]},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]$"},
                                      "tags": {"type": "array", "items": {"type": "string", "maxLength": 2},
                                               "maxItems": 2}}, "required": ["code", "tags"]},
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "boolean"}, {"type": "null"}]},
    {"type": "object", "properties": {"p": {"type": "object", "properties": {"q": {"type": "object", "properties": {
        "r": {"enum": [1, 2, 3]}}, "required": ["r"]}}, "required": ["q"]}}, "required": ["p"]},  # deep nesting
]  # fmt: skip
REGEXES = [r"[a-c]{2,4}", r"(yes|no)!", r"[0-9]{3}-[0-9]{2}", r"\([a-z]\)"]
CHOICES = [("alpha", "beta", "gamma"), ("positive", "negative"), ("1", "22", "333")]
# Lark grammars (llguidance's syntax), each with a Python regex of the same language: the judge
GRAMMARS = {
    'start: "(" item ("," item)* ")"\nitem: NUM | WORD\nNUM: /[0-9]{1,2}/\nWORD: /[a-z]{1,3}/':
        r"\((?:[0-9]{1,2}|[a-z]{1,3})(?:,(?:[0-9]{1,2}|[a-z]{1,3}))*\)",
    'start: sum\nsum: NUM | NUM "+" sum\nNUM: /[1-9]/': r"[1-9](?:\+[1-9])*",
}


def constraints() -> list[Constraint]:
    return ([Constraint.json_schema(s) for s in SCHEMAS] + [Constraint("regex", r) for r in REGEXES]
            + [Constraint("choice", choices=c) for c in CHOICES]
            + [Constraint("grammar", g) for g in GRAMMARS])  # fmt: skip


def satisfies(text: str, constraint: Constraint) -> bool:
    """The finished text satisfies its constraint (jsonschema is the judge of JSON)."""
    if constraint.kind == "regex":
        return re.fullmatch(constraint.spec, text) is not None
    if constraint.kind == "choice":
        return text in constraint.choices
    if constraint.kind == "grammar":
        return re.fullmatch(GRAMMARS[constraint.spec], text) is not None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    if constraint.kind == "json_object":
        return isinstance(value, dict)
    jsonschema.validate(value, strict_schema(json.loads(constraint.spec)))  # no extra properties either
    return True
