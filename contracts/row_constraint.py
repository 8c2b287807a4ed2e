"""One row's structured-output Constraint (contracts/constraint.py) from the fields that ask for it.

OpenAI-Batch bodies: `response_format` ({"type": "text" | "json_object" | "json_schema"}, checked as
OpenAI checks it; a /v1/responses body's `text.format`, the same with the json_schema fields flat), vLLM's `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` and its
newer `structured_outputs` {json | regex | choice | grammar | json_object}. Parquet rows: the
`response_format` (the OpenAI JSON, as text or a struct), `json_schema` (JSON text), `regex` and
`choice` (a list of strings, or its JSON text) columns. The job's flags (SamplingSpec.constraint) apply to a
row that gives none; a row's response_format {"type": "text"} (alone) asks for plain text, the job's
flags notwithstanding. A row gives at most one; two are its error naming both. Each problem raises
ValueError naming the field (the row's error); whether a schema, pattern or grammar compiles is the
engine's to find, once per distinct constraint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Literal

from contracts.constraint import Constraint
from contracts.json_text import parse_json_text

TEXT: Literal["text"] = "text"  # a row's explicit plain text (response_format type text): no constraint
RowConstraint = Constraint | Literal["text"] | None  # None: the row asks nothing (the job's applies)

_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for json_schema.name
_RESPONSE_KEYS = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}
_JSON_SCHEMA_KEYS = ("name", "description", "schema", "strict")
_STRUCTURED_KEYS = ("json", "regex", "choice", "grammar", "json_object")


def body_constraint(fields: dict[str, Any]) -> RowConstraint:
    """A JSONL body's constraint from its given fields (name -> value, absent fields left out)."""
    readers: dict[str, Callable[[Any], RowConstraint]] = {
        "response_format": lambda v: response_format(v, "response_format"),
        "guided_json": lambda v: schema_value(v, "guided_json"),
        "guided_regex": lambda v: _text("regex", v, "guided_regex"),
        "guided_choice": lambda v: choice_value(v, "guided_choice", as_text=False),
        "guided_grammar": lambda v: _text("grammar", v, "guided_grammar"),
        "structured_outputs": structured_outputs,
    }
    return one_of({name: read(fields[name]) for name, read in readers.items() if name in fields})


def column_constraint(columns: dict[str, Any]) -> RowConstraint:
    """A Parquet row's constraint from its non-null constraint columns."""
    readers: dict[str, Callable[[Any], RowConstraint]] = {
        "response_format": lambda v: response_format(_column_object(v), "response_format"),
        "json_schema": lambda v: schema_value(v, "json_schema"),
        "regex": lambda v: _text("regex", v, "regex"),
        "choice": lambda v: choice_value(v, "choice", as_text=True),
    }
    return one_of({name: read(columns[name]) for name, read in readers.items() if name in columns})


def one_of(found: dict[str, RowConstraint]) -> RowConstraint:
    """The one constraint the fields ask for; ValueError naming them when two do. A response_format
    of type text (OpenAI's default, which clients send beside vLLM's fields) yields to another field;
    alone it is TEXT."""
    asked = {name: c for name, c in found.items() if isinstance(c, Constraint)}
    if len(asked) > 1:
        names = list(asked)
        raise ValueError(
            f"{', '.join(names[:-1])} and {names[-1]} both constrain the output: a request takes one"
        )
    if asked:
        return next(iter(asked.values()))
    return TEXT if TEXT in found.values() else None


def response_format(value: Any, field: str) -> Constraint | Literal["text"]:
    """OpenAI's response_format: text (no constraint), json_object, or json_schema with its name
    (1-64 letters, digits, _ or -), optional description and strict, and its schema."""
    if not isinstance(value, dict):
        raise ValueError(f'{field}: must be a JSON object, e.g. {{"type": "json_object"}}')
    kind = value.get("type")
    if "type" not in value:
        raise ValueError(f"{field}.type: is required (text, json_object or json_schema)")
    if kind not in _RESPONSE_KEYS:
        shown = f" {kind!r}" if isinstance(kind, str | int | float | bool | None) else ""
        raise ValueError(f"{field}.type{shown}: must be text, json_object or json_schema")
    extra = sorted(set(value) - _RESPONSE_KEYS[kind])
    if extra:
        raise ValueError(f"unknown field '{field}.{extra[0]}': a format of type {kind} takes no such field")
    if kind == "text":
        return TEXT
    if kind == "json_object":
        return Constraint("json_object")
    spec = value.get("json_schema")
    where = f"{field}.json_schema"
    if not isinstance(spec, dict):
        got = "is required" if spec is None else "must be a JSON object"
        raise ValueError(f'{where}: {got} ({{"name": ..., "schema": {{...}}}}) for type json_schema')
    extra = sorted(set(spec) - set(_JSON_SCHEMA_KEYS))
    if extra:
        raise ValueError(f"unknown field '{where}.{extra[0]}': takes {', '.join(_JSON_SCHEMA_KEYS)}")
    return _json_schema(spec, where)


def text_format(value: Any, field: str) -> Constraint | Literal["text"]:
    """The Responses API's `text.format`: text, json_object, or json_schema with its name, schema,
    optional description and strict beside the type (the shape response_format nests under
    "json_schema")."""
    if not isinstance(value, dict):
        raise ValueError(f'{field}: must be a JSON object, e.g. {{"type": "json_object"}}')
    kind = value.get("type")
    if kind != "json_schema":
        return response_format(value, field)
    extra = sorted(set(value) - {"type", *_JSON_SCHEMA_KEYS})
    if extra:
        raise ValueError(f"unknown field '{field}.{extra[0]}': a format of type json_schema takes type, "
                         f"{', '.join(_JSON_SCHEMA_KEYS)}")  # fmt: skip
    return _json_schema({k: v for k, v in value.items() if k != "type"}, field)


def _json_schema(spec: dict[str, Any], where: str) -> Constraint:
    """A json_schema spec's name (1-64 letters, digits, _ or -), description, strict and schema, checked."""
    name = spec.get("name")
    if name is None:
        raise ValueError(f"{where}.name: is required (1-64 letters, digits, _ or -)")
    if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name):
        raise ValueError(f"{where}.name {name!r}: must be 1-64 letters, digits, _ or -")
    if not isinstance(spec.get("description", ""), str):
        raise ValueError(f"{where}.description: must be a string")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise ValueError(f"{where}.strict {spec['strict']!r}: must be true or false")
    if "schema" not in spec:
        raise ValueError(f'{where}.schema: is required (freight constrains the output to it; for any '
                         'JSON object use {"type": "json_object"})')  # fmt: skip
    if not isinstance(spec["schema"], dict):
        raise ValueError(f"{where}.schema: must be a JSON object (a JSON schema)")
    return Constraint.json_schema(spec["schema"])


def schema_value(value: Any, field: str) -> Constraint:
    """A JSON schema given as an object or as its JSON text."""
    if not isinstance(value, dict | str):
        raise ValueError(f"{field}: must be a JSON schema (an object, or its JSON text)")
    try:
        return Constraint.json_schema(value)
    except ValueError as exc:  # "json_schema is not valid JSON: ..." -> the row's field named
        raise ValueError(f"{field}: {str(exc).removeprefix('json_schema ')}") from None


def choice_value(value: Any, field: str, as_text: bool) -> Constraint:
    """A list of non-empty strings (or, `as_text`, its JSON text: a Parquet string column)."""
    if as_text and isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f'{field}: not a JSON list of strings ({exc.msg}), e.g. ["yes", "no"]') from None
    if not isinstance(value, list | tuple) or not all(isinstance(c, str) for c in value):
        raise ValueError(f'{field}: must be a list of strings, e.g. ["yes", "no"]')
    if not value:
        raise ValueError(f"{field}: the list of choices is empty; give at least one string")
    if not all(value):
        raise ValueError(f"{field}[{list(value).index('')}]: a choice must not be empty")
    return Constraint("choice", choices=tuple(value))


def structured_outputs(value: Any) -> Constraint:
    """vLLM's structured_outputs: exactly one of json, regex, choice, grammar, json_object (true)."""
    if not isinstance(value, dict):
        raise ValueError("structured_outputs: must be a JSON object with one of " + ", ".join(_STRUCTURED_KEYS))
    extra = sorted(set(value) - set(_STRUCTURED_KEYS))
    if extra:
        raise ValueError(
            f"unknown field 'structured_outputs.{extra[0]}': freight takes {', '.join(_STRUCTURED_KEYS)}"
        )
    given = {k: v for k, v in value.items() if v is not None and v is not False}
    if len(given) != 1:
        names = " and ".join(f"structured_outputs.{k}" for k in given)
        raise ValueError(
            f"{names} both constrain the output: give one"
            if given
            else "structured_outputs: give one of " + ", ".join(_STRUCTURED_KEYS)
        )
    ((key, v),) = given.items()
    where = f"structured_outputs.{key}"
    if key == "json":
        return schema_value(v, where)
    if key == "choice":
        return choice_value(v, where, as_text=False)
    if key == "json_object":
        if v is not True:
            raise ValueError(f"{where}: must be true")
        return Constraint("json_object")
    return _text(key, v, where)


def _text(kind: str, value: Any, field: str) -> Constraint:
    """A regex or grammar: a non-empty string."""
    if not isinstance(value, str):
        raise ValueError(f"{field}: must be a string ({'a regular expression' if kind == 'regex' else 'a grammar'})")
    if not value:
        raise ValueError(f"{field}: must not be empty")
    return Constraint(kind, value)


def _column_object(value: Any) -> Any:
    """A Parquet response_format cell as the OpenAI JSON: JSON text parsed; a struct's null members
    dropped (a struct has every member on every row) and its schema, if JSON text, parsed."""
    if isinstance(value, str):
        return parse_json_text(value, "response_format", 'e.g. {"type": "json_object"}')
    if not isinstance(value, dict):
        return value
    out = {k: v for k, v in value.items() if v is not None}
    spec = out.get("json_schema")
    if isinstance(spec, dict):
        spec = {k: v for k, v in spec.items() if v is not None}
        if "schema" in spec:
            spec["schema"] = parse_json_text(spec["schema"], "response_format.json_schema.schema")
        out["json_schema"] = spec
    return out
